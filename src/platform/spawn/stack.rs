//! The child's stack: a mapping of its own with an inaccessible guard below it,
//! so a child that needed more stack would fault and die instead of writing
//! over lockrun's memory, which it shares.
//!
//! It is never unmapped: lockrun starts one command, and unmapping memory that
//! the child used, perhaps on another processor, has the kernel flush that
//! processor's TLB by an interrupt and wait for it, 0.2-0.5 ms of a 2.5 ms
//! run on a virtual machine whose other processor slept (BENCHMARKS.md: "Less
//! work per run: the user's name, the spawn's stack, the watchdog's title").
//! lockrun's exit takes it down with the rest of its memory.

#![allow(unsafe_code)]

use std::io;
use std::num::NonZeroUsize;

use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, mprotect, munmap};

/// Far more than the child uses (about 1 KiB); only the pages it touches are ever backed.
const SIZE: usize = 256 * 1024;

/// A multiple of every page size Linux has, so it is at least one page everywhere.
const GUARD: usize = 64 * 1024;

/// Maps a new stack, above its guard, for the rest of the process's life.
pub fn map() -> io::Result<&'static mut [u8]> {
    let len = NonZeroUsize::new(GUARD + SIZE).expect("a constant above zero");
    // SAFETY: a new private mapping where the kernel chooses touches no memory in use.
    let base = unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE | MapFlags::MAP_STACK | MapFlags::MAP_NORESERVE,
        )
    }?;
    // SAFETY: the lowest pages of the mapping just made, which nothing uses yet.
    if let Err(err) = unsafe { mprotect(base, GUARD, ProtFlags::PROT_NONE) } {
        // SAFETY: the whole mapping just made, which nothing refers to.
        let _ = unsafe { munmap(base, GUARD + SIZE) };
        return Err(err.into());
    }
    // SAFETY: SIZE readable, writable and zero-filled bytes above the guard, never
    // unmapped, and reachable only through the one slice returned here.
    Ok(unsafe { std::slice::from_raw_parts_mut(base.as_ptr().cast::<u8>().add(GUARD), SIZE) })
}
