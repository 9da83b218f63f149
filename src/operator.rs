//! `lockrun status` and `lockrun release` (docs/operating.md: "Operating lockrun"): what
//! operators use to see who holds and who waits for a lock, and to break a
//! lease known to be dead.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::backend::Entry;
use crate::cli::{CheckArgs, ReleaseArgs, StatusArgs};
use crate::duration::display;
use crate::error::{Error, Result};
use crate::escape::escape_controls;
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::timestamp::{rfc3339, rfc3339_seconds};
use crate::width::display_width;

pub fn status(args: &StatusArgs) -> Result<u8> {
    let (entries, place) = match args.store.open(false) {
        Ok(mut store) => (
            store.list(args.name.as_ref())?,
            format!(" in {}", store.location()),
        ),
        // A store nobody made yet (a fresh account, a new database) holds nothing;
        // asking makes none.
        Err(Error::Missing(why)) => (Vec::new(), format!(": {why}")),
        Err(err) => return Err(err),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // Written entry by entry: thousands of names need no copy of the whole listing as text.
    let written = if args.json {
        json_list(&mut out, &args.store.backend, &entries)
    } else {
        let now = epoch_millis(SystemTime::now());
        table(&mut out, &entries, args.name.as_ref(), &place, now)
    };
    finish(written.and_then(|()| out.flush()))?;
    Ok(0)
}

/// `lockrun check`: what a probe of the store found, one line each on stdout.
pub fn check(args: &CheckArgs) -> Result<u8> {
    let found = match args.store.open(false) {
        Ok(mut store) => store.check()?,
        // Nothing made yet: the first run makes it.
        Err(Error::Missing(why)) => vec![format!("no lockrun store yet: {why}")],
        Err(err) => return Err(err),
    };
    let mut out = std::io::stdout().lock();
    finish(
        found
            .iter()
            .try_for_each(|line| writeln!(out, "{line}"))
            .and_then(|()| out.flush()),
    )?;
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
    finish(
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush()),
    )
}

/// What writing to stdout came to.
fn finish(written: std::io::Result<()>) -> Result<()> {
    match written {
        // The reader stopped reading (`| head`): it has all it wanted, nothing went wrong.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.map_err(|err| Error::output("stdout", &err)),
    }
}

/// The `status --json` array (docs/operating.md: "Who holds a lock"), one object at a time.
fn json_list(out: &mut impl Write, backend: &str, entries: &[Entry]) -> std::io::Result<()> {
    out.write_all(b"[")?;
    for (at, entry) in entries.iter().enumerate() {
        if at > 0 {
            out.write_all(b",")?;
        }
        let mut object = json!({
            "name": entry.name,
            "backend": backend,
            "state": if entry.is_holder() { "holding" } else { "waiting" },
            "slot": entry.slot,
            "position": entry.position,
            "mode": entry.mode.as_str(),
            "pid": entry.pid,
            "host": entry.host,
            "command": entry.command,
            "expires_at": entry.expires_at.map(rfc3339),
            "fence": entry.fence,
            "user": entry.user,
            "note": entry.note,
        });
        let since = if entry.is_holder() {
            "acquired_at"
        } else {
            "waiting_since"
        };
        object[since] = json!(entry.since.map(rfc3339));
        serde_json::to_writer(&mut *out, &object)?;
    }
    out.write_all(b"]\n")
}

/// An aligned table for people, after a line that says where the locks are
/// (`place`); times in UTC with how long ago / how soon. The columns' widths
/// come from a first pass over the rows, which are then made again one at a
/// time as they are written.
fn table(
    out: &mut impl Write,
    entries: &[Entry],
    name: Option<&Name>,
    place: &str,
    now_millis: u64,
) -> std::io::Result<()> {
    let place = escape_controls(place);
    if entries.is_empty() {
        return match name {
            Some(name) => writeln!(out, "{name} is not held{place}"),
            None => writeln!(out, "no lock is held{place}"),
        };
    }
    writeln!(out, "locks{place}")?;
    let header = [
        "NAME", "STATE", "MODE", "SLOT", "LINE", "PID", "HOST", "USER", "SINCE", "FOR", "EXPIRES",
        "FENCE", "COMMAND", "NOTE",
    ]
    .map(str::to_owned);
    let mut widths = header.each_ref().map(|cell| display_width(cell));
    for entry in entries {
        for (width, cell) in widths.iter_mut().zip(row(entry, now_millis)) {
            *width = (*width).max(display_width(&cell));
        }
    }
    let mut write_row = |cells: &[String; 14]| {
        let mut line = String::new();
        for (column, cell) in cells.iter().enumerate() {
            if column + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let pad = widths[column] - display_width(cell);
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            }
        }
        writeln!(out, "{}", line.trim_end())
    };
    write_row(&header)?;
    for entry in entries {
        write_row(&row(entry, now_millis))?;
    }
    Ok(())
}

/// One entry's cells, escaped for a terminal.
fn row(entry: &Entry, now_millis: u64) -> [String; 14] {
    let unknown = || "-".to_owned();
    let ago = |millis: u64| Duration::from_millis(now_millis.saturating_sub(millis));
    let expires = entry
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
        entry.mode.as_str().to_owned(),
        entry.slot.map_or_else(unknown, |slot| slot.to_string()),
        if entry.is_holder() {
            unknown()
        } else {
            entry.position.to_string()
        },
        entry.pid.to_string(),
        entry.host.clone(),
        if entry.user.is_empty() {
            unknown()
        } else {
            entry.user.clone()
        },
        entry.since.map_or_else(unknown, rfc3339_seconds),
        entry
            .since
            .map_or_else(unknown, |since| display(ago(since))),
        expires,
        entry.fence.map_or_else(unknown, |fence| fence.to_string()),
        entry.command.clone(),
        entry.note.clone().unwrap_or_default(),
    ]
    .map(|cell| escape_controls(&cell))
}
