//! Sharing the controlling terminal with the command, as a shell does: the
//! command's process group becomes the terminal's foreground group, so a
//! Ctrl-C reaches it once (from the kernel) and it can read the terminal.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

pub struct Terminal {
    tty: File,
}

impl Terminal {
    /// The controlling terminal, when lockrun runs in its foreground.
    pub fn foreground() -> Option<Self> {
        let tty = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits())
            .open("/dev/tty")
            .ok()?;
        let terminal = Self { tty };
        terminal.is_ours().then_some(terminal)
    }

    /// True when lockrun's process group is the terminal's foreground group.
    pub fn is_ours(&self) -> bool {
        tcgetpgrp(self.tty.as_fd()).is_ok_and(|pgrp| pgrp == getpgrp())
    }

    pub fn raw_fd(&self) -> i32 {
        self.tty.as_raw_fd()
    }

    /// Makes `pgrp` the foreground group; SIGTTOU is blocked, so this works from the background.
    pub fn give_to(&self, pgrp: Pid) {
        let _ = tcsetpgrp(self.tty.as_fd(), pgrp);
    }

    /// Takes the terminal back for lockrun's group, and continues any process of
    /// that group (a pager in the same pipeline) that a terminal read stopped meanwhile.
    pub fn take_back(&self) {
        self.give_to(getpgrp());
        let _ = killpg(getpgrp(), Signal::SIGCONT);
    }
}

/// For the command between fork and exec: take the foreground of the terminal at `fd`.
pub fn claim_foreground(fd: i32) -> nix::Result<()> {
    // SAFETY: the fd is lockrun's open terminal, inherited across fork and valid until exec.
    let tty = unsafe { BorrowedFd::borrow_raw(fd) };
    tcsetpgrp(tty, nix::unistd::getpid())
}
