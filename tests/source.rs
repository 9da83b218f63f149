//! What the compiler cannot check about the sources and the build (ARCHITECTURE.md: "Design").

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// `unsafe` lives only in src/platform/: the crate denies it, and only the
/// platform files that have unsafe code allow it, each for itself (src/main.rs
/// too denies it: its entry point is a macro of the platform's).
#[test]
fn unsafe_code_is_confined_to_the_platform_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        lib.contains("#![deny(unsafe_code)]"),
        "src/lib.rs denies unsafe code"
    );
    let platform = root.join("src/platform");
    for file in rust_files(&root.join("src")) {
        let text = fs::read_to_string(&file).unwrap();
        let allows = text.contains("allow(unsafe_code)");
        if file.starts_with(&platform) {
            let has_unsafe = ["unsafe {", "unsafe fn", "unsafe impl"]
                .iter()
                .any(|form| text.contains(form));
            assert_eq!(
                allows,
                has_unsafe,
                "{}: a platform file allows unsafe code exactly when it has some",
                file.display()
            );
        } else if file == root.join("src/main.rs") {
            // Its entry point is `entry_point!`, written in src/platform/startup.rs.
            assert!(
                text.contains("#![deny(unsafe_code)]")
                    && !allows
                    && !text.contains("unsafe {")
                    && !text.contains("unsafe("),
                "src/main.rs denies unsafe code and has none"
            );
        } else {
            assert!(!allows, "{} allows unsafe code", file.display());
        }
    }
}

/// The build loads glibc's libc alone (README: "Install and try it"): every
/// other shared library costs each run its loading (libm, pulled in by the
/// bundled SQLite's full-text search, cost 0.09 ms, BENCHMARKS.md "Start-up").
#[test]
fn the_binary_loads_no_library_but_libc() {
    let output = std::process::Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_lockrun"))
        .output()
        .expect("run ldd");
    let libraries = String::from_utf8_lossy(&output.stdout);
    // A statically linked build (the opt-in) loads no library at all.
    let said = format!("{libraries}{}", String::from_utf8_lossy(&output.stderr));
    if said.contains("statically linked") || said.contains("not a dynamic executable") {
        return;
    }
    assert!(
        output.status.success() && libraries.contains("libc.so"),
        "ldd listed no libc: {output:?}"
    );
    for line in libraries.lines() {
        let library = line.split_whitespace().next().unwrap_or_default();
        assert!(
            library.starts_with("linux-vdso")
                || library.starts_with("libc.so")
                || library.contains("/ld-linux")
                || library.starts_with("ld-linux")
                // Where GCC's static unwinder is missing, build.rs leaves it to libgcc_s.
                || library.starts_with("libgcc_s"),
            "lockrun loads {library}:\n{libraries}"
        );
    }
}
