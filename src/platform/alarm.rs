//! SIGALRM at a deadline, to interrupt a blocking system call there (flock(2),
//! a Redis call's reads and writes): the same way flock(1) times out, without a thread. For a call on a socket
//! whose library retries after EINTR (rustls does, in its TLS reads), the
//! alarm can shut the socket down too: then every read ends.

#![allow(unsafe_code)]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::libc;

use nix::sys::signal::{
    SaFlags, SigAction, SigEvent, SigHandler, SigSet, SigevNotify, Signal, sigaction,
};
use nix::sys::timer::{Expiration, Timer, TimerSetTimeFlags};
use nix::time::ClockId;

/// While it exists, SIGALRM has a handler that does nothing but shut down the
/// socket it was given, if any (without `SA_RESTART`, so a blocking call
/// returns EINTR), and repeats every few
/// milliseconds after the deadline, in case the first one landed just before
/// the call began.
pub struct Alarm {
    timer: Timer,
    previous: SigAction,
}

const REPEAT: Duration = Duration::from_millis(5);

/// The socket the ringing alarm shuts down; -1: none.
static SHUT_AT_EXPIRY: AtomicI32 = AtomicI32::new(-1);

impl Alarm {
    pub fn after(delay: Duration) -> nix::Result<Self> {
        extern "C" fn interrupt(_: i32) {
            let socket = SHUT_AT_EXPIRY.load(Ordering::Relaxed);
            if socket >= 0 {
                // SAFETY: shutdown(2) is async-signal-safe, and changes nothing
                // but the socket's state (EBADF or ENOTSOCK for anything else).
                unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            }
        }
        SHUT_AT_EXPIRY.store(-1, Ordering::Relaxed);
        let action = SigAction::new(
            SigHandler::Handler(interrupt),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler makes one shutdown(2) call at most and touches
        // only an atomic, so it is async-signal-safe.
        let previous = unsafe { sigaction(Signal::SIGALRM, &action) }?;
        let armed = Timer::new(
            ClockId::CLOCK_BOOTTIME,
            SigEvent::new(SigevNotify::SigevSignal {
                signal: Signal::SIGALRM,
                si_value: 0,
            }),
        )
        .and_then(|mut timer| {
            timer
                .set(
                    Expiration::IntervalDelayed(delay.into(), REPEAT.into()),
                    TimerSetTimeFlags::empty(),
                )
                .map(|()| timer)
        });
        match armed {
            Ok(timer) => Ok(Self { timer, previous }),
            Err(err) => {
                // SAFETY: restores the disposition that was there before.
                let _ = unsafe { sigaction(Signal::SIGALRM, &previous) };
                Err(err)
            }
        }
    }
}

impl Alarm {
    /// Makes the alarm, when it rings, also shut `socket` down (none: forget one given before).
    pub fn shut_down_when_ringing(&self, socket: Option<RawFd>) {
        SHUT_AT_EXPIRY.store(socket.unwrap_or(-1), Ordering::Relaxed);
    }
}

/// The descriptor the next socket or file opened will get: the lowest free one.
pub fn next_descriptor() -> Option<RawFd> {
    // SAFETY: F_DUPFD on descriptor 0 (start-up made sure it is open) makes a
    // new descriptor, the lowest free one, which is closed at once: nothing
    // else refers to it.
    unsafe {
        let next = libc::fcntl(0, libc::F_DUPFD, 0);
        if next < 0 {
            return None;
        }
        libc::close(next);
        Some(next)
    }
}

/// The port of the peer `socket` is connected to, if it is a connected TCP socket.
pub fn peer_port(socket: RawFd) -> Option<u16> {
    // SAFETY: an all-zero sockaddr_storage is a valid value of it.
    let mut address: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getpeername writes at most `length` bytes to `address`, which has them.
    let found = unsafe {
        libc::getpeername(
            socket,
            std::ptr::from_mut(&mut address).cast(),
            &raw mut length,
        )
    };
    if found != 0 {
        return None;
    }
    match i32::from(address.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in, which fits in the storage.
            let inet = unsafe { &*std::ptr::from_ref(&address).cast::<libc::sockaddr_in>() };
            Some(u16::from_be(inet.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6, which fits in the storage.
            let inet = unsafe { &*std::ptr::from_ref(&address).cast::<libc::sockaddr_in6>() };
            Some(u16::from_be(inet.sin6_port))
        }
        _ => None,
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        SHUT_AT_EXPIRY.store(-1, Ordering::Relaxed);
        // Disarm before restoring: a SIGALRM generated until then has already been delivered here.
        let _ = self.timer.set(
            Expiration::OneShot(Duration::ZERO.into()),
            TimerSetTimeFlags::empty(),
        );
        // SAFETY: restores the disposition that was there before.
        let _ = unsafe { sigaction(Signal::SIGALRM, &self.previous) };
    }
}
