//! A guard for the one end lockrun cannot handle itself: its own SIGKILL.
//! `PR_SET_PDEATHSIG` reaches only the command's first process (and not one
//! that executed a set-uid program), so a watchdog process waits on a pipe that
//! only lockrun can write; when the pipe closes without a word, lockrun died and
//! the watchdog kills the command's whole process group. It keeps lockrun's open
//! files, so a file lock stays held until the group has been killed.
//!
//! The watchdog is started with clone(2) sharing lockrun's memory (`CLONE_VM`)
//! rather than with `fork()`: it only makes system calls, so copying lockrun's
//! page tables (and the copy-on-write faults after) was pure cost, about 0.2 ms
//! and 40 page faults per run (BENCHMARKS.md). It therefore runs on a stack of
//! its own, reads only orders set aside for it, which lockrun frees only once it
//! has seen the watchdog exit, and calls the kernel directly. Its descriptor
//! table is still its own copy, and its signal mask is lockrun's (the forwarded
//! signals blocked), so its read of the pipe is not interrupted.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::unistd::{Pid, pipe2, write};

use crate::error::{Error, Result};

/// Large enough that the allocator maps it fresh, so only the pages used are touched.
const STACK: usize = 256 * 1024;

/// What the watchdog works from, in lockrun's memory.
struct Orders {
    wait_end: RawFd,
    dismiss: RawFd,
    group: libc::pid_t,
}

/// The watchdog's stack and orders are never freed: lockrun does not wait for it
/// to exit (that wait would delay the release for the next holder), so they stay
/// until lockrun itself exits, shortly after, and the kernel reaps the watchdog.
pub struct Watchdog {
    /// Closing it without writing is what tells the watchdog lockrun is gone.
    dismiss: OwnedFd,
}

impl Watchdog {
    /// Starts a watchdog for the process group `group`. lockrun must be single-threaded here.
    pub fn start(group: Pid) -> Result<Self> {
        let failed = |err| Error::internal("starting the watchdog", err);
        let (wait_end, dismiss) = pipe2(OFlag::O_CLOEXEC).map_err(failed)?;
        let orders = Box::into_raw(Box::new(Orders {
            wait_end: wait_end.as_raw_fd(),
            dismiss: dismiss.as_raw_fd(),
            group: group.as_raw(),
        }));
        let stack = Box::into_raw(vec![0u8; STACK].into_boxed_slice());
        // SAFETY: the stack and the orders stay allocated for as long as the watchdog
        // may run (they are freed only if it did not start); it uses nothing else.
        let pid = unsafe {
            let top = stack.cast::<u8>().add(STACK);
            let top = top.sub(top as usize % 16);
            libc::clone(
                guard,
                top.cast(),
                libc::CLONE_VM | libc::SIGCHLD,
                orders.cast(),
            )
        };
        let started = Errno::result(pid);
        // The watchdog has its own copy; lockrun's must go, or the pipe would not close with lockrun.
        drop(wait_end);
        match started {
            Ok(_) => Ok(Self { dismiss }),
            Err(err) => {
                // SAFETY: no watchdog was started, so nothing else uses them.
                unsafe {
                    drop(Box::from_raw(stack));
                    drop(Box::from_raw(orders));
                }
                Err(failed(err))
            }
        }
    }

    /// The command's group is gone: the watchdog exits without killing anything.
    pub fn dismiss(self) {
        let _ = write(&self.dismiss, b"x");
    }
}

/// The watchdog. Only raw system calls: libc's wrappers keep per-thread state,
/// and this process shares lockrun's thread pointer. Their errno is lockrun's
/// too, but none of these calls fails while lockrun still runs.
extern "C" fn guard(orders: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `Watchdog::start` set the orders aside and keeps them until this process exited.
    let orders = unsafe { &*orders.cast::<Orders>() };
    // SAFETY: system calls on plain integers, a C string literal and a buffer on this stack.
    unsafe {
        // Only lockrun may hold the write end, or the pipe would never close when it dies.
        libc::syscall(libc::SYS_close, orders.dismiss);
        // Out of lockrun's process group and session: a signal to that group must not end the guard.
        libc::syscall(libc::SYS_setsid);
        // Let go of lockrun's stdio, so nobody reading its output waits for the watchdog.
        let null = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/dev/null".as_ptr(),
            libc::O_RDWR,
        );
        if null >= 0 {
            for fd in (0..3).filter(|&fd| fd != null) {
                libc::syscall(libc::SYS_dup3, null, fd, 0);
            }
            if null > 2 {
                libc::syscall(libc::SYS_close, null);
            }
        }
        let mut byte = 0u8;
        let dismissed = loop {
            match libc::syscall(libc::SYS_read, orders.wait_end, &raw mut byte, 1) {
                0 => break false,
                n if n > 0 => break true,
                _ if Errno::last() == Errno::EINTR => {}
                _ => break false,
            }
        };
        if !dismissed {
            libc::syscall(libc::SYS_kill, -orders.group, libc::SIGKILL);
        }
        libc::syscall(libc::SYS_exit_group, 0);
    }
    0
}
