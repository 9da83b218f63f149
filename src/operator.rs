//! `lockrun status` and `lockrun release` (SPEC §5): what operators use to see
//! who holds a lock and to break a lease known to be dead.

use std::fmt::Write as _;
use std::io::Write;

use serde_json::json;

use crate::backend::{self, Holder, Kind};
use crate::cli::{ReleaseArgs, StatusArgs};
use crate::error::{Error, Result};
use crate::timestamp::rfc3339;

pub fn status(args: &StatusArgs) -> Result<u8> {
    let kind = args.store.backend;
    let mut backend = backend::open(&args.store.location())?;
    let holders = backend.holders(args.name.as_ref())?;
    let text = if args.json {
        json_list(kind, &holders)
    } else {
        table(&holders)
    };
    print(&text)?;
    Ok(0)
}

pub fn release(args: &ReleaseArgs) -> Result<u8> {
    if !args.force {
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

fn table(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return "no lock is held\n".into();
    }
    let mut out = String::from("NAME\tSLOT\tPID\tHOST\tFENCE\tACQUIRED\tEXPIRES\tCOMMAND\n");
    for h in holders {
        let expires = h.expires_at.map_or_else(|| "-".to_owned(), rfc3339);
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            h.name,
            h.slot,
            h.pid,
            h.host,
            h.fence,
            rfc3339(h.acquired_at),
            expires,
            h.command
        );
    }
    out
}
