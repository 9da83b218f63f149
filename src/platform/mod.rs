//! Everything that only Linux has, and every `unsafe` block of lockrun: the
//! process's start-up, starting the command (`clone`), signals (signalfd, `sigaction`), the parent-death
//! signal and the watchdog's fork (`prctl`), POSIX timers, the terminal's ioctls,
//! `CLOCK_BOOTTIME`, a process's end (pidfd) and what `/proc` says about processes and file locks. The
//! rest of the crate is plain safe Rust and asks this module. `unsafe` is
//! allowed file by file, in the files that need it, each block with its
//! `SAFETY:` reason (clippy's `undocumented_unsafe_blocks` is denied).

#[cfg(not(target_os = "linux"))]
compile_error!(
    "lockrun needs Linux: it relies on signalfd, clone(2), prctl(2), CLOCK_BOOTTIME and /proc"
);

pub mod alarm;
pub mod clock;
pub mod doorbell;
pub mod interrupt;
pub mod pidfd;
pub mod proc;
pub mod signals;
pub mod spawn;
pub mod startup;
pub mod terminal;
pub mod watch;
pub mod watchdog;

use std::io;

/// A system call's failure as an I/O error that says what lockrun was doing;
/// callers decide what it means for the run (README: "Exit status").
fn failed(doing: &'static str) -> impl Fn(nix::Error) -> io::Error + Copy {
    move |err| io::Error::new(io::Error::from(err).kind(), format!("{doing}: {err}"))
}
