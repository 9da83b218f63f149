//! Slot files: `NAME.SLOT.lock` is held with flock(2) by the slot's holder and,
//! while held, names the holder and its fence; after a `--min-hold` release it
//! says until when the slot stays taken though nobody holds its lock. A sharer's
//! record is in a share file, `NAME.SLOT.shared`, alike (see `share`). Files are
//! never deleted: a waiter blocked on a deleted file's inode would never see the
//! next holder.

use std::fs::{self, File};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::dir::LockDir;
use super::wait::LockMode;
use super::{NoSlot, admit, fence, give_back, share};
use crate::backend::boot_date::BootDate;
use crate::backend::record::HolderRecord;
use crate::backend::{Mode, Released, Renewal, Request, Slot};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::platform::clock::Moment;
use crate::platform::watch::DirWatch;

pub const LOCK_SUFFIX: &str = ".lock";
const SHARE_SUFFIX: &str = ".shared";
/// More than any record lockrun writes: a larger file is not read further.
pub const MAX_RECORD: u64 = 64 * 1024;

/// The file a holder's record is in: its slot's (an exclusive holder) or its
/// share file (a sharer, who also holds slot 0's file shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotFile {
    Lock(u32),
    Share(u32),
}

impl SlotFile {
    /// `STEM.SLOT.lock` or `STEM.SLOT.shared` → (STEM, the slot file).
    pub fn parse(file_name: &str) -> Option<(&str, Self)> {
        let numbered = |suffix| -> Option<(&str, u32)> {
            let (stem, slot) = file_name.strip_suffix(suffix)?.rsplit_once('.')?;
            Some((stem, slot.parse().ok()?))
        };
        numbered(LOCK_SUFFIX)
            .map(|(stem, slot)| (stem, Self::Lock(slot)))
            .or_else(|| numbered(SHARE_SUFFIX).map(|(stem, slot)| (stem, Self::Share(slot))))
    }

    pub fn path(self, dir: &Path, stem: &str) -> PathBuf {
        match self {
            Self::Lock(slot) => dir.join(format!("{stem}.{slot}{LOCK_SUFFIX}")),
            Self::Share(slot) => dir.join(format!("{stem}.{slot}{SHARE_SUFFIX}")),
        }
    }

    /// The slot's number, as `LOCKRUN_SLOT` and `status` show it.
    pub fn number(self) -> u32 {
        match self {
            Self::Lock(slot) | Self::Share(slot) => slot,
        }
    }

    /// How its holder holds the name.
    pub fn mode(self) -> Mode {
        match self {
            Self::Lock(_) => Mode::Exclusive,
            Self::Share(_) => Mode::Shared,
        }
    }
}

pub fn slot_path(dir: &Path, stem: &str, slot: u32) -> PathBuf {
    SlotFile::Lock(slot).path(dir, stem)
}

/// What trying a slot's lock found.
pub enum Probe {
    /// The lock is ours now and the slot is free: [`take`] it or let it go.
    /// With it, the last fence given out in the slot, read from its file.
    Free(File, u64),
    /// Someone holds the lock.
    Held,
    /// Nobody holds the lock, but a `--min-hold` keeps the slot taken until then.
    Kept(Moment),
}

