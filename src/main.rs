//! The entry point: the C runtime's `main`, not std's (`no_main`). std's
//! start-up reads /proc/self/maps and maps a signal stack to report stack
//! overflows, a seventh of a short run's time (BENCHMARKS.md "Start-up");
//! `lockrun::main` does the part of it that lockrun needs.

#![no_main]

// SAFETY: the one `main` symbol of the executable; nothing else defines it.
#[unsafe(no_mangle)]
extern "C" fn main() -> std::ffi::c_int {
    lockrun::main()
}
