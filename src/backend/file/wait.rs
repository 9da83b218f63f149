//! Blocking on a file's lock until a deadline, and no longer: SIGALRM at the
//! deadline interrupts flock(2), as flock(1)'s timeout does.

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;
use std::time::Duration;

use crate::backend::Mode;
use crate::error::{Error, Result};
use crate::platform::alarm::Alarm;
use crate::platform::clock::Moment;

/// The longest wait for a lock that lockrun holds only for microseconds (the
/// fence counter's, the line's exclusive one), as SQLite's busy timeout: held
/// this long, it is held by something stuck or hostile.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);
/// Even `--no-wait` waits this long for such a lock: the lockrun in the middle
/// of its microseconds with it may be descheduled on a busy host.
const GRACE: Duration = Duration::from_millis(500);

/// When to give up on a lock that lockrun holds only for microseconds: at the
/// wait's `deadline` or after the busy timeout, whichever comes first, but not
/// before the grace has passed.
pub fn brief_lock_deadline(deadline: Option<Moment>) -> Moment {
    let patience = deadline.map_or(BUSY_TIMEOUT, |deadline| {
        deadline.remaining().clamp(GRACE, BUSY_TIMEOUT)
    });
    Moment::now() + patience
}

/// Blocks on `file`'s lock until we get it or `until` passes; true when we got it.
pub fn lock_until(file: &File, mode: LockMode, until: Moment, path: &Path) -> Result<bool> {
    let failed = |err| Error::unavailable(format!("cannot lock {}", path.display()), err);
    // A free lock is taken without arming the alarm (six system calls, for most locks).
    match mode.try_lock(file) {
        Ok(()) => return Ok(true),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(err)) => return Err(failed(err)),
    }
    if until.has_passed() {
        return Ok(false);
    }
    // Interrupted at `until`, the wait leaves the kernel's queue for the lock only for a moment.
    let _alarm = Alarm::after(until.remaining())
        .map_err(|err| Error::internal("arming the wait's alarm", err))?;
    loop {
        match mode.lock(file) {
            Ok(()) => return Ok(true),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                if until.has_passed() {
                    return Ok(false);
                }
            }
            Err(err) => return Err(failed(err)),
        }
    }
}

/// How a file is locked: by one process alone, or shared with others (flock(2)'s
/// `LOCK_EX` and `LOCK_SH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Exclusive,
    Shared,
}

impl From<Mode> for LockMode {
    /// An exclusive run locks slot files exclusively; a sharer locks slot 0's shared.
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Exclusive => Self::Exclusive,
            Mode::Shared => Self::Shared,
        }
    }
}

impl LockMode {
    pub fn try_lock(self, file: &File) -> std::result::Result<(), TryLockError> {
        match self {
            Self::Exclusive => file.try_lock(),
            Self::Shared => file.try_lock_shared(),
        }
    }

    fn lock(self, file: &File) -> io::Result<()> {
        match self {
            Self::Exclusive => file.lock(),
            Self::Shared => file.lock_shared(),
        }
    }
}
