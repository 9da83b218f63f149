//! While the waiting line's live line is on the terminal, a signal that ends
//! lockrun (a Ctrl-C) erases the line first, so that what the shell prints
//! next does not follow it (docs/operating.md: "Who holds a lock").

#![allow(unsafe_code)]

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};

use super::signals::{FORWARDED, is_ignored};
use super::terminal::ERASE_LINE;

/// Makes each forwarded signal that lockrun does not ignore erase stderr's
/// current line before it ends lockrun, as it would have anyway.
pub fn erase_line_first() {
    let erase = SigAction::new(
        SigHandler::Handler(erase_and_end),
        SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in FORWARDED.into_iter().filter(|signal| !is_ignored(*signal)) {
        // SAFETY: the handler makes only async-signal-safe calls.
        let _ = unsafe { sigaction(signal, &erase) };
    }
}

/// Puts the default actions back (the line is gone).
pub fn leave_the_line() {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for signal in FORWARDED.into_iter().filter(|signal| !is_ignored(*signal)) {
        // SAFETY: the default action runs no code of ours.
        let _ = unsafe { sigaction(signal, &default) };
    }
}

extern "C" fn erase_and_end(signal: i32) {
    // SAFETY: write(2) and raise(3) are async-signal-safe. SA_RESETHAND put the
    // default action back on entry, and the signal stays blocked until the
    // handler returns: then the raised one ends lockrun as the first would have.
    unsafe {
        nix::libc::write(2, ERASE_LINE.as_ptr().cast(), ERASE_LINE.len());
        nix::libc::raise(signal);
    }
}
