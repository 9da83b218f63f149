//! Starting the command the way `posix_spawn(3)` does: clone(2) with
//! `CLONE_VM | CLONE_VFORK`, so lockrun's address space is shared, not copied,
//! until the child calls exec. `posix_spawn` itself cannot be used: it has no way
//! to arm the parent-death signal. std's `pre_exec` can, but makes std fork,
//! and the page-table copy plus the copy-on-write faults that follow cost
//! about 0.25 ms of a 2 ms `lockrun -- true` (see BENCHMARKS.md).
//!
//! The child shares lockrun's memory while lockrun is suspended, so it only
//! makes system calls on what was prepared beforehand: no allocation, no lock.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;
use nix::sched::{CloneFlags, clone};
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::sys::wait::waitpid;
use nix::unistd::{Pid, getpid, getppid, setpgid};

use super::{signals, terminal};

/// The child's stack: only a few pages of it are ever touched (execvpe's PATH
/// buffer is the largest frame); at this size the allocator maps it lazily.
const CHILD_STACK: usize = 256 * 1024;

/// Everything exec needs, built before the child exists.
pub struct Exec {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Exec {
    /// `argv[0]` is looked up in `PATH` as execvp(3) does; `env` is added to
    /// (and overrides) lockrun's own environment.
    pub fn new(argv: &[&OsStr], env: &[(&str, String)]) -> io::Result<Self> {
        let overridden = |key: &OsStr| env.iter().any(|(k, _)| OsStr::new(k) == key);
        let mut envp: Vec<CString> = std::env::vars_os()
            .filter(|(key, _)| !overridden(key))
            .map(|(key, value)| c_string(&[&key, OsStr::new("="), &value]))
            .collect::<io::Result<_>>()?;
        for (key, value) in env {
            envp.push(c_string(&[
                OsStr::new(key),
                OsStr::new("="),
                OsStr::new(value),
            ])?);
        }
        Ok(Self {
            program: c_string(&[argv[0]])?,
            argv: argv
                .iter()
                .map(|arg| c_string(&[arg]))
                .collect::<io::Result<_>>()?,
            envp,
        })
    }
}

fn c_string(parts: &[&OsStr]) -> io::Result<CString> {
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.as_bytes()).copied().collect();
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain([ptr::null()])
        .collect()
}

/// Starts `exec` in its own process group (taking the terminal's foreground
/// when `tty` is given), with every signal unblocked, SIGPIPE at its default,
/// and SIGKILL as its parent-death signal. Returns once the child has called
/// exec: an exec failure comes back as its error.
pub fn spawn(exec: &Exec, tty: Option<i32>) -> io::Result<Pid> {
    let argv = pointers(&exec.argv);
    let envp = pointers(&exec.envp);
    let parent = getpid();
    // The child reports why it could not exec here: it shares this memory.
    let failure = AtomicI32::new(0);
    let mut stack = vec![0u8; CHILD_STACK];
    let child = || -> isize {
        let errno = setup(parent, tty).map_or_else(
            |errno| errno as i32,
            |()| {
                // SAFETY: NUL-terminated strings and NULL-terminated arrays, alive until exec.
                unsafe { libc::execvpe(exec.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
                nix::errno::Errno::last_raw()
            },
        );
        failure.store(errno, Ordering::Relaxed);
        127
    };
    // SAFETY: CLONE_VFORK suspends this thread until the child has exec'd or exited,
    // so nothing else uses the shared memory meanwhile; the child only makes
    // async-signal-safe system calls on data prepared above, within its own stack.
    let pid = unsafe {
        clone(
            Box::new(child),
            &mut stack,
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
fn setup(parent: Pid, tty: Option<i32>) -> nix::Result<()> {
    setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    if let Some(fd) = tty {
        terminal::claim_foreground(fd)?;
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // lockrun may have died before the death signal was armed.
    if getppid() != parent {
        kill(getpid(), Signal::SIGKILL)?;
    }
    // Rust ignores SIGPIPE; exec keeps ignored signals ignored, the command must not inherit that.
    // SAFETY: the default disposition has no handler; this child's handler table is its own copy.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }?;
    signals::unblock_all()
}
