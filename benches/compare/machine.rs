//! What the numbers were measured on: CPU, memory, OS, load, and the versions and linking of
//! every program measured.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::builds::Build;

/// What the numbers were measured on.
pub(crate) fn machine(default: &Build, statically: Option<&Build>) -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let memory = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or_else(
            || "?".into(),
            |kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0),
        );
    let os = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
        })
        .unwrap_or_else(|| "unknown OS".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let mut text = String::new();
    let _ = writeln!(text, "- Date: {}", lockrun::timestamp::now_rfc3339());
    let _ = writeln!(text, "- CPU: {cpu}, {cores} logical cores; memory {memory}");
    let _ = writeln!(text, "- OS: {os}, Linux {}", kernel.trim());
    let _ = writeln!(text, "- Load average at start: {}", load.join(" "));
    let _ = writeln!(
        text,
        "- lockrun: {} ({})",
        first_line(&default.path, &["--version"]),
        first_line("git", &["describe", "--always", "--dirty"]),
    );
    for build in std::iter::once(default).chain(statically) {
        let _ = writeln!(
            text,
            "  - {}: `{}`, {}",
            build.label,
            build.path.display(),
            linking(&build.path)
        );
    }
    let _ = writeln!(text, "- flock(1): {}", first_line("flock", &["--version"]));
    let _ = writeln!(
        text,
        "- redis-server: {}",
        first_line("redis-server", &["--version"])
    );
    let _ = writeln!(text, "- etcd: {}", first_line("etcd", &["--version"]));
    let _ = write!(text, "- rustc: {}", first_line("rustc", &["--version"]));
    text
}

/// How a binary is linked, and the shared libraries it loads.
fn linking(binary: &Path) -> String {
    let kind = first_line("file", &["-b".as_ref(), binary.as_os_str()]);
    let kind = kind
        .split(", ")
        .filter(|part| part.contains("link"))
        .collect::<Vec<_>>()
        .join(", ");
    let libraries: Vec<String> = Command::new("ldd")
        .arg(binary)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|line| line.split_whitespace().next())
                .filter(|library| !library.starts_with("linux-vdso"))
                .map(|library| library.rsplit('/').next().unwrap_or(library).to_owned())
                .collect()
        })
        .unwrap_or_default();
    if libraries.is_empty() {
        kind
    } else {
        format!("{kind} ({})", libraries.join(", "))
    }
}

pub(crate) fn first_line<P: AsRef<std::ffi::OsStr>, A: AsRef<std::ffi::OsStr>>(
    program: P,
    args: &[A],
) -> String {
    Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "not available".into())
}
