//! What std's start-up would do and lockrun needs, since lockrun's `main` is
//! the C runtime's (`src/main.rs`): the arguments, standard descriptors that
//! exist, and SIGPIPE ignored. std's report of a stack overflow is left out: lockrun
//! does not recurse, and an overflow still ends it (by SIGSEGV).

#![allow(unsafe_code)]

use std::ffi::{CStr, OsString, c_char, c_int};
use std::ops::Range;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

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

/// Defines the executable's `main`, the C runtime's rather than std's: std's
/// start-up reads /proc/self/maps and maps a signal stack to report stack
/// overflows, 0.09 ms of a 1.7 ms locked `true` (BENCHMARKS.md "Start-up").
/// It hands the arguments to `lockrun::main`, which does the part of std's
/// start-up that lockrun needs. A macro, so that the binary (`src/main.rs`)
/// defines the symbol and its unsafe code is written here.
#[macro_export]
macro_rules! entry_point {
    () => {
        /// The one `main` symbol of the executable, which the C runtime calls.
        // `no_mangle` is unsafe only in that two items could claim one symbol; this is the only one.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        extern "C" fn main(
            count: ::std::ffi::c_int,
            words: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // SAFETY: the C runtime passes the arguments exec gave the process (argc
            // and argv): `count` NUL-terminated strings, which live as long as it does.
            let arguments = unsafe { $crate::platform::startup::arguments(count, words) };
            $crate::main(arguments)
        }
    };
}

/// The process's own argv, as the C runtime passed it, for [`blank_arguments`] and [`retitle`].
static ARGV: AtomicPtr<*mut c_char> = AtomicPtr::new(std::ptr::null_mut());
static ARGC: AtomicUsize = AtomicUsize::new(0);

/// The arguments the C runtime passes to `main`. std collects them itself only
/// when its own start-up runs (or, on glibc alone, from `.init_array`).
///
/// # Safety
///
/// `words` is null or points to `count` pointers to NUL-terminated strings
/// that live as long as the process and that nothing else uses (C's `argc`
/// and `argv`, which C lets a program change).
pub unsafe fn arguments(count: c_int, words: *const *const c_char) -> Vec<OsString> {
    if words.is_null() {
        return Vec::new();
    }
    ARGV.store(words.cast_mut().cast(), Ordering::Relaxed);
    ARGC.store(usize::try_from(count).unwrap_or(0), Ordering::Relaxed);
    (0..usize::try_from(count).unwrap_or(0))
        .map(|index| {
            // SAFETY: as the caller promises, `words[index]` is a NUL-terminated string.
            let arg = unsafe { CStr::from_ptr(*words.add(index)) };
            OsString::from_vec(arg.to_bytes().to_vec())
        })
        .collect()
}

/// Overwrites with `*` the bytes of lockrun's own arguments that `secret`
/// finds in each (a password in a URL), where `ps` and /proc/PID/cmdline read
/// them: the kernel shows the argv strings in the process's memory as they
/// are now. Lengths stay, so nothing else moves. The copies taken at start-up
/// are untouched. Nothing happens unless [`arguments`] ran.
pub fn blank_arguments(secret: impl Fn(&[u8]) -> Vec<Range<usize>>) {
    let words = ARGV.load(Ordering::Relaxed);
    if words.is_null() {
        return;
    }
    for index in 1..ARGC.load(Ordering::Relaxed) {
        // SAFETY: `arguments` stored argv and argc as the C runtime passed
        // them: `words[index]` is a NUL-terminated string that lives as long
        // as the process, and nothing else refers to it (the arguments were
        // copied); C lets a program write to its argv strings. Every range is
        // clamped to the string's length, before its NUL.
        unsafe {
            let word = *words.add(index);
            let length = CStr::from_ptr(word).count_bytes();
            let bytes = std::slice::from_raw_parts_mut(word.cast::<u8>(), length);
            for span in secret(bytes) {
                let span = span.start.min(length)..span.end.min(length);
                bytes[span].fill(b'*');
            }
        }
    }
}

/// Writes `title` over the process's command line, where `ps` and
/// /proc/PID/cmdline read it, and zeroes the rest of its arguments' memory
/// (setproctitle's way): for a forked process that is not lockrun (the
/// watchdog). The area is the argv strings the kernel laid end to end from
/// `argv[0]`, as the C runtime passed them, so no /proc read is needed to find
/// it; a title that does not fit is not written. Nothing happens unless
/// [`arguments`] ran.
pub fn retitle(title: &CStr) {
    let words = ARGV.load(Ordering::Relaxed);
    let count = ARGC.load(Ordering::Relaxed);
    if words.is_null() || count == 0 {
        return;
    }
    // SAFETY: `arguments` stored argv and argc as the C runtime passed them:
    // `words[index]` is a NUL-terminated string that lives as long as the
    // process and that nothing reads any more (the arguments were copied at
    // start-up). Only strings that follow each other without a gap are
    // spanned, so the area is exec's own argument memory, writable, from the
    // first string's start to past the last one's NUL.
    unsafe {
        let start = *words;
        let mut end = start;
        for index in 0..count {
            let word = *words.add(index);
            if word != end {
                break;
            }
            end = word.add(CStr::from_ptr(word).count_bytes() + 1);
        }
        let title = title.to_bytes_with_nul();
        let length = end.offset_from(start).unsigned_abs();
        if length < title.len() {
            return;
        }
        let area = std::slice::from_raw_parts_mut(start.cast::<u8>(), length);
        area.fill(0);
        area[..title.len()].copy_from_slice(title);
    }
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