/// Tries the lock of an open slot file without waiting: exclusive, or shared
/// for a sharer at slot 0's.
pub fn probe(file: File, path: &Path, mode: LockMode) -> Result<Probe> {
    match mode.try_lock(&file) {
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
    // Read once: the fence too, which no one else writes while the lock is ours.
    let record = read_record(&file);
    match record.as_ref().and_then(HolderRecord::kept_end) {
        Some(until) => {
            let _ = file.unlock();
            Probe::Kept(until)
        }
        None => Probe::Free(file, record.map_or(0, |record| record.fence)),
    }
}

/// Until when a `--min-hold` keeps the slot of `file` taken, if it still does.
pub fn kept_until(file: &File) -> Option<Moment> {
    read_record(file).and_then(|record| record.kept_end())
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

/// Makes the slot whose lock `file` holds (its last fence `last_of_slot`)
/// ours for `request` (a sharer's share file, with `gate`, slot 0's file,
/// locked shared), under the fence
/// counter's lock (waited for no later than its deadline): unless a holder has
/// another `-p`, or sharers that `--min-hold` keeps hold the slot 0 an
/// exclusive run took (then the slot is given back and that said), numbers the
/// acquisition and writes our record.
pub fn take(
    dir: &LockDir,
    stem: &str,
    slot: SlotFile,
    file: File,
    last_of_slot: u64,
    gate: Option<File>,
    request: &Request,
) -> Result<Result<FileSlot, NoSlot>> {
    let taken_at = Moment::now();
    let counter = fence::Counter::lock(dir, stem, request.deadline)?;
    let refused = match admit::other_parallelism(dir, stem, Some(slot), request.parallelism, false)?
    {
        Some(theirs) => Some(NoSlot::refused(theirs)),
        None if slot == SlotFile::Lock(0) => share::kept_until(dir.path(), stem)?.map(NoSlot::kept),
        None => None,
    };
    if let Some(no_slot) = refused {
        give_back(&file);
        if let Some(gate) = gate {
            let _ = gate.unlock();
        }
        return Ok(Err(no_slot));
    }
    let record = HolderRecord {
        name: request.name.to_string(),
        owner: request.owner.clone(),
        acquired_at: epoch_millis(SystemTime::now()),
        fence: counter.next(last_of_slot)?,
        kept_until: None,
        kept_on: None,
    };
    let path = slot.path(dir.path(), stem);
    // Written under the counter's lock: whoever is let in next sees our -p.
    write_record(&file, &record, &path)?;
    drop(counter);
    Ok(Ok(FileSlot {
        file,
        gate,
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
    /// A sharer's lock on slot 0's file, which keeps exclusive runs out.
    gate: Option<File>,
    path: PathBuf,
    slot: SlotFile,
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
        self.slot.number()
    }

    fn fence(&self) -> u64 {
        self.record.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn lock_files(&self) -> Vec<BorrowedFd<'_>> {
        [Some(&self.file), self.gate.as_ref()]
            .into_iter()
            .flatten()
            .map(AsFd::as_fd)
            .collect()
    }

    fn renew(&mut self, _within: Duration) -> Result<Renewal> {
        // No lease: the kernel holds the lock for as long as we live.
        Ok(Renewal::Renewed)
    }

    fn release(mut self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        if let Some(until) = keep_until.filter(|until| !until.has_passed()) {
            // Said before the lock goes: whoever gets it next sees that the slot
            // is still taken. Dated on the boot clock, which decides (docs/guide.md:
            // "Clocks"); the wall-clock time is for `status`.
            self.record.kept_until = Some(epoch_millis(SystemTime::now() + until.remaining()));
            self.record.kept_on = Some(BootDate::until(until));
        } else {
            // Nobody holds it from now on: the file keeps the fence for the next
            // holder, not the command line, which may carry a password, nor
            // a -p that would keep others out.
            self.record.owner.command.clear();
            self.record.owner.note = None;
            self.record.owner.parallelism = None;
        }
        let written = write_record(&self.file, &self.record, &self.path);
        // Unlocked rather than closed: the watchdog keeps this open file until it exits.
        let _ = self.file.unlock();
        // Touched, so that a waiter watching the directory for more than one slot wakes now.
        let _ = self.file.set_modified(SystemTime::now());
        // Let go last, once our share file says whether --min-hold keeps the
        // slot: the exclusive run this lets in reads that.
        if let Some(gate) = &self.gate {
            let _ = gate.unlock();
        }
        // The kernel held the lock for as long as we lived: it cannot have been lost.
        written.map(|()| Released::Ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_file_names_parse_from_the_right() {
        let parse = SlotFile::parse;
        assert_eq!(parse("backup.0.lock"), Some(("backup", SlotFile::Lock(0))));
        assert_eq!(parse("a.1.12.lock"), Some(("a.1", SlotFile::Lock(12))));
        assert_eq!(parse("a.1.7.shared"), Some(("a.1", SlotFile::Share(7))));
        assert_eq!(parse("backup.fence"), None);
        assert_eq!(parse("backup.x.lock"), None);
        assert_eq!(parse("backup.line"), None);
    }
}
