//! What the compiler cannot check about the sources and the build (README: "Design").

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

/// Every section a comment cites, `README: "Section"` or `docs/FILE.md:
/// "Section"`, is a heading of that file: a renamed or moved section leaves
/// no citation pointing nowhere.
#[test]
fn every_cited_section_is_a_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut cited = 0;
    for dir in ["src", "tests", "benches"] {
        for file in rust_files(&root.join(dir)) {
            let comments = comments_joined(&fs::read_to_string(&file).unwrap());
            for (document, section) in citations(&comments) {
                cited += 1;
                let path = if document == "README" {
                    root.join("README.md")
                } else {
                    root.join(document)
                };
                let found = fs::read_to_string(&path)
                    .is_ok_and(|text| headings(&text).any(|heading| heading == section));
                if !found {
                    let file = file.strip_prefix(root).unwrap_or(&file).display();
                    missing.push(format!("{file}: {document}: \"{section}\""));
                }
            }
        }
    }
    assert!(cited > 50, "citations are found ({cited})");
    assert!(
        missing.is_empty(),
        "cited sections that are no heading:\n{}",
        missing.join("\n")
    );
}

/// The text of the comments, each run of comment lines joined into one line,
/// so that a citation broken across lines reads whole.
fn comments_joined(source: &str) -> String {
    let mut joined = String::new();
    for line in source.lines() {
        match line.trim_start().strip_prefix("//") {
            Some(comment) => {
                joined.push(' ');
                joined.push_str(comment.trim_start_matches(['/', '!']).trim());
            }
            None => joined.push('\n'),
        }
    }
    joined
}

/// `(document, section)` for each `DOCUMENT: "Section"` in `text`, where
/// the document is `README` or a file under docs/.
fn citations(text: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(": \"") {
        let document = text[..at]
            .rsplit(|c: char| c.is_whitespace() || c == '(')
            .next()
            .unwrap_or_default();
        let cites = document == "README"
            || (document.starts_with("docs/")
                && Path::new(document)
                    .extension()
                    .is_some_and(|ext| ext == "md"));
        let rest = &text[at + 3..];
        if let (true, Some(end)) = (cites, rest.find('"')) {
            found.push((document, &rest[..end]));
        }
    }
    found
}

/// The headings of a Markdown text, without their `#`s.
fn headings(markdown: &str) -> impl Iterator<Item = &str> {
    markdown
        .lines()
        .filter(|line| line.starts_with('#'))
        .map(|line| line.trim_start_matches('#').trim())
}
