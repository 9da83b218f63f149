//! Shared holders (docs/guide.md: "Shared locks"). A sharer holds slot 0's file, the
//! gate, with a shared lock, as `flock -s` would, where an exclusive holder
//! holds it exclusively: the kernel keeps an exclusive holder apart from every
//! other holder, and every sharer blocked on the gate wakes at the one release
//! that lets them in. Each sharer also holds a share file of its own,
//! `NAME.SLOT.shared`, the lowest free one, exclusively, with its record in it
//! as in a slot file: so `LOCKRUN_SLOT` and `status` tell sharers apart, and
//! there are never more than [`MAX_SHARERS`]. Share files are made in order
//! from 0 and never deleted.

use std::fs::File;
use std::path::Path;

use super::dir::{LockDir, open_existing};
use super::earliest;
use super::slot::{self, Probe, SlotFile, probe};
use super::wait::LockMode;
use crate::backend::MAX_SHARERS;
use crate::error::Result;
use crate::platform::clock::Moment;

/// The lowest share slot of `stem` that is free, its file locked and ours (and its last fence), or
/// else when the first one that `--min-hold` keeps is let go. Under our own
/// watch of the directory (`watched`) a file is looked at read-only first:
/// closing a file opened for writing would wake us.
pub fn take_lowest_free(
    dir: &LockDir,
    stem: &str,
    watched: bool,
) -> Result<Result<(u32, File, u64), Option<Moment>>> {
    let mut kept_until = None;
    for slot in 0..MAX_SHARERS {
        let path = SlotFile::Share(slot).path(dir.path(), stem);
        if watched && let Some(file) = open_existing(&path)? {
            match probe(file, &path, LockMode::Exclusive)? {
                // Let go at once, to be locked opened for writing below.
                Probe::Free(..) => {}
                Probe::Held => continue,
                Probe::Kept(until) => {
                    kept_until = Some(earliest(kept_until, until));
                    continue;
                }
            }
        }
        match probe(dir.open_lock_file(&path)?, &path, LockMode::Exclusive)? {
            Probe::Free(file, fence) => return Ok(Ok((slot, file, fence))),
            Probe::Held => {}
            Probe::Kept(until) => kept_until = Some(earliest(kept_until, until)),
        }
    }
    Ok(Err(kept_until))
}

/// Until when sharers of `stem` that `--min-hold` keeps keep exclusive runs
/// out, if any does: read from the records, since a kept slot's lock is free.
pub fn kept_until(dir: &Path, stem: &str) -> Result<Option<Moment>> {
    let mut latest = None;
    for slot in 0..MAX_SHARERS {
        let Some(file) = open_existing(&SlotFile::Share(slot).path(dir, stem))? else {
            break;
        };
        latest = latest.max(slot::kept_until(&file));
    }
    Ok(latest)
}
