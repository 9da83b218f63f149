//! Everything that only Linux has, and every `unsafe` block of lockrun: the
//! process's start-up, starting the command (`clone`), signals (signalfd, `sigaction`), the parent-death
//! signal and the watchdog's fork (`prctl`), POSIX timers, the terminal's ioctls,
//! `CLOCK_BOOTTIME` and what `/proc` says about processes and file locks. The
//! rest of the crate is plain safe Rust and asks this module.

#![allow(unsafe_code)]

#[cfg(not(target_os = "linux"))]
compile_error!(
    "lockrun needs Linux: it relies on signalfd, clone(2), prctl(2), CLOCK_BOOTTIME and /proc"
);

pub mod alarm;
pub mod clock;
pub mod doorbell;
pub mod interrupt;
pub mod proc;
pub mod signals;
pub mod spawn;
pub mod startup;
pub mod terminal;
pub mod watch;
pub mod watchdog;
