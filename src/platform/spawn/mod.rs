//! Starting the command the way `posix_spawn(3)` does: clone(2) with
//! `CLONE_VM | CLONE_VFORK`, so lockrun's address space is shared, not copied,
//! until the child calls exec. `posix_spawn` itself cannot be used: it has no way
//! to arm the parent-death signal. std's `pre_exec` can, but makes std fork,
//! and the page-table copy plus the copy-on-write faults that follow cost
//! about 0.25 ms of a 2 ms `lockrun -- true` (see BENCHMARKS.md).
//!
//! The child shares lockrun's memory while lockrun is suspended, so it only
//! makes system calls on what was prepared beforehand (the `PATH` search and
//! argument lists included: `exec`), on a stack of its own with a guard below
//! it (`stack`): no allocation, no lock, and a small constant amount of stack
//! whatever the size of the arguments and environment.

#![allow(unsafe_code)]

mod exec;
mod stack;

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sched::{CloneFlags, clone};
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::sys::wait::waitpid;
use nix::unistd::{Pid, getpid, getppid, setpgid};

pub use exec::Exec;

use super::clock::Moment;
use super::watchdog::Announcer;
use super::{signals, terminal};

/// Makes lockrun the parent of whatever the command leaves behind
/// (`PR_SET_CHILD_SUBREAPER`), so that lockrun reaps it, not a PID 1 that may
/// never reap (a container without an init): a zombie left to such a PID 1
/// would keep the command's group, and the lock, alive.
pub fn adopt_orphans() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)
}

/// Starts `exec` in its own process group (taking the terminal's foreground
/// when `tty` is given), with every signal unblocked, SIGPIPE at its default,
/// and SIGKILL as its parent-death signal; the new group is announced to
/// `watchdog` before exec. Returns once the child has called exec: an exec
/// failure comes back as its error, and [`io::ErrorKind::TimedOut`] when the
/// child found `start_before` passed, after announcing itself, and did not exec.
pub fn spawn(
    exec: &Exec,
    tty: Option<i32>,
    watchdog: &Announcer,
    start_before: Option<Moment>,
) -> io::Result<Pid> {
    let mut prepared = exec.prepare();
    let parent = getpid();
    // The child reports why it could not exec here: it shares this memory.
    let failure = AtomicI32::new(0);
    let stack = stack::map()?;
    let child = || -> isize {
        let errno = setup(parent, tty, watchdog, start_before)
            .map_or_else(|errno| errno as i32, |()| prepared.exec());
        failure.store(errno, Ordering::Relaxed);
        127
    };
    // SAFETY: CLONE_VFORK suspends this thread until the child has exec'd or exited,
    // so nothing else uses the shared memory meanwhile; the child only makes
    // async-signal-safe system calls on data prepared above, within its own stack.
    let pid = unsafe {
        clone(
            Box::new(child),
            stack,
            CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
            Some(Signal::SIGCHLD as i32),
        )
    }
    .map_err(io::Error::from)?;
    match failure.load(Ordering::Relaxed) {
        0 => Ok(pid),
        errno => {
            let _ = waitpid(pid, None);
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child's side, before exec.
fn setup(
    parent: Pid,
    tty: Option<i32>,
    watchdog: &Announcer,
    start_before: Option<Moment>,
) -> nix::Result<()> {
    setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // lockrun may have died before the death signal was armed.
    if getppid() != parent {
        kill(getpid(), Signal::SIGKILL)?;
    }
    // Guarded from now on, whatever happens to lockrun.
    watchdog.announce(getpid())?;
    // lockrun may have been held up (stopped, starved) since it last checked
    // the lease: a command must not start past the moment it is to be stopped.
    if let Some(at) = start_before
        && Moment::try_now()? >= at
    {
        return Err(nix::errno::Errno::ETIMEDOUT);
    }
    // After the checks, so that a child that does not exec leaves the terminal as it was.
    if let Some(fd) = tty {
        terminal::claim_foreground(fd)?;
    }
    // Rust ignores SIGPIPE; exec keeps ignored signals ignored, the command must not inherit that.
    // SAFETY: the default disposition has no handler; this child's handler table is its own copy.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }?;
    signals::unblock_all()
}
