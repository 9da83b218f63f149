//! A guard for the one end lockrun cannot handle itself: its own SIGKILL.
//! `PR_SET_PDEATHSIG` reaches only the command's first process (and not one
//! that executed a set-uid program), so a forked watchdog waits on a pipe that
//! only lockrun can write; when the pipe closes without a word, lockrun died and
//! the watchdog kills the command's whole process group. It keeps lockrun's open
//! files, so a file lock stays held until the group has been killed.
//!
//! It is a fork, not a clone sharing lockrun's memory: the kernel's OOM killer
//! kills every process that shares its victim's memory, and a watchdog must
//! outlive lockrun whatever killed it.

use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::signal::{Signal, killpg};
use nix::sys::stat::Mode;
use nix::unistd::{
    ForkResult, Pid, dup2_stderr, dup2_stdin, dup2_stdout, fork, pipe2, read, setsid, write,
};

use crate::error::{Error, Result};

pub struct Watchdog {
    /// Closing it without writing is what tells the watchdog lockrun is gone.
    dismiss: OwnedFd,
}

impl Watchdog {
    /// Starts a watchdog for the process group `group`. lockrun must be single-threaded here.
    pub fn start(group: Pid) -> Result<Self> {
        let failed = |err| Error::internal("starting the watchdog", err);
        let (wait_end, dismiss) = pipe2(OFlag::O_CLOEXEC).map_err(failed)?;
        // SAFETY: lockrun has one thread at this point, so the child may run any code;
        // it still makes only system calls, and ends with _exit.
        match unsafe { fork() }.map_err(failed)? {
            ForkResult::Child => {
                drop(dismiss);
                guard(&wait_end, group)
            }
            ForkResult::Parent { .. } => Ok(Self { dismiss }),
        }
    }

    /// The command's group is gone: the watchdog exits without killing anything.
    /// lockrun does not wait for it (that would delay the release for the next
    /// holder); the kernel reaps it when lockrun exits, moments later.
    pub fn dismiss(self) {
        let _ = write(&self.dismiss, b"x");
    }
}

fn guard(wait_end: &OwnedFd, group: Pid) -> ! {
    // Out of lockrun's process group and session: a signal to that group must not end the guard.
    let _ = setsid();
    // Let go of lockrun's stdio, so nobody reading its output waits for the watchdog.
    if let Ok(null) = open(c"/dev/null", OFlag::O_RDWR, Mode::empty()) {
        let _ = (dup2_stdin(&null), dup2_stdout(&null), dup2_stderr(&null));
    }
    let mut byte = [0u8; 1];
    let dismissed = loop {
        match read(wait_end, &mut byte) {
            Ok(0) => break false,
            Ok(_) => break true,
            Err(Errno::EINTR) => {}
            Err(_) => break false,
        }
    };
    if !dismissed {
        let _ = killpg(group, Signal::SIGKILL);
    }
    // SAFETY: ends this forked process without running lockrun's exit handlers.
    unsafe { nix::libc::_exit(0) }
}
