//! Signals while the command runs: blocked in lockrun and read from a signalfd,
//! so one loop sees signals, the child's state changes and its own timers.

#![allow(unsafe_code)]

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::AsFd;
use std::time::Duration;

use std::io;

use super::failed;

/// Signals that reach the command (docs/guide.md: "What the command gets").
pub const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Undoes what a parent may have left that would break supervision: forwarded
/// signals blocked (lockrun could not be stopped while it waits), SIGALRM
/// blocked (a timed file-lock wait would never end) and SIGCHLD
/// ignored (the kernel would reap the command and lose its status). Signals the
/// parent ignored stay ignored, as they would for a command run directly.
pub fn reset_inherited() -> io::Result<()> {
    let mut used = SigSet::empty();
    for signal in FORWARDED {
        used.add(signal);
    }
    // The file backend's timed wait is interrupted by SIGALRM.
    used.add(Signal::SIGALRM);
    sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&used), None)
        .map_err(failed("unblocking signals"))?;
    // SAFETY: installing the default disposition runs no code of ours.
    unsafe { nix::sys::signal::signal(Signal::SIGCHLD, SigHandler::SigDfl) }
        .map_err(failed("resetting SIGCHLD"))?;
    Ok(())
}

pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks, in this (the only) thread, the forwarded signals that are not
    /// ignored, SIGTSTP (passed on so the command stops first) and SIGCHLD, and
    /// opens a signalfd for them. SIGTTOU is blocked too, so lockrun can hand
    /// the terminal to the command and take it back from the background.
    pub fn block() -> io::Result<Self> {
        let mut read = SigSet::empty();
        for signal in FORWARDED.into_iter().filter(|signal| !is_ignored(*signal)) {
            read.add(signal);
        }
        read.add(Signal::SIGTSTP);
        read.add(Signal::SIGCHLD);
        let mut blocked = read;
        blocked.add(Signal::SIGTTOU);
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None)
            .map_err(failed("blocking signals"))?;
        let fd = SignalFd::with_flags(&read, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(failed("opening a signalfd"))?;
        Ok(Self { fd })
    }

    /// Waits up to `timeout` for a signal; `None` when none came.
    pub fn next(&self, timeout: Duration) -> io::Result<Option<Signal>> {
        if let Some(signal) = self.pending()? {
            return Ok(Some(signal));
        }
        // Poll in slices of at most a minute: long timeouts do not fit poll(2)'s milliseconds.
        let timeout = PollTimeout::try_from(timeout.min(Duration::from_secs(60)))
            .unwrap_or(PollTimeout::NONE);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => self.pending(),
            Err(err) => Err(failed("waiting for signals")(err)),
        }
    }

    fn pending(&self) -> io::Result<Option<Signal>> {
        match self.fd.read_signal() {
            Ok(Some(info)) => Ok(Signal::try_from(info.ssi_signo.cast_signed()).ok()),
            Ok(None) => Ok(None),
            Err(err) => Err(failed("reading a signal")(err)),
        }
    }
}

/// Unblocks every signal: for the command, between clone and exec (async-signal-safe).
pub fn unblock_all() -> nix::Result<()> {
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

/// True when the signal's disposition is "ignore" (inherited from the parent).
pub fn is_ignored(signal: Signal) -> bool {
    let mut current = std::mem::MaybeUninit::<nix::libc::sigaction>::uninit();
    // SAFETY: a null new action only reads the current one into `current`.
    let read =
        unsafe { nix::libc::sigaction(signal as i32, std::ptr::null(), current.as_mut_ptr()) };
    // SAFETY: sigaction filled `current` when it returned 0.
    read == 0 && unsafe { current.assume_init() }.sa_sigaction == nix::libc::SIG_IGN
}
