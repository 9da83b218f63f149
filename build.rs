//! Links GCC's unwinder statically (`libgcc_eh.a`, as `gcc -static-libgcc` does)
//! on dynamically linked GNU/Linux builds, so that lockrun does not load
//! `libgcc_s.so.1` at every start: mapping it and running its constructor, which
//! probes the CPU with a dozen CPUID instructions (each one a trap to the
//! hypervisor in a VM), is about 0.1 ms of a 2 ms `lockrun -- true`
//! (BENCHMARKS.md). With `panic = "abort"` the unwinder only walks stacks for
//! backtraces. Where `libgcc_eh.a` cannot be found (a toolchain without GCC's
//! runtime), nothing changes: the standard library links `libgcc_s` as usual.
//!
//! It also gives the build the commit it is made from, for `lockrun --version`:
//! `git rev-parse --short HEAD`, or "unknown" outside a git checkout.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    commit();
    let cfg = |key: &str| env::var(format!("CARGO_CFG_TARGET_{key}")).unwrap_or_default();
    let static_crt = cfg("FEATURE")
        .split(',')
        .any(|feature| feature == "crt-static");
    // A static build (`crt-static`) links the unwinder statically by itself.
    if cfg("OS") != "linux" || cfg("ENV") != "gnu" || static_crt {
        return;
    }
    if unwinder_archive_found() {
        // Before the standard library's `-lgcc_s` on the link line, so the
        // unwinder comes from here and `--as-needed` drops the shared library.
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}

/// Whether the C compiler that links lockrun knows a `libgcc_eh.a` (rustc's
/// default linker is `cc`; cargo names another one in `RUSTC_LINKER`).
fn unwinder_archive_found() -> bool {
    let linker = env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".into());
    Command::new(linker)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .is_some_and(|path| {
            let path = Path::new(path.trim());
            path.is_absolute() && path.is_file()
        })
}

/// `LOCKRUN_COMMIT`: the short hash of the commit checked out, rebuilt when
/// HEAD moves (a new commit, another branch).
fn commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    if commit.is_some() {
        // HEAD names the branch; the branch's ref (loose or packed) the commit.
        let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
        watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
        for file in watched {
            // A file that does not exist would make cargo run this script at every build.
            if let Some(path) = git(&["rev-parse", "--git-path", &file])
                .filter(|path| std::path::Path::new(path).exists())
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!(
        "cargo:rustc-env=LOCKRUN_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
