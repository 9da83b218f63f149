//! Being told when a process of this host ends (a pidfd, Linux 5.3 and
//! later), so a waiter can wait for one ahead of it without polling.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::proc::{Seen, look_up};

/// A process watched for its end.
pub struct ProcessEnd(OwnedFd);

impl ProcessEnd {
    /// Watches `pid` if it is still the process that started at `start_time`
    /// (clock ticks since boot); `None` when it is not, or the kernel has no pidfds.
    pub fn watch(pid: u32, start_time: u64) -> Option<Self> {
        let raw_pid = nix::libc::pid_t::try_from(pid).ok()?;
        // SAFETY: pidfd_open(2) takes a pid and flags, and returns a new
        // descriptor (close-on-exec) that nothing else owns, or -1.
        let raw = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, raw_pid, 0) };
        let raw = RawFd::try_from(raw).ok().filter(|raw| *raw >= 0)?;
        // SAFETY: `raw` was just opened above and is owned by nothing else.
        let process = Self(unsafe { OwnedFd::from_raw_fd(raw) });
        // Opened first, looked at then: the descriptor is of the process seen,
        // not of one that took its pid in between.
        let same = start_time != 0 && look_up(pid) == Seen::Running { start_time };
        same.then_some(process)
    }

    /// Waits up to `within` for the process to end: true once it has.
    pub fn wait(&self, within: Duration) -> bool {
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        // Rounded up, so that a wait that ends quietly has taken all of `within`.
        let timeout =
            PollTimeout::try_from(within + Duration::from_micros(999)).unwrap_or(PollTimeout::MAX);
        matches!(poll(&mut fds, timeout), Ok(1))
    }
}
