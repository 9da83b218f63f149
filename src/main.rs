//! The entry point: the C runtime's `main`, not std's (`no_main`), defined by
//! `lockrun::entry_point!` (src/platform/startup.rs says why).

#![no_main]
#![deny(unsafe_code)]

lockrun::entry_point!();
