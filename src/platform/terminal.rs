//! Sharing the controlling terminal with the command, as a shell does: while
//! lockrun has the terminal's foreground, the command's process group gets it,
//! so a Ctrl-C reaches the command once (from the kernel) and it can read it.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

/// Erases the current terminal line: back to column 0, clear to its end.
pub const ERASE_LINE: &str = "\r\x1b[K";

pub struct Terminal {
    tty: File,
}

impl Terminal {
    /// lockrun's controlling terminal, if it has one.
    pub fn open() -> Option<Self> {
        let tty = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits())
            .open("/dev/tty")
            .ok()?;
        Some(Self { tty })
    }

    /// True when `pgrp` is the terminal's foreground process group.
    pub fn foreground_is(&self, pgrp: Pid) -> bool {
        tcgetpgrp(self.tty.as_fd()).is_ok_and(|foreground| foreground == pgrp)
    }

    /// True when lockrun's own process group has the terminal's foreground.
    pub fn is_ours(&self) -> bool {
        self.foreground_is(getpgrp())
    }

    pub fn raw_fd(&self) -> i32 {
        self.tty.as_raw_fd()
    }

    /// Makes `pgrp` the foreground group; SIGTTOU is blocked, so this works from the background.
    pub fn give_to(&self, pgrp: Pid) {
        let _ = tcsetpgrp(self.tty.as_fd(), pgrp);
    }

    /// Takes the foreground back from the command's group, if it has it (never
    /// from the shell when lockrun runs in the background), and continues any
    /// process of lockrun's group (a pager in the same pipeline) that a terminal
    /// read stopped meanwhile.
    pub fn take_back_from(&self, command: Pid) {
        if self.foreground_is(command) {
            self.take_back();
        }
    }

    /// Takes the foreground back for lockrun's group, which had it when the
    /// command was started (a command that failed to execute may have taken it).
    pub fn take_back(&self) {
        self.give_to(getpgrp());
        let _ = killpg(getpgrp(), Signal::SIGCONT);
    }
}

/// For the command between clone and exec: take the foreground of the terminal at `fd`.
pub fn claim_foreground(fd: i32) -> nix::Result<()> {
    // SAFETY: the fd is lockrun's open terminal, shared with the child and valid until exec.
    let tty = unsafe { BorrowedFd::borrow_raw(fd) };
    tcsetpgrp(tty, nix::unistd::getpid())
}

/// The width in columns of the terminal at `fd`, if it is one.
pub fn width(fd: &impl AsRawFd) -> Option<usize> {
    nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::libc::winsize);
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own.
    let result = unsafe { window_size(fd.as_raw_fd(), &raw mut size) };
    result
        .ok()
        .filter(|_| size.ws_col > 0)
        .map(|_| usize::from(size.ws_col))
}
