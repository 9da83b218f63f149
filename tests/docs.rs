//! The docs and the code that cites them stay in step (CONTRIBUTING.md:
//! "Tests"): every citation of a section of the README or of docs/ in the
//! source (the document, a colon, the section's title in quotes) names a
//! heading that exists, and every link between the docs leads to a file and
//! heading that exist.

use std::fs;
use std::path::{Path, PathBuf};

use crate::support::docs::{self, Doc};

/// The files that may cite the docs: the source, the tests, the benchmarks,
/// the build and the scripts.
fn citing_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else {
                files.push(path);
            }
        }
    }
    let root = docs::root();
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "scripts", ".cargo"] {
        walk(&root.join(dir), &mut files);
    }
    files.extend(["build.rs", "Cargo.toml", ".ci/run"].map(|file| root.join(file)));
    files
}

/// `text` with its comment markers gone and its lines joined, so that a
/// citation broken over two comment lines reads as one.
fn as_prose(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            ["//!", "///", "//", "--", "#"]
                .iter()
                .find_map(|marker| line.strip_prefix(marker))
                .unwrap_or(line)
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every citation in `prose`: the document (`README.md`, `docs/guide.md`) and
/// the titles it names, in quotes after a colon, separated by commas.
fn citations(prose: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find(": \"") {
        let before = &rest[..at];
        let word_starts = before
            .rfind(|c: char| !(c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')))
            .map_or(0, |i| i + 1);
        let word = &before[word_starts..];
        let doc = match word {
            "README" => Some("README.md".to_owned()),
            "README.md" | "ARCHITECTURE.md" | "CONTRIBUTING.md" | "CHANGELOG.md" => {
                Some(word.to_owned())
            }
            _ if word.starts_with("docs/") => Some(word.to_owned()),
            _ => None,
        };
        let mut after = &rest[at + 2..];
        let mut titles = Vec::new();
        while let Some(quoted) = after.strip_prefix('"') {
            let Some(end) = quoted.find('"') else { break };
            titles.push(quoted[..end].to_owned());
            after = &quoted[end + 1..];
            match after.strip_prefix(", ") {
                Some(more) if more.starts_with('"') => after = more,
                _ => break,
            }
        }
        if let Some(doc) = doc {
            found.push((doc, titles));
        }
        rest = after;
    }
    found
}

#[test]
fn citations_parse_as_written() {
    let prose = as_prose(
        "//! Shared locks (README: \"Shared locks\", \"Several names\"), and\n\
         //! (docs/guide.md:\n//! \"The waiting line\"); \"Other\": not one.",
    );
    assert_eq!(
        citations(&prose),
        [
            (
                "README.md".into(),
                vec!["Shared locks".into(), "Several names".into()]
            ),
            ("docs/guide.md".into(), vec!["The waiting line".into()]),
        ]
    );
}

#[test]
fn every_citation_in_the_source_names_a_heading() {
    let mut loaded: Vec<Doc> = Vec::new();
    let mut broken = Vec::new();
    let mut count = 0;
    for file in citing_files() {
        let Ok(text) = fs::read_to_string(&file) else {
            continue; // not text
        };
        for (doc, titles) in citations(&as_prose(&text)) {
            if !loaded.iter().any(|known| known.path() == doc) {
                if !docs::root().join(&doc).is_file() {
                    broken.push(format!("{}: no {doc}", file.display()));
                    continue;
                }
                loaded.push(Doc::load(&doc));
            }
            let cited = loaded
                .iter()
                .find(|known| known.path() == doc)
                .expect("loaded above");
            for title in titles {
                count += 1;
                if !cited.has_heading(&title) {
                    broken.push(format!("{}: {doc} has no \"{title}\"", file.display()));
                }
            }
        }
    }
    assert!(
        count > 50,
        "only {count} citations found: is the parser right?"
    );
    assert!(
        broken.is_empty(),
        "citations of missing sections:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_link_between_the_docs_leads_somewhere() {
    let all = docs::all();
    let mut broken = Vec::new();
    for doc in &all {
        let here = Path::new(doc.path()).parent().expect("in a directory");
        for link in doc.links() {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                PathBuf::from(doc.path())
            } else {
                normalize(&here.join(file))
            };
            if !docs::root().join(&target).exists() {
                broken.push(format!("{}: {link}: no such file", doc.path()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let target = target.display().to_string();
            let anchors = all
                .iter()
                .find(|known| known.path() == target)
                .map_or_else(|| Doc::load(&target).anchors(), Doc::anchors);
            if !anchors.iter().any(|known| known == anchor) {
                broken.push(format!("{}: {link}: no such heading", doc.path()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `path` without `.` and `..`, from the repository's root.
fn normalize(path: &Path) -> PathBuf {
    let mut parts = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other),
        }
    }
    parts.iter().collect()
}
