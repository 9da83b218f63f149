//! Whether a run's `-p` lets it into a name's slots or line: a name's slot
//! count is part of the lock (docs/guide.md: "Slots"). Asked under the name's fence
//! counter's lock, which every holder and waiter took to get in, so the ones
//! let in agree with each other; every one of them is read, so that a record
//! left by a holder that crashed can only refuse a run, never let one in.

use std::fs::{self, File};
use std::path::Path;

use super::dir::{LockDir, open_existing};
use super::line::{is_live, waiter_path, waiter_tickets};
use super::slot::{SlotFile, first_json_value, read_record};
use crate::backend::record::WaiterRecord;
use crate::backend::refuses;
use crate::error::{Error, Result};

/// Another `-p` than `ours` that a holder of a slot of `stem` (`own` left
/// out) has, or with `waiters` a waiter in its line.
pub fn other_parallelism(
    dir: &LockDir,
    stem: &str,
    own: Option<SlotFile>,
    ours: u32,
    waiters: bool,
) -> Result<Option<u32>> {
    // Slot files are made in order from slot 0, so the first missing one at
    // or past ours ends them: every holder's slot is below its own -p.
    if let Some(theirs) = refusing_holder(dir, stem, SlotFile::Lock, own, ours, ours)? {
        return Ok(Some(theirs));
    }
    // Sharers hold with -p 1: their share files refuse only another -p.
    // They are made in order from 0: the first missing one ends them.
    if ours != 1
        && let Some(theirs) = refusing_holder(dir, stem, SlotFile::Share, own, ours, 0)?
    {
        return Ok(Some(theirs));
    }
    if !waiters {
        return Ok(None);
    }
    for ticket in waiter_tickets(dir.path(), stem)? {
        let path = waiter_path(dir.path(), stem, &ticket);
        let Some(file) = open_existing(&path)? else {
            continue;
        };
        if !is_live(&file, &path)? {
            continue;
        }
        let theirs = first_json_value::<WaiterRecord>(&file).and_then(|r| r.owner.parallelism);
        if refuses(theirs, ours) {
            return Ok(theirs);
        }
    }
    Ok(None)
}

/// Another `-p` than `ours` recorded by a holder of one of `stem`'s slot
/// files of this `kind` (`own` left out), looked at in order from 0 up to
/// the first missing one at or past `gaps_below`.
fn refusing_holder(
    dir: &LockDir,
    stem: &str,
    kind: fn(u32) -> SlotFile,
    own: Option<SlotFile>,
    ours: u32,
    gaps_below: u32,
) -> Result<Option<u32>> {
    // A sharer (its own file a share file) holds slot 0's file shared: nobody
    // holds it exclusively, and its record's --min-hold was read when the lock
    // was got. Only sharers, all -p 1 like it, hold it beside it.
    let sharer = matches!(own, Some(SlotFile::Share(_)));
    for slot in 0.. {
        let slot_file = kind(slot);
        if own == Some(slot_file) || (sharer && slot_file == SlotFile::Lock(0)) {
            continue;
        }
        let path = slot_file.path(dir.path(), stem);
        let Some(file) = open_existing(&path)? else {
            if slot >= gaps_below {
                break;
            }
            continue;
        };
        let theirs = holders_parallelism(&file, &path)?;
        if refuses(theirs, ours) {
            return Ok(theirs);
        }
    }
    Ok(None)
}

/// The `-p` recorded in a slot's file by its holder: a live one, or one that a
/// `--min-hold` keeps.
fn holders_parallelism(file: &File, path: &Path) -> Result<Option<u32>> {
    let failed = |err| Error::unavailable(format!("cannot lock {}", path.display()), err);
    let record = match file.try_lock() {
        // Free, unless a --min-hold keeps it; our moment's lock goes with the file.
        Ok(()) => read_record(file).filter(|record| record.kept_end().is_some()),
        Err(fs::TryLockError::WouldBlock) => match file.try_lock_shared() {
            // Slot 0's file held shared: by sharers, whose own files say their -p.
            Ok(()) => None,
            Err(fs::TryLockError::WouldBlock) => read_record(file),
            Err(fs::TryLockError::Error(err)) => return Err(failed(err)),
        },
        Err(fs::TryLockError::Error(err)) => return Err(failed(err)),
    };
    Ok(record.and_then(|record| record.owner.parallelism))
}
