//! SIGALRM at a deadline, to interrupt a blocking system call (flock(2)) there:
//! the same way flock(1) times out, without a thread.

#![allow(unsafe_code)]

use std::time::Duration;

use nix::sys::signal::{
    SaFlags, SigAction, SigEvent, SigHandler, SigSet, SigevNotify, Signal, sigaction,
};
use nix::sys::timer::{Expiration, Timer, TimerSetTimeFlags};
use nix::time::ClockId;

/// While it exists, SIGALRM has a handler that does nothing (without
/// `SA_RESTART`, so a blocking call returns EINTR) and repeats every few
/// milliseconds after the deadline, in case the first one landed just before
/// the call began.
pub struct Alarm {
    timer: Timer,
    previous: SigAction,
}

const REPEAT: Duration = Duration::from_millis(5);

impl Alarm {
    pub fn after(delay: Duration) -> nix::Result<Self> {
        extern "C" fn interrupt(_: i32) {}
        let action = SigAction::new(
            SigHandler::Handler(interrupt),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
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

impl Drop for Alarm {
    fn drop(&mut self) {
        // Disarm before restoring: a SIGALRM generated until then has already been delivered here.
        let _ = self.timer.set(
            Expiration::OneShot(Duration::ZERO.into()),
            TimerSetTimeFlags::empty(),
        );
        // SAFETY: restores the disposition that was there before.
        let _ = unsafe { sigaction(Signal::SIGALRM, &self.previous) };
    }
}
