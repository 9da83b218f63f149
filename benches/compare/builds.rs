//! The two builds of lockrun measured: the default one and the static opt-in build of the README.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::machine::first_line;

/// A lockrun binary under test.
#[derive(Clone, Debug)]
pub(crate) struct Build {
    /// "default build" or "static opt-in build".
    pub(crate) label: &'static str,
    pub(crate) path: PathBuf,
}

/// The default build: this build's binary, or `LOCKRUN_BENCH_BIN` (another build of it).
pub(crate) fn default_build() -> Build {
    Build {
        label: "default build",
        path: std::env::var_os("LOCKRUN_BENCH_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_lockrun")),
            PathBuf::from,
        ),
    }
}

/// Another build measured beside the default one in (b)'s rounds, to compare a change with
/// what it changes (`LOCKRUN_BENCH_BASELINE_BIN`), if given.
pub(crate) fn baseline_build() -> Option<Build> {
    std::env::var_os("LOCKRUN_BENCH_BASELINE_BIN").map(|path| Build {
        label: "baseline build",
        path: PathBuf::from(path),
    })
}

/// The static opt-in build: `LOCKRUN_BENCH_STATIC_BIN`, else built from this
/// source with the README's command, next to this build's own binaries.
pub(crate) fn static_build() -> Result<Build, String> {
    let path = match std::env::var_os("LOCKRUN_BENCH_STATIC_BIN") {
        Some(path) => PathBuf::from(path),
        None => build_static()?,
    };
    Ok(Build {
        label: "static opt-in build",
        path,
    })
}

fn build_static() -> Result<PathBuf, String> {
    let host = first_line("rustc", &["-vV"]);
    let host = Command::new("rustc")
        .arg("-vV")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .ok_or_else(|| format!("no host triple from rustc -vV ({host})"))?;
    // target/release/lockrun → target
    let own = PathBuf::from(env!("CARGO_BIN_EXE_lockrun"));
    let target_dir = own
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!(
        "building the static opt-in build: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target {host}"
    );
    let started = Instant::now();
    let output = Command::new(cargo)
        .args(["build", "--release", "--bin", "lockrun", "--target", &host])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run cargo: {err}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "the static build failed: {}",
            last.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    println!("built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(target_dir.join(host).join("release").join("lockrun"))
}
