//! The entry point: the C runtime's `main`, not std's (`no_main`). std's
//! start-up reads /proc/self/maps and maps a signal stack to report stack
//! overflows, 0.09 ms of a 1.7 ms locked `true` (BENCHMARKS.md "Start-up");
//! `lockrun::main` does the part of it that lockrun needs, arguments included.

#![no_main]
#![deny(unsafe_code)]

use std::ffi::{c_char, c_int};

/// The one `main` symbol of the executable, which the C runtime calls.
// `no_mangle` is unsafe only in that two items could claim one symbol; this is the only one.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(count: c_int, words: *const *const c_char) -> c_int {
    // SAFETY: the C runtime passes the arguments exec gave the process (argc
    // and argv): `count` NUL-terminated strings, which live as long as it does.
    let arguments = unsafe { lockrun::platform::startup::arguments(count, words) };
    lockrun::main(arguments)
}
