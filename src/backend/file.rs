//! The file backend: one lock file per slot, held with flock(2) (SPEC §4).
//!
//! `NAME.SLOT.lock` holds the lock and, while held, its holder's metadata;
//! `NAME.fence` holds the name's fence counter. Files are never deleted: a
//! waiter blocked on a deleted file's inode would never see the next holder.

use std::env;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, SystemTime};

use rand::RngExt;

use super::{Acquired, Backend, Holder, Renewal, Request, Wait};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::alarm::Alarm;
use crate::platform::clock::Moment;
use crate::platform::proc::live_flocks;

const LOCK_SUFFIX: &str = ".lock";
const FENCE_SUFFIX: &str = ".fence";

pub struct FileBackend {
    dir: PathBuf,
    /// The slot file whose lock we hold.
    held: Option<File>,
}

impl FileBackend {
    /// Opens the directory: `dir` as given, or the first usable default.
    pub fn open(dir: Option<PathBuf>) -> Result<Self> {
        let dir = match dir {
            Some(dir) => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|err| {
                        Error::unavailable(
                            format!("cannot create lock directory {}", dir.display()),
                            err,
                        )
                    })?;
                dir
            }
            None => default_dir()?,
        };
        Ok(Self { dir, held: None })
    }

    fn slot_path(&self, name: &Name, slot: u32) -> PathBuf {
        self.dir
            .join(format!("{}.{slot}{LOCK_SUFFIX}", name.file_stem()))
    }

    /// Records the new holder in its slot file and bumps the name's fence.
    fn take(&mut self, file: File, request: &Request, slot: u32) -> Result<Acquired> {
        let fence = self.bump_fence(&request.name)?;
        let holder = Holder {
            name: request.name.to_string(),
            slot,
            pid: request.owner.process.pid,
            host: request.owner.process.host.clone(),
            command: request.owner.command.clone(),
            acquired_at: epoch_millis(SystemTime::now()),
            expires_at: None,
            fence,
        };
        let json = serde_json::to_vec(&holder)
            .map_err(|err| Error::internal("encoding holder metadata", err))?;
        // Write first, then trim: a reader never sees an empty file, and parses only the first JSON value.
        file.write_all_at(&json, 0)
            .and_then(|()| file.set_len(json.len() as u64))
            .map_err(|err| {
                Error::unavailable(
                    format!(
                        "cannot write {}",
                        self.slot_path(&request.name, slot).display()
                    ),
                    err,
                )
            })?;
        self.held = Some(file);
        Ok(Acquired {
            slot,
            fence,
            sent: Moment::now(),
        })
    }

    fn bump_fence(&self, name: &Name) -> Result<u64> {
        let path = self.dir.join(format!("{}{FENCE_SUFFIX}", name.file_stem()));
        let file = open_lock_file(&path)?;
        let failed = |err: io::Error| {
            Error::unavailable(format!("cannot update fence {}", path.display()), err)
        };
        file.lock().map_err(failed)?;
        let mut text = String::new();
        (&file).read_to_string(&mut text).map_err(failed)?;
        // A fence must never go back: a file that does not hold a number is an error, not a zero.
        let last = match text.trim() {
            "" => 0,
            number => number.parse::<u64>().map_err(|_| {
                Error::Unavailable(format!("{} does not hold a fence number", path.display()))
            })?,
        };
        let fence = last + 1;
        let text = fence.to_string();
        file.write_all_at(text.as_bytes(), 0)
            .and_then(|()| file.set_len(text.len() as u64))
            .map_err(failed)?;
        Ok(fence)
    }

    fn try_slot(&mut self, request: &Request, slot: u32) -> Result<Option<Acquired>> {
        let path = self.slot_path(&request.name, slot);
        let file = open_lock_file(&path)?;
        match file.try_lock() {
            Ok(()) => self.take(file, request, slot).map(Some),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(err)) => Err(Error::unavailable(
                format!("cannot lock {}", path.display()),
                err,
            )),
        }
    }

    /// Waits in the kernel for slot 0 until `until` at the latest, as flock(1)
    /// does: the waiter wakes the moment the holder exits, and a SIGALRM at
    /// `until` gives the acquire loop control back (to redraw its waiting line
    /// or give up at `--timeout`) without a thread.
    fn wait_in_kernel(&mut self, request: &Request, until: Moment) -> Result<Option<Acquired>> {
        if until.has_passed() {
            return Ok(None);
        }
        let path = self.slot_path(&request.name, 0);
        let file = open_lock_file(&path)?;
        let alarm = Alarm::after(until.remaining())
            .map_err(|err| Error::internal("arming the --timeout alarm", err))?;
        loop {
            match file.lock() {
                Ok(()) => {
                    // Disarmed first: a SIGALRM must not interrupt the fence update.
                    drop(alarm);
                    return self.take(file, request, 0).map(Some);
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                    if until.has_passed() {
                        return Ok(None);
                    }
                }
                Err(err) => {
                    return Err(Error::unavailable(
                        format!("cannot lock {}", path.display()),
                        err,
                    ));
                }
            }
        }
    }
}

impl Backend for FileBackend {
    fn try_acquire(&mut self, request: &Request) -> Result<Option<Acquired>> {
        if request.parallelism == 1 {
            return self.try_slot(request, 0);
        }
        let start = rand::rng().random_range(0..request.parallelism);
        for i in 0..request.parallelism {
            if let Some(acquired) = self.try_slot(request, (start + i) % request.parallelism)? {
                return Ok(Some(acquired));
            }
        }
        Ok(None)
    }

