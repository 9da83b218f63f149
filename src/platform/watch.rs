//! Being told when files in a directory are closed after writing or touched
//! (inotify), so a waiter can wait for a lock file to be let go without polling.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

pub struct DirWatch {
    inotify: Inotify,
}

impl DirWatch {
    /// Watches the directory `dir` for files closed after writing and files whose attributes changed.
    pub fn closed_or_touched_in(dir: &Path) -> nix::Result<Self> {
        Self::new(
            dir,
            AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_ATTRIB,
        )
    }

    fn new(path: &Path, events: AddWatchFlags) -> nix::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(path, events)?;
        Ok(Self { inotify })
    }

    /// Waits up to `timeout` for changes; returns the names of the files that changed (empty: none).
    pub fn changes(&self, timeout: Duration) -> nix::Result<Vec<OsString>> {
        let names = self.pending()?;
        if !names.is_empty() {
            return Ok(names);
        }
        // Long timeouts do not fit poll(2)'s milliseconds: the caller asks again.
        let timeout =
            PollTimeout::try_from(timeout.min(Duration::from_secs(60))).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => self.pending(),
            Err(err) => Err(err),
        }
    }

    fn pending(&self) -> nix::Result<Vec<OsString>> {
        match self.inotify.read_events() {
            Ok(events) => Ok(events.into_iter().filter_map(|event| event.name).collect()),
            Err(nix::errno::Errno::EAGAIN) => Ok(Vec::new()),
            Err(err) => Err(err),
        }
    }
}
