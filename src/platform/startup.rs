//! What std's start-up would do and lockrun needs, since lockrun's `main` is
//! the C runtime's (`src/main.rs`): the arguments, standard descriptors that
//! exist, and SIGPIPE ignored. std's report of a stack overflow is left out: lockrun
//! does not recurse, and an overflow still ends it (by SIGSEGV).

#![allow(unsafe_code)]

use std::ffi::{CStr, OsString, c_char, c_int};
use std::os::unix::ffi::OsStringExt;

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{SigHandler, Signal, signal};

/// Prepares the process before anything else runs.
pub fn prepare() {
    open_missing_standard_descriptors();
    // Writes to a closed pipe fail with EPIPE instead of killing lockrun
    // (`lockrun status | head -1`); the command gets SIGPIPE back at its default.
    // SAFETY: installing SIG_IGN runs no code of ours.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// The arguments the C runtime passes to `main`. std collects them itself only
/// when its own start-up runs (or, on glibc alone, from `.init_array`).
///
/// # Safety
///
/// `words` is null or points to `count` pointers to NUL-terminated strings
/// that live at least as long as this call (C's `argc` and `argv`).
pub unsafe fn arguments(count: c_int, words: *const *const c_char) -> Vec<OsString> {
    if words.is_null() {
        return Vec::new();
    }
    (0..usize::try_from(count).unwrap_or(0))
        .map(|index| {
            // SAFETY: as the caller promises, `words[index]` is a NUL-terminated string.
            let arg = unsafe { CStr::from_ptr(*words.add(index)) };
            OsString::from_vec(arg.to_bytes().to_vec())
        })
        .collect()
}

/// A descriptor 0, 1 or 2 that lockrun was started without is opened on
/// /dev/null, so that no lock file or socket becomes "stdout" by chance.
fn open_missing_standard_descriptors() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    loop {
        // SAFETY: `fds` is a local array of three pollfd, and a zero timeout does not block.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
        if ready >= 0 {
            break;
        }
        if Errno::last() != Errno::EINTR {
            // Cannot tell: every descriptor is asked on its own instead.
            for pollfd in &mut fds {
                // SAFETY: F_GETFD reads a descriptor's flags and changes nothing.
                let closed = unsafe { libc::fcntl(pollfd.fd, libc::F_GETFD) } == -1
                    && Errno::last() == Errno::EBADF;
                pollfd.revents = if closed { libc::POLLNVAL } else { 0 };
            }
            break;
        }
    }
    for pollfd in fds {
        if pollfd.revents & libc::POLLNVAL == 0 {
            continue;
        }
        // SAFETY: opens a file with a C string literal; the descriptor is meant to stay open.
        if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } == -1 {
            // As std does: no safe way on without the standard descriptors.
            std::process::abort();
        }
    }
}