    fn wait(&mut self, request: &Request, wait: Wait) -> Result<Option<Acquired>> {
        if request.parallelism == 1 {
            return self.wait_in_kernel(request, wait.step_until);
        }
        thread::sleep(wait.step_until.remaining());
        Ok(None)
    }

    fn renew(&mut self, _within: Duration) -> Result<Renewal> {
        // File locks are not leases: the kernel holds them for as long as we live.
        Ok(Renewal::Renewed)
    }

    fn release(&mut self, _keep_until: Option<SystemTime>) -> Result<()> {
        // Unlocked explicitly rather than by closing: the watchdog shares this open
        // file until it exits. The file itself stays for the next holder.
        if let Some(file) = self.held.take() {
            let _ = file.unlock();
        }
        Ok(())
    }

    fn holders(&mut self, name: Option<&Name>) -> Result<Vec<Holder>> {
        let locked = live_flocks();
        let entries = fs::read_dir(&self.dir).map_err(|err| {
            Error::unavailable(
                format!("cannot read lock directory {}", self.dir.display()),
                err,
            )
        })?;
        let wanted_stem = name.map(Name::file_stem);
        let mut holders = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some((stem, slot)) = file_name.to_str().and_then(parse_slot_file_name) else {
                continue;
            };
            if wanted_stem.as_deref().is_some_and(|wanted| wanted != stem) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let Some(lock_pid) = locked.iter().find(|l| l.is_on(&meta)).map(|l| l.pid) else {
                continue;
            };
            let mut holder = read_holder(&entry.path()).unwrap_or_else(|| Holder {
                name: stem.to_owned(),
                slot,
                pid: lock_pid,
                host: String::new(),
                command: String::new(),
                acquired_at: 0,
                expires_at: None,
                fence: 0,
            });
            holder.slot = slot;
            holders.push(holder);
        }
        holders.sort_by(|a, b| (&a.name, a.slot).cmp(&(&b.name, b.slot)));
        Ok(holders)
    }

    fn break_leases(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Holder>> {
        let holders: Vec<String> = self
            .holders(Some(name))?
            .iter()
            .filter(|h| slot.is_none_or(|s| s == h.slot))
            .map(|h| {
                let host = if h.host.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", h.host)
                };
                format!("pid {}{host} (slot {})", h.pid, h.slot)
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
        Err(Error::Usage(format!(
            "cannot release {name}: a file lock has no lease to break, the kernel frees it when its holder exits; {held_by}"
        )))
    }
}

/// Opens a lock file for locking, refusing symlinks, FIFOs and hard links so
/// that nothing planted in a shared directory is ever written through.
fn open_lock_file(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o666)
        .custom_flags(libc_flags())
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => Error::Unavailable(format!(
                "refusing to follow the symbolic link at {}",
                path.display()
            )),
            _ => Error::unavailable(format!("cannot open lock file {}", path.display()), err),
        })?;
    let meta = file.metadata().map_err(|err| {
        Error::unavailable(format!("cannot inspect lock file {}", path.display()), err)
    })?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(Error::Unavailable(format!(
            "refusing to use {}: not a plain lock file (a special file or a hard link)",
            path.display()
        )));
    }
    Ok(file)
}

fn libc_flags() -> i32 {
    // O_NONBLOCK keeps a planted FIFO from blocking the open; flock(2) ignores it.
    (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits()
}

fn read_holder(path: &Path) -> Option<Holder> {
    let bytes = fs::read(path).ok()?;
    // The holder trims after writing, so bytes past the first JSON value may be stale.
    serde_json::Deserializer::from_slice(&bytes)
        .into_iter()
        .next()?
        .ok()
}

/// `STEM.SLOT.lock` → (STEM, SLOT).
fn parse_slot_file_name(file_name: &str) -> Option<(&str, u32)> {
    let (stem, slot) = file_name.strip_suffix(LOCK_SUFFIX)?.rsplit_once('.')?;
    Some((stem, slot.parse().ok()?))
}

/// `$XDG_RUNTIME_DIR/lockrun`, else `/run/lock/lockrun`, else `$TMPDIR/lockrun-$UID`:
/// the first that is (or can be made) a real directory of ours, mode 0700.
fn default_dir() -> Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let mut candidates = Vec::new();
    if let Some(runtime) = env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(runtime).join("lockrun"));
    }
    candidates.push(PathBuf::from("/run/lock/lockrun"));
    candidates.push(env::temp_dir().join(format!("lockrun-{uid}")));
    let mut refusals = Vec::new();
    for dir in candidates {
        match private_dir(&dir, uid) {
            Ok(()) => return Ok(dir),
            Err(why) => refusals.push(format!("{} ({why})", dir.display())),
        }
    }
    Err(Error::Unavailable(format!(
        "no usable lock directory: {}; set --dir",
        refusals.join(", ")
    )))
}

fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err.to_string()),
    }
    let meta = fs::symlink_metadata(dir).map_err(|err| err.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("a symbolic link".into());
    }
    if !meta.is_dir() {
        return Err("not a directory".into());
    }
    if meta.uid() != uid {
        return Err(format!("owned by uid {}", meta.uid()));
    }
    Ok(())
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
