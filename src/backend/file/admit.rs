//! Whether a run's `-p` lets it into a name's slots or line: a name's slot
//! count is part of the lock (README: "Slots"). Asked under the name's fence
//! counter's lock, which every holder and waiter took to get in, so the ones
//! let in agree with each other; every one of them is read, so that a record
//! left by a holder that crashed can only refuse a run, never let one in.

use std::fs::{self, File};
use std::time::SystemTime;

use super::dir::{LockDir, open_existing};
use super::line::{waiter_path, waiter_tickets};
use super::slot::{first_json_value, read_record, slot_path};
use crate::backend::record::WaiterRecord;
use crate::backend::refuses;
use crate::error::{Error, Result};
use crate::identity::epoch_millis;

/// Another `-p` than `ours` that a holder of a slot of `stem` (`own` left
/// out) has, or with `waiters` a waiter in its line.
pub fn other_parallelism(
    dir: &LockDir,
    stem: &str,
    own: Option<u32>,
    ours: u32,
    waiters: bool,
) -> Result<Option<u32>> {
    // Slot files are made in order from slot 0, so the first missing one at
    // or past ours ends them: every holder's slot is below its own -p.
    for slot in 0.. {
        let path = slot_path(dir.path(), stem, slot);
        if own == Some(slot) {
            continue;
        }
        let Some(file) = open_existing(&path)? else {
            if slot >= ours {
                break;
            }
            continue;
        };
        let theirs = if is_locked(&file, &path)? {
            read_record(&file).and_then(|record| record.owner.parallelism)
        } else {
            // Free, unless a --min-hold keeps it; our moment's lock goes with the file.
            let now = epoch_millis(SystemTime::now());
            read_record(&file)
                .filter(|record| record.kept_until.is_some_and(|until| until > now))
                .and_then(|record| record.owner.parallelism)
        };
        if refuses(theirs, ours) {
            return Ok(theirs);
        }
    }
    if !waiters {
        return Ok(None);
    }
    for ticket in waiter_tickets(dir.path(), stem)? {
        let path = waiter_path(dir.path(), stem, &ticket);
        let Some(file) = open_existing(&path)? else {
            continue;
        };
        if !is_locked(&file, &path)? {
            // Its waiter is gone.
            continue;
        }
        let theirs = first_json_value::<WaiterRecord>(&file).and_then(|r| r.owner.parallelism);
        if refuses(theirs, ours) {
            return Ok(theirs);
        }
    }
    Ok(None)
}

/// Whether someone else holds `file`'s lock.
fn is_locked(file: &File, path: &std::path::Path) -> Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(err)) => Err(Error::unavailable(
            format!("cannot lock {}", path.display()),
            err,
        )),
    }
}
