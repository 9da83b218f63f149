//! The waiting line of the file backend, kept by the kernel's file locks.
//!
//! A waiter holds a shared lock on `NAME.line` for as long as it is in line, so
//! that a newcomer can tell in one call that nobody waits (when the lock is
//! taken, the waiters' files tell): a waiter must not be overtaken. Its place
//! is a file `NAME.TICKET.wait` (the ticket is the moment it began waiting on
//! the host's monotonic clock, then its pid), locked exclusively by it and
//! holding its record for `status`; it is made as `NAME.TICKET.joining`,
//! locked, and renamed, so it is never seen unlocked. Everyone else only ever
//! locks it shared: so a waiter lives while its file is locked exclusively.
//! A waiter waits for the one in its way to leave by blocking on that file's
//! lock, shared: the kernel wakes it the moment that one takes a slot or dies,
//! and no one else. In an exclusive run's way is the waiter just ahead; in a
//! sharer's, the nearest exclusive waiter ahead, since the sharers between go
//! together with it: so every sharer behind one exclusive waiter wakes at once
//! when it leaves. Files of dead waiters are removed by the waiter behind them.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::dir::{LockDir, open_existing};
use super::slot::first_json_value;
use super::wait::{LockMode, brief_lock_deadline, lock_until};
use crate::backend::record::WaiterRecord;
use crate::backend::{Mode, Request};
use crate::error::{Error, Result, Trouble};
use crate::platform::clock::Moment;
use crate::platform::proc::live_flocks;

pub const WAIT_SUFFIX: &str = ".wait";
const JOINING_SUFFIX: &str = ".joining";
const LINE_SUFFIX: &str = ".line";

/// Our place in line, held until we take a slot or give up.
pub struct PlaceInLine {
    ticket: String,
    path: PathBuf,
    /// Our file, locked for as long as we wait.
    _file: File,
    /// `NAME.line`, locked shared for as long as we wait.
    _line: File,
}

impl PlaceInLine {
    /// Joins the line of the name whose files start with `stem` in `dir`,
    /// waiting for the line's lock briefly and not past `deadline`.
    pub fn join(
        dir: &LockDir,
        stem: &str,
        record: &WaiterRecord,
        deadline: Option<Moment>,
    ) -> Result<Self> {
        let line_path = dir.path().join(format!("{stem}{LINE_SUFFIX}"));
        let line = dir.open_lock_file(&line_path)?;
        // Newcomers hold it exclusively for a moment (`is_occupied`); a neighbour who holds it longer is stuck.
        if !lock_until(
            &line,
            LockMode::Shared,
            brief_lock_deadline(deadline),
            &line_path,
        )? {
            return Err(Error::trouble(
                Trouble::Transient,
                format!(
                    "cannot join the line: another process keeps {} locked",
                    line_path.display()
                ),
            ));
        }
        let ticket = format!(
            "{:020}-{}",
            Moment::now().since_boot().as_nanos(),
            std::process::id()
        );
        let path = waiter_path(dir.path(), stem, &ticket);
        // Made under another name and locked before it is renamed into place:
        // a waiter behind us must never find it unlocked and take us for dead.
        // Locked, it also tells a newcomer that we are in line (`is_occupied`).
        let joining = ticket_path(dir.path(), stem, &ticket, JOINING_SUFFIX);
        let mut file = dir.create_new(&joining)?;
        let written = match file.try_lock() {
            // Encoded first and written at once: serde_json writes to a file piece by piece.
            Ok(()) => serde_json::to_vec(record)
                .map_err(io::Error::other)
                .and_then(|bytes| file.write_all(&bytes))
                .and_then(|()| fs::rename(&joining, &path)),
            // Nobody has any business with a file made a moment ago.
            Err(fs::TryLockError::WouldBlock) => Err(io::Error::other("another process locked it")),
            Err(fs::TryLockError::Error(err)) => Err(err),
        };
        if let Err(err) = written {
            let _ = fs::remove_file(&joining);
            return Err(Error::unavailable(
                format!("cannot write {}", joining.display()),
                err,
            ));
        }
        Ok(Self {
            ticket,
            path,
            _file: file,
            _line: line,
        })
    }

    /// The waiters' files ahead of us, nearest first (dead ones included).
    pub fn ahead(&self, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
        let mut tickets: Vec<String> = waiter_tickets(dir, stem)?
            .into_iter()
            .filter(|ticket| *ticket < self.ticket)
            .collect();
        tickets.sort_unstable_by(|a, b| b.cmp(a));
        Ok(tickets
            .into_iter()
            .map(|ticket| waiter_path(dir, stem, &ticket))
            .collect())
    }

