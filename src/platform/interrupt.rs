//! While lockrun waits, a signal that ends it (a Ctrl-C, a SIGTERM) tidies up
//! first: it erases the waiting line's live line, so that what the shell
//! prints next does not follow it (docs/operating.md: "Who holds a lock"), and
//! it ends and reaps the watchdog that the wait started for the command, which
//! a PID 1 that never reaps (a container) would keep as a zombie.

#![allow(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

use nix::sys::signal::{
    SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, sigaction, sigprocmask,
};

use super::signals::{FORWARDED, is_ignored};
use super::terminal::ERASE_LINE;
use super::watchdog::{self, Watchdog};

/// What a signal that ends lockrun does first: bits of [`ERASE`] and [`END_WATCHDOG`].
static TIDY: AtomicU8 = AtomicU8::new(0);
const ERASE: u8 = 1;
const END_WATCHDOG: u8 = 2;

/// Makes each forwarded signal that lockrun does not ignore erase stderr's
/// current line before it ends lockrun, as it would have anyway.
pub fn erase_line_first() {
    want(ERASE, true);
}

/// The line is gone: nothing to erase any more.
pub fn leave_the_line() {
    want(ERASE, false);
}

/// Starts the command's watchdog while lockrun waits: from then on, until
/// [`supervising`], a signal that ends lockrun ends and reaps it first. The
/// signals wait while it starts, so that none finds it started but not known.
pub fn start_watchdog() -> io::Result<Watchdog> {
    let mut signals = SigSet::empty();
    for signal in FORWARDED {
        signals.add(signal);
    }
    let mut before = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut before))?;
    let started = Watchdog::start();
    if let Ok(watchdog) = &started {
        watchdog.end_on_signal(true);
        want(END_WATCHDOG, true);
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    started
}

/// lockrun reads its signals itself from now on (they are blocked): it ends
/// `watchdog` itself too.
pub fn supervising(watchdog: &Watchdog) {
    watchdog.end_on_signal(false);
    want(END_WATCHDOG, false);
}

/// Turns `what` on or off: the handler is in place while anything is on, and
/// the default actions are back once nothing is.
fn want(what: u8, on: bool) {
    let before = if on {
        TIDY.fetch_or(what, Ordering::SeqCst)
    } else {
        TIDY.fetch_and(!what, Ordering::SeqCst)
    };
    let after = TIDY.load(Ordering::SeqCst);
    let action = match (before, after) {
        (0, 1..) => SigAction::new(
            SigHandler::Handler(tidy_and_end),
            SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
            SigSet::empty(),
        ),
        (1.., 0) => SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty()),
        _ => return,
    };
    for signal in FORWARDED.into_iter().filter(|signal| !is_ignored(*signal)) {
        // SAFETY: the handler makes only async-signal-safe calls; the default
        // action runs no code of ours.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

extern "C" fn tidy_and_end(signal: i32) {
    let tidy = TIDY.load(Ordering::SeqCst);
    if tidy & ERASE != 0 {
        // SAFETY: write(2) is async-signal-safe.
        unsafe { nix::libc::write(2, ERASE_LINE.as_ptr().cast(), ERASE_LINE.len()) };
    }
    // A no-op unless a wait's watchdog is marked.
    watchdog::end_on_a_signal();
    // SAFETY: raise(3) is async-signal-safe. SA_RESETHAND put the default
    // action back on entry, and the signal stays blocked until the handler
    // returns: then the raised one ends lockrun as the first would have.
    unsafe { nix::libc::raise(signal) };
}
