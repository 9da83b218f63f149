//! `lockrun status` and `lockrun release` (README: "Operating lockrun"): what
//! operators use to see who holds and who waits for a lock, and to break a
//! lease known to be dead.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::backend::Entry;
use crate::cli::{ReleaseArgs, StatusArgs};
use crate::duration::display;
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::report::escape_controls;
use crate::timestamp::{rfc3339, rfc3339_seconds};

pub fn status(args: &StatusArgs) -> Result<u8> {
    let mut store = args.store.open(false)?;
    let entries = store.list(args.name.as_ref())?;
    let text = if args.json {
        json_list(&args.store.backend, &entries)
    } else {
        table(
            &entries,
            args.name.as_ref(),
            epoch_millis(SystemTime::now()),
        )
    };
    print(&text)?;
    Ok(0)
}

pub fn release(args: &ReleaseArgs) -> Result<u8> {
    let mut store = args.store.open(false)?;
    if !store.abilities().breakable {
        return Err(unbreakable(&args.name, &store.list(Some(&args.name))?));
    }
    if !args.force {
        return Err(Error::Usage(format!(
            "release breaks the lease on {} even if its holder is alive; add --force once you know it is dead",
            args.name
        )));
    }
    let broken = store.break_slots(&args.name, args.slot)?;
    let text = if broken.is_empty() {
        format!(
            "nothing to release: {} has no holder{}\n",
            args.name,
            args.slot.map_or(String::new(), |s| format!(" in slot {s}"))
        )
    } else {
        broken.iter().fold(String::new(), |mut out, entry| {
            let _ = writeln!(
                out,
                "released {} slot {} (pid {} on {}, fence {})",
                escape_controls(&entry.name),
                entry.slot.unwrap_or_default(),
                entry.pid,
                escape_controls(&entry.host),
                entry
                    .fence
                    .map_or("unknown".into(), |fence| fence.to_string())
            );
            out
        })
    };
    print(&text)?;
    Ok(0)
}

/// The refusal for a lock that only its holder's exit frees, naming the holders to end instead.
fn unbreakable(name: &Name, entries: &[Entry]) -> Error {
    let holders: Vec<String> = entries
        .iter()
        .filter(|entry| entry.is_holder())
        .map(|entry| {
            let host = if entry.host.is_empty() {
                String::new()
            } else {
                format!(" on {}", escape_controls(&entry.host))
            };
            format!(
                "pid {}{host} (slot {})",
                entry.pid,
                entry.slot.unwrap_or_default()
            )
        })
        .collect();
    let held_by = if holders.is_empty() {
        "nobody holds it now".to_owned()
    } else {
        format!(
            "held by {}; end that process to free it",
            holders.join(", ")
        )
    };
    Error::Usage(format!(
        "cannot release {name}: this lock has no lease to break, it is freed when its holder exits; {held_by}"
    ))
}

fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // The reader stopped reading (`| head`): it has all it wanted, nothing went wrong.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.map_err(|err| Error::output("stdout", &err)),
    }
}

/// The `status --json` array (README: "Who holds a lock").
fn json_list(backend: &str, entries: &[Entry]) -> String {
    let objects: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let mut object = json!({
                "name": entry.name,
                "backend": backend,
                "state": if entry.is_holder() { "holding" } else { "waiting" },
                "slot": entry.slot,
                "position": entry.position,
                "pid": entry.pid,
                "host": entry.host,
                "command": entry.command,
                "expires_at": entry.expires_at.map(rfc3339),
                "fence": entry.fence,
            });
            let since = if entry.is_holder() {
                "acquired_at"
            } else {
                "waiting_since"
            };
            object[since] = json!(entry.since.map(rfc3339));
            object
        })
        .collect();
    format!("{}\n", Value::Array(objects))
}

/// An aligned table for people; times in UTC with how long ago / how soon.
fn table(entries: &[Entry], name: Option<&Name>, now_millis: u64) -> String {
    if entries.is_empty() {
        return match name {
            Some(name) => format!("{name} is not held\n"),
            None => "no lock is held\n".into(),
        };
    }
    let header = [
        "NAME", "STATE", "SLOT", "LINE", "PID", "HOST", "SINCE", "FOR", "EXPIRES", "FENCE",
        "COMMAND",
    ];
    let unknown = || "-".to_owned();
    let rows: Vec<[String; 11]> = entries
        .iter()
        .map(|entry| {
            let ago = |millis: u64| Duration::from_millis(now_millis.saturating_sub(millis));
            let expires =
                entry
                    .expires_at
                    .map_or_else(unknown, |at| match at.checked_sub(now_millis) {
                        Some(left) => format!("in {}", display(Duration::from_millis(left))),
                        None => format!("{} ago", display(ago(at))),
                    });
            [
                entry.name.clone(),
                if entry.is_holder() {
                    "holding"
                } else {
                    "waiting"
                }
                .to_owned(),
                entry.slot.map_or_else(unknown, |slot| slot.to_string()),
                if entry.is_holder() {
                    unknown()
                } else {
                    entry.position.to_string()
                },
                entry.pid.to_string(),
                entry.host.clone(),
                entry.since.map_or_else(unknown, rfc3339_seconds),
                entry
                    .since
                    .map_or_else(unknown, |since| display(ago(since))),
                expires,
                entry.fence.map_or_else(unknown, |fence| fence.to_string()),
                entry.command.clone(),
            ]
            .map(|cell| escape_controls(&cell))
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .chain([header[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut push_row = |cells: &[&str]| {
        let mut line = String::new();
        for (column, cell) in cells.iter().enumerate() {
            if column + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let pad = widths[column] - cell.chars().count();
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    push_row(&header);
    for row in &rows {
        push_row(&row.each_ref().map(String::as_str));
    }
    out
}