    /// Leaves the line: the file goes first, so that the one behind us, woken by
    /// the lock going with it, no longer finds it.
    pub fn leave(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The live waiter nearest ahead of us that `request` must wait for, opened
/// (not locked) so that we can wait for it to leave, and how many files of
/// dead waiters on the way were removed. A waiter is in our way unless the
/// line would let us go with it (a sharer with sharers).
pub fn nearest_in_the_way(ahead: &[PathBuf], request: &Request) -> Result<(Option<File>, usize)> {
    let mut dead = 0;
    for path in ahead {
        let Some(file) = open_existing(path)? else {
            dead += 1;
            continue;
        };
        if !is_live(&file, path)? {
            // Its waiter died, or is leaving and removes it itself.
            dead += 1;
            let _ = fs::remove_file(path);
        } else if !request.admitted([], [mode_of(&file)]) {
            return Ok((Some(file), dead));
        }
    }
    Ok((None, dead))
}

/// Whether the waiter whose file this is still waits: it holds the file's lock exclusively.
pub fn is_live(file: &File, path: &Path) -> Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(err)) => Err(Error::unavailable(
            format!("cannot lock {}", path.display()),
            err,
        )),
    }
}

/// How a waiter waits to hold the name; one whose record cannot be read is taken to wait alone.
fn mode_of(file: &File) -> Mode {
    first_json_value::<WaiterRecord>(file).map_or(Mode::Exclusive, |record| record.owner.mode)
}

/// True when someone `request` must not overtake is in the line of `stem`:
/// a live waiter in its way, or one joining the line (of a mode not known yet).
/// A free line lock says nobody is there in one call. A taken one may be held
/// by another newcomer asking the same at this moment rather than by a
/// waiter, so then the waiters' own files say.
pub fn is_occupied(dir: &LockDir, stem: &str, request: &Request) -> Result<bool> {
    let path = dir.path().join(format!("{stem}{LINE_SUFFIX}"));
    let line = dir.open_lock_file(&path)?;
    match line.try_lock() {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => {
            let waiters: Vec<PathBuf> = waiter_tickets(dir.path(), stem)?
                .into_iter()
                .map(|ticket| waiter_path(dir.path(), stem, &ticket))
                .collect();
            Ok(nearest_in_the_way(&waiters, request)?.0.is_some()
                || someone_joining(dir.path(), stem)?)
        }
        Err(fs::TryLockError::Error(err)) => Err(Error::unavailable(
            format!("cannot lock {}", path.display()),
            err,
        )),
    }
}

/// True when a waiter of `stem` is between taking the line's lock and its
/// place's file appearing: its `.joining` file is locked. /proc/locks says so
/// without locking the file: even a moment's lock by a newcomer would make the
/// joiner's own fail. One left by a joiner that died is not locked, and a
/// symlink planted under such a name is looked at, not followed.
fn someone_joining(dir: &Path, stem: &str) -> Result<bool> {
    let joining: Vec<fs::Metadata> = tickets(dir, stem, JOINING_SUFFIX)?
        .iter()
        .filter_map(|ticket| {
            fs::symlink_metadata(ticket_path(dir, stem, ticket, JOINING_SUFFIX)).ok()
        })
        .collect();
    if joining.is_empty() {
        return Ok(false);
    }
    let locked = live_flocks();
    Ok(joining
        .iter()
        .any(|meta| locked.iter().any(|lock| lock.is_on(meta))))
}

/// The tickets of every waiter's file of `stem`, in no order.
pub fn waiter_tickets(dir: &Path, stem: &str) -> Result<Vec<String>> {
    tickets(dir, stem, WAIT_SUFFIX)
}

/// The tickets of `stem`'s files whose names end in `suffix`, in no order.
fn tickets(dir: &Path, stem: &str, suffix: &str) -> Result<Vec<String>> {
    let entries = fs::read_dir(dir).map_err(|err| {
        Error::unavailable(format!("cannot read lock directory {}", dir.display()), err)
    })?;
    Ok(entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let (their_stem, ticket) = parse_ticket_file_name(name.to_str()?, suffix)?;
            (their_stem == stem).then(|| ticket.to_owned())
        })
        .collect())
}

pub fn waiter_path(dir: &Path, stem: &str, ticket: &str) -> PathBuf {
    ticket_path(dir, stem, ticket, WAIT_SUFFIX)
}

fn ticket_path(dir: &Path, stem: &str, ticket: &str, suffix: &str) -> PathBuf {
    dir.join(format!("{stem}.{ticket}{suffix}"))
}

/// `STEM.TICKET.wait` → (STEM, TICKET).
pub fn parse_waiter_file_name(file_name: &str) -> Option<(&str, &str)> {
    parse_ticket_file_name(file_name, WAIT_SUFFIX)
}

/// `STEM.TICKET` + `suffix` → (STEM, TICKET).
fn parse_ticket_file_name<'a>(file_name: &'a str, suffix: &str) -> Option<(&'a str, &'a str)> {
    let (stem, ticket) = file_name.strip_suffix(suffix)?.rsplit_once('.')?;
    ticket
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'-')
        .then_some((stem, ticket))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiter_file_names_parse_from_the_right() {
        assert_eq!(
            parse_waiter_file_name("a.b.00000000000000000012-77.wait"),
            Some(("a.b", "00000000000000000012-77"))
        );
        assert_eq!(parse_waiter_file_name("a.0.lock"), None);
        assert_eq!(parse_waiter_file_name("a.x.wait"), None);
    }
}
