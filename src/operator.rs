//! `lockrun status` and `lockrun release` (SPEC §5): what operators use to see
//! who holds a lock and to break a lease known to be dead.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::backend::{self, Holder, Kind};
use crate::cli::{ReleaseArgs, StatusArgs};
use crate::duration::display;
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::timestamp::{rfc3339, rfc3339_seconds};

pub fn status(args: &StatusArgs) -> Result<u8> {
    let kind = args.store.backend;
    let mut backend = backend::open(&args.store.location())?;
    let holders = backend.holders(args.name.as_ref())?;
    let text = if args.json {
        json_list(kind, &holders)
    } else {
        table(
            &holders,
            args.name.as_ref(),
            epoch_millis(SystemTime::now()),
        )
    };
    print(&text)?;
    Ok(0)
}

pub fn release(args: &ReleaseArgs) -> Result<u8> {
    // A file lock has no lease: the backend refuses with the holder's pid, --force or not.
    if !args.force && args.store.backend.uses_leases() {
        return Err(Error::Usage(format!(
            "release breaks the lease on {} even if its holder is alive; add --force once you know it is dead",
            args.name
        )));
    }
    let mut backend = backend::open(&args.store.location())?;
    let broken = backend.break_leases(&args.name, args.slot)?;
    let text = if broken.is_empty() {
        format!(
            "nothing to release: {} has no holder{}\n",
            args.name,
            args.slot.map_or(String::new(), |s| format!(" in slot {s}"))
        )
    } else {
        broken.iter().fold(String::new(), |mut out, h| {
            let _ = writeln!(
                out,
                "released {} slot {} (pid {} on {}, fence {})",
                h.name, h.slot, h.pid, h.host, h.fence
            );
            out
        })
    };
    print(&text)?;
    Ok(0)
}

fn print(text: &str) -> Result<()> {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|err| Error::internal("writing to stdout", err))
}

/// The `status --json` array, with exactly the keys of SPEC §5.
fn json_list(kind: Kind, holders: &[Holder]) -> String {
    let objects: Vec<_> = holders
        .iter()
        .map(|h| {
            json!({
                "name": h.name,
                "backend": kind.as_str(),
                "slot": h.slot,
                "pid": h.pid,
                "host": h.host,
                "command": h.command,
                "acquired_at": rfc3339(h.acquired_at),
                "expires_at": h.expires_at.map(rfc3339),
                "fence": h.fence,
            })
        })
        .collect();
    format!("{}\n", serde_json::Value::Array(objects))
}

/// An aligned table for people; times in UTC with how long ago / how soon.
fn table(holders: &[Holder], name: Option<&Name>, now_millis: u64) -> String {
    if holders.is_empty() {
        return match name {
            Some(name) => format!("{name} is not held\n"),
            None => "no lock is held\n".into(),
        };
    }
    let header = [
        "NAME", "SLOT", "PID", "HOST", "ACQUIRED", "HELD", "EXPIRES", "FENCE", "COMMAND",
    ];
    let rows: Vec<[String; 9]> = holders
        .iter()
        .map(|h| {
            let since = |millis: u64| Duration::from_millis(now_millis.saturating_sub(millis));
            let expires = h.expires_at.map_or_else(
                || "-".to_owned(),
                |at| match at.checked_sub(now_millis) {
                    Some(left) => format!("in {}", display(Duration::from_millis(left))),
                    None => format!("{} ago", display(since(at))),
                },
            );
            [
                h.name.clone(),
                h.slot.to_string(),
                h.pid.to_string(),
                h.host.clone(),
                rfc3339_seconds(h.acquired_at),
                display(since(h.acquired_at)),
                expires,
                h.fence.to_string(),
                h.command.escape_debug().to_string(),
            ]
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
