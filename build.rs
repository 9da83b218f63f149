//! Links GCC's unwinder statically (`libgcc_eh.a`, as `gcc -static-libgcc` does)
//! on dynamically linked GNU/Linux builds, so that lockrun does not load
//! `libgcc_s.so.1` at every start: mapping it and running its constructor, which
//! probes the CPU with a dozen CPUID instructions (each one a trap to the
//! hypervisor in a VM), is about 0.1 ms of a 2 ms `lockrun -- true`
//! (BENCHMARKS.md). With `panic = "abort"` the unwinder only walks stacks for
//! backtraces. Where `libgcc_eh.a` cannot be found (a toolchain without GCC's
//! runtime), nothing changes: the standard library links `libgcc_s` as usual.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
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
