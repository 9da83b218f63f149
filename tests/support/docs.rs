//! The project's Markdown documents (README.md, docs/, ...) as the tests read
//! them: headings, sections, fenced code and links. The man page is made from
//! their sections, the recipes are run from their code, and the citations in
//! the source must name their headings.

use std::path::{Path, PathBuf};

/// One Markdown document of the repository.
pub struct Doc {
    /// Its path from the repository's root, as a citation names it (`docs/guide.md`).
    path: String,
    text: String,
}

impl Doc {
    /// The document at `path` from the repository's root.
    pub fn load(path: &str) -> Self {
        let full = root().join(path);
        let text = std::fs::read_to_string(&full)
            .unwrap_or_else(|err| panic!("read {}: {err}", full.display()));
        Self {
            path: path.to_owned(),
            text,
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The text under the heading `title` (of any level), up to the next heading
    /// of the same or a higher level: its subsections included.
    pub fn section(&self, title: &str) -> &str {
        self.under(title, |level, next| next <= level)
    }

    /// The text under the heading `title` up to the next heading of any level:
    /// without its subsections.
    pub fn section_without_subsections(&self, title: &str) -> &str {
        self.under(title, |_, _| true)
    }

    /// Everything under the document's own title (its one `#` heading).
    pub fn body(&self) -> &str {
        let title = self
            .titles(1)
            .next()
            .unwrap_or_else(|| panic!("{} has no title", self.path));
        self.section(title)
    }

    /// The text under the heading `title` up to the next heading that `ends` it
    /// (given the two headings' levels).
    fn under(&self, title: &str, ends: impl Fn(usize, usize) -> bool) -> &str {
        let heading = self
            .headings()
            .find(|heading| heading.title == title)
            .unwrap_or_else(|| panic!("{} has no section \"{title}\"", self.path));
        let end = self
            .headings()
            .find(|next| next.starts > heading.starts && ends(heading.level, next.level))
            .map_or(self.text.len(), |next| next.starts);
        &self.text[heading.ends..end]
    }

    /// The titles of the sections at `level` (2 for `##`).
    pub fn titles(&self, level: usize) -> impl Iterator<Item = &str> {
        self.headings()
            .filter(move |heading| heading.level == level)
            .map(|heading| heading.title)
    }

    pub fn has_heading(&self, title: &str) -> bool {
        self.headings().any(|heading| heading.title == title)
    }

    /// The anchors GitHub gives the headings (`#the-commands-environment`).
    pub fn anchors(&self) -> Vec<String> {
        self.headings()
            .map(|heading| {
                heading
                    .title
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect()
    }

    /// The first fenced code block of the section `title` whose fence says
    /// `info` (```` ```sh ````), without its fences.
    pub fn code(&self, title: &str, info: &str) -> String {
        let section = self.section(title);
        let fence = format!("```{info}\n");
        let start = section
            .find(&fence)
            .unwrap_or_else(|| panic!("{} \"{title}\" has no ```{info} block", self.path))
            + fence.len();
        let end = section[start..].find("```").expect("a code block ends");
        section[start..start + end].to_owned()
    }

    /// The targets of the document's links outside code (`[text](target)`).
    pub fn links(&self) -> Vec<&str> {
        let mut in_code = false;
        let mut links = Vec::new();
        for line in self.text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                let Some(end) = after.find(')') else { break };
                links.push(&after[..end]);
                rest = &after[end..];
            }
        }
        links
    }

    /// Every heading outside code blocks.
    fn headings(&self) -> impl Iterator<Item = Heading<'_>> {
        let mut in_code = false;
        let mut starts = 0;
        self.text.split_inclusive('\n').filter_map(move |line| {
            let ends = starts + line.len();
            let line_starts = std::mem::replace(&mut starts, ends);
            if line.starts_with("```") {
                in_code = !in_code;
            }
            let level = line.len() - line.trim_start_matches('#').len();
            let title = line[level..].strip_prefix(' ')?.trim_end();
            (!in_code && level > 0).then_some(Heading {
                level,
                title,
                starts: line_starts,
                ends,
            })
        })
    }
}

struct Heading<'a> {
    level: usize,
    title: &'a str,
    /// Where its line starts and ends in the document.
    starts: usize,
    ends: usize,
}

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown document of the repository: the top-level ones and docs/.
pub fn all() -> Vec<Doc> {
    let mut paths: Vec<String> = Vec::new();
    for dir in ["", "docs", "docs/backends"] {
        let mut here: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|err| panic!("read {dir}/: {err}"))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        here.sort();
        paths.extend(here.iter().map(|path| {
            path.strip_prefix(root())
                .expect("below the root")
                .display()
                .to_string()
        }));
    }
    paths.iter().map(|path| Doc::load(path)).collect()
}
