//! The docs' sections as roff. The man page takes all it says beyond the
//! options from README.md and docs/, so they cannot disagree; the drift check
//! then fails when either changes without the other being regenerated.
//!
//! Only the Markdown the docs use is understood: paragraphs, `-` lists,
//! tables, fenced code, headings, and `code`, **bold**, *italic* and
//! [links](#anchor) inline. Anything else fails loudly rather than render badly.

use clap_mangen::roff::{Inline, Roff, bold, italic, roman};

/// `markdown` as roff: paragraphs, lists, tables and code blocks; its headings become `.SS`.
pub fn to_roff(markdown: &str) -> Roff {
    let mut roff = Roff::new();
    let mut lines = markdown.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with("```") {
            let code: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            roff.control("PP", [])
                .control("RS", ["4"])
                .control("nf", []);
            roff.text([roman(code.join("\n"))]);
            roff.control("fi", []).control("RE", []);
        } else if line.starts_with('#') {
            roff.control("SS", [line.trim_start_matches('#').trim()]);
        } else if line.starts_with('|') {
            let mut rows = vec![cells(line)];
            while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
                rows.push(cells(row));
            }
            table(&mut roff, &rows);
        } else if let Some(first) = line.strip_prefix("- ") {
            let mut item = first.to_owned();
            while let Some(more) = lines.next_if(|l| l.starts_with("  ")) {
                let more_trimmed = more.trim_start();
                assert!(
                    !["```", "|", "- "]
                        .iter()
                        .any(|block| more_trimmed.starts_with(block)),
                    "a table, list or code inside a list item: {more}"
                );
                item.push(' ');
                item.push_str(more.trim());
            }
            roff.control("IP", ["\\(bu", "2"]);
            roff.text(inline(&item));
        } else {
            let mut paragraph = line.trim().to_owned();
            while let Some(more) = lines.next_if(|l| !l.trim().is_empty() && !starts_block(l)) {
                paragraph.push(' ');
                paragraph.push_str(more.trim());
            }
            roff.control("PP", []);
            roff.text(inline(&paragraph));
        }
    }
    roff
}

fn starts_block(line: &str) -> bool {
    line.starts_with("```")
        || line.starts_with('#')
        || line.starts_with('|')
        || line.starts_with("- ")
}

/// A table row's cells; `\|` is a `|` inside a cell.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().expect("one").push('|');
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().expect("one").push(c),
        }
    }
    cells.iter().map(|cell| cell.trim().to_owned()).collect()
}

/// A table as a list tagged by its first column; more columns are named by their headers.
fn table(roff: &mut Roff, rows: &[Vec<String>]) {
    let (header, body) = rows.split_first().expect("a header row");
    let body = body.iter().filter(|row| {
        !row.iter()
            .all(|cell| cell.chars().all(|c| c == '-' || c == ':'))
    });
    for row in body {
        roff.control("TP", []);
        roff.text(inline(&row[0]));
        let described: Vec<String> = if row.len() == 2 {
            vec![row[1].clone()]
        } else {
            (1..row.len())
                .filter(|&i| !row[i].is_empty())
                .map(|i| format!("{}: {}", header[i], row[i]))
                .collect()
        };
        roff.text(inline(&described.join("; ")));
    }
}

/// One line of Markdown as roff inlines: `code` and **bold** in bold, *italic*
/// in italic, a link as its text.
pub fn inline(text: &str) -> Vec<Inline> {
    let mut parts = Vec::new();
    let mut plain = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let styled = match c {
            '`' => span(rest, "`").map(|(inner, after)| (bold(inner), after)),
            '*' if rest.starts_with("**") => {
                span(rest, "**").map(|(inner, after)| (bold(inner.replace('`', "")), after))
            }
            '*' => span(rest, "*")
                .filter(|(inner, _)| !inner.starts_with(' '))
                .map(|(inner, after)| (italic(inner), after)),
            '[' => link(rest).map(|(inner, after)| (roman(inner.replace('`', "")), after)),
            _ => None,
        };
        if let Some((part, after)) = styled {
            parts.push(roman(std::mem::take(&mut plain)));
            parts.push(part);
            rest = after;
        } else {
            // `\|`, `\*`: the character itself.
            let literal = rest
                .strip_prefix('\\')
                .filter(|after| after.starts_with(|next: char| next.is_ascii_punctuation()))
                .unwrap_or(rest);
            let c = literal.chars().next().expect("a character");
            plain.push(c);
            rest = &literal[c.len_utf8()..];
        }
    }
    parts.push(roman(plain));
    parts.retain(|part| !matches!(part, Inline::Roman(text) if text.is_empty()));
    parts
}

/// `text` that starts with `mark`: what lies up to the next `mark`, and what follows it.
fn span<'a>(text: &'a str, mark: &str) -> Option<(&'a str, &'a str)> {
    let inner = &text[mark.len()..];
    let end = inner.find(mark)?;
    Some((&inner[..end], &inner[end + mark.len()..]))
}

/// `[text](target)` at the start of `text`: the link's text and what follows the link.
fn link(text: &str) -> Option<(&str, &str)> {
    let (inner, after) = text[1..].split_once("](")?;
    let (_, after) = after.split_once(')')?;
    (!inner.contains(']')).then_some((inner, after))
}
