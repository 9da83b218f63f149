//! The child's stack: a mapping of its own with an inaccessible guard below it,
//! so a child that needed more stack would fault and die instead of writing
//! over lockrun's memory, which it shares.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, mprotect, munmap};

/// Far more than the child uses (about 1 KiB); only the pages it touches are ever backed.
const SIZE: usize = 256 * 1024;

/// A multiple of every page size Linux has, so it is at least one page everywhere.
const GUARD: usize = 64 * 1024;

pub struct Stack {
    /// The start of the mapping: the guard, then the stack.
    base: NonNull<c_void>,
}

impl Stack {
    pub fn new() -> io::Result<Self> {
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
        // Made before the guard, so a failure below unmaps it.
        let stack = Self { base };
        // SAFETY: the lowest pages of the mapping just made, which nothing uses yet.
        unsafe { mprotect(base, GUARD, ProtFlags::PROT_NONE) }?;
        Ok(stack)
    }

    /// The usable part, above the guard.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: SIZE readable, writable and zero-filled bytes above the guard, mapped
        // until `self` is dropped and reachable only through this borrow of it.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().cast::<u8>().add(GUARD), SIZE) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`, no slice of which outlives `self`; the
        // child ran on it only inside clone(CLONE_VFORK), which has returned by now.
        let _ = unsafe { munmap(self.base, GUARD + SIZE) };
    }
}
