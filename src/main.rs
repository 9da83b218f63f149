//! The entry point: the C runtime's `main`, not std's (`no_main`). std's
//! start-up reads /proc/self/maps and maps a signal stack to report stack
//! overflows, a seventh of a short run's time (BENCHMARKS.md "Start-up");
//! `lockrun::main` does the part of it that lockrun needs.

#![no_main]
#![deny(unsafe_code)]

/// The one `main` symbol of the executable, which the C runtime calls.
// `no_mangle` is unsafe only in that two items could claim one symbol; this is the only one.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main() -> std::ffi::c_int {
    lockrun::main()
}
