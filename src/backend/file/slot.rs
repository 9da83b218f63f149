//! Slot files: `NAME.SLOT.lock` is held with flock(2) by the slot's holder and,
//! while held, names the holder and its fence; after a `--min-hold` release it
//! says until when the slot stays taken though nobody holds its lock. Files are
//! never deleted: a waiter blocked on a deleted file's inode would never see the
//! next holder.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::dir::LockDir;
use super::{admit, fence};
use crate::backend::record::HolderRecord;
use crate::backend::{Released, Renewal, Request, Slot};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::platform::clock::Moment;
use crate::platform::watch::DirWatch;

pub const LOCK_SUFFIX: &str = ".lock";
/// More than any record lockrun writes: a larger file is not read further.
pub const MAX_RECORD: u64 = 64 * 1024;

/// `STEM.SLOT.lock` → (STEM, SLOT).
pub fn parse_slot_file_name(file_name: &str) -> Option<(&str, u32)> {
    let (stem, slot) = file_name.strip_suffix(LOCK_SUFFIX)?.rsplit_once('.')?;
    Some((stem, slot.parse().ok()?))
}

pub fn slot_path(dir: &Path, stem: &str, slot: u32) -> PathBuf {
    dir.join(format!("{stem}.{slot}{LOCK_SUFFIX}"))
}

/// What trying a slot's lock found.
pub enum Probe {
    /// The lock is ours now and the slot is free: [`take`] it or let it go.
    Free(File),
    /// Someone holds the lock.
    Held,
    /// Nobody holds the lock, but a `--min-hold` keeps the slot taken until then.
    Kept(SystemTime),
}

/// Tries the lock of an open slot file without waiting.
pub fn probe(file: File, path: &Path) -> Result<Probe> {
    match file.try_lock() {
        Ok(()) => Ok(free_or_kept(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(Probe::Held),
        Err(fs::TryLockError::Error(err)) => Err(Error::unavailable(
            format!("cannot lock {}", path.display()),
            err,
        )),
    }
}

/// A slot whose lock we just got: free, unless its last holder kept it (the lock is let go then).
pub fn free_or_kept(file: File) -> Probe {
    let kept = read_record(&file)
        .and_then(|record| record.kept_until)
        .map(|until| SystemTime::UNIX_EPOCH + Duration::from_millis(until))
        .filter(|until| *until > SystemTime::now());
    match kept {
        Some(until) => {
            let _ = file.unlock();
            Probe::Kept(until)
        }
        None => Probe::Free(file),
    }
}

/// The record in a slot file, if it holds one (it is read only so far).
pub fn read_record(file: &File) -> Option<HolderRecord> {
    first_json_value(file)
}

/// The first JSON value in `file`, read from its start whatever its offset.
pub fn first_json_value<T: serde::de::DeserializeOwned>(file: &File) -> Option<T> {
    let len = file.metadata().ok()?.len().min(MAX_RECORD);
    let mut bytes = vec![0; len as usize];
    file.read_exact_at(&mut bytes, 0).ok()?;
    // A writer writes first, then trims: bytes past the first JSON value may be stale.
    serde_json::Deserializer::from_slice(&bytes)
        .into_iter()
        .next()?
        .ok()
}

/// Makes the slot whose lock `file` holds ours for `request`, under the fence
/// counter's lock (waited for no later than its deadline): unless a holder has
/// another `-p` (then the slot is given back and that `-p` returned), numbers
/// the acquisition and writes our record.
pub fn take(
    dir: &LockDir,
    stem: &str,
    slot: u32,
    file: File,
    request: &Request,
) -> Result<Result<FileSlot, u32>> {
    let taken_at = Moment::now();
    let last_of_slot = read_record(&file).map_or(0, |record| record.fence);
    let counter = fence::Counter::lock(dir, stem, request.deadline)?;
    if let Some(theirs) =
        admit::other_parallelism(dir, stem, Some(slot), request.parallelism, false)?
    {
        let _ = file.unlock();
        // Touched, so that a waiter watching the directory looks again.
        let _ = file.set_modified(SystemTime::now());
        return Ok(Err(theirs));
    }
    let record = HolderRecord {
        name: request.name.to_string(),
        owner: request.owner.clone(),
        acquired_at: epoch_millis(SystemTime::now()),
        fence: counter.next(last_of_slot)?,
        kept_until: None,
    };
    let path = slot_path(dir.path(), stem, slot);
    // Written under the counter's lock: whoever is let in next sees our -p.
    write_record(&file, &record, &path)?;
    drop(counter);
    Ok(Ok(FileSlot {
        file,
        path,
        slot,
        record,
        taken_at,
        watch: None,
    }))
}

fn write_record(file: &File, record: &HolderRecord, path: &Path) -> Result<()> {
    let json =
        serde_json::to_vec(record).map_err(|err| Error::internal("encoding the record", err))?;
    // Write first, then trim: a reader never sees an empty file, and parses only the first JSON value.
    file.write_all_at(&json, 0)
        .and_then(|()| file.set_len(json.len() as u64))
        .map_err(|err| Error::unavailable(format!("cannot write {}", path.display()), err))
}

/// A slot of the file backend that is ours: its lock is held for as long as
/// lockrun (or its watchdog, which shares the open file) lives.
pub struct FileSlot {
    file: File,
    path: PathBuf,
    slot: u32,
    record: HolderRecord,
    taken_at: Moment,
    /// The watch its waiter had on the directory, closed only with the slot (see `FileStore::take`).
    watch: Option<DirWatch>,
}

impl FileSlot {
    /// Keeps `watch` open until the slot is released.
    pub fn keep(&mut self, watch: Option<DirWatch>) {
        self.watch = watch;
    }
}

impl Slot for FileSlot {
    fn number(&self) -> u32 {
        self.slot
    }

    fn fence(&self) -> u64 {
        self.record.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn renew(&mut self, _within: Duration) -> Result<Renewal> {
        // No lease: the kernel holds the lock for as long as we live.
        Ok(Renewal::Renewed)
    }

    fn release(mut self: Box<Self>, keep_until: Option<SystemTime>) -> Result<Released> {
        if let Some(until) = keep_until.filter(|until| *until > SystemTime::now()) {
            // Said before the lock goes: whoever gets it next sees that the slot is still taken.
            self.record.kept_until = Some(epoch_millis(until));
        } else {
            // Nobody holds it from now on: the file keeps the fence for the next
            // holder, not the command line, which may carry a password, nor
            // a -p that would keep others out.
            self.record.owner.command.clear();
            self.record.owner.parallelism = None;
        }
        let written = write_record(&self.file, &self.record, &self.path);
        // Unlocked rather than closed: the watchdog shares this open file until it exits.
        let _ = self.file.unlock();
        // Touched, so that a waiter watching the directory for more than one slot wakes now.
        let _ = self.file.set_modified(SystemTime::now());
        // The kernel held the lock for as long as we lived: it cannot have been lost.
        written.map(|()| Released::Ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_file_names_parse_from_the_right() {
        assert_eq!(parse_slot_file_name("backup.0.lock"), Some(("backup", 0)));
        assert_eq!(parse_slot_file_name("a.1.12.lock"), Some(("a.1", 12)));
        assert_eq!(parse_slot_file_name("backup.fence"), None);
        assert_eq!(parse_slot_file_name("backup.x.lock"), None);
    }
}
