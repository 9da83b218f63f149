//! A monotonic clock that keeps counting while the machine is suspended or the
//! process is stopped, so lease deadlines hold across a VM freeze (`CLOCK_BOOTTIME`).

use std::ops::{Add, Sub};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(Duration);

impl Moment {
    pub fn now() -> Self {
        // CLOCK_BOOTTIME exists on every Linux this builds for; failure would mean a broken kernel.
        Self::try_now().expect("CLOCK_BOOTTIME is available")
    }

    /// [`Moment::now`] for a process that must not panic (a spawned child before exec).
    pub fn try_now() -> nix::Result<Self> {
        let ts = clock_gettime(ClockId::CLOCK_BOOTTIME)?;
        Ok(Self(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)))
    }

    /// Time since the machine booted (suspended time included).
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// The moment `since_boot` after the machine booted.
    pub fn after_boot(since_boot: Duration) -> Self {
        Self(since_boot)
    }

    /// Time left until `self`, zero when it has passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_sub(Self::now().0)
    }

    pub fn has_passed(self) -> bool {
        Self::now() >= self
    }
}

impl Add<Duration> for Moment {
    type Output = Self;
    fn add(self, rhs: Duration) -> Self {
        Self(self.0.saturating_add(rhs))
    }
}

impl Sub<Duration> for Moment {
    type Output = Self;
    fn sub(self, rhs: Duration) -> Self {
        Self(self.0.saturating_sub(rhs))
    }
}

impl Sub for Moment {
    type Output = Duration;
    fn sub(self, rhs: Self) -> Duration {
        self.0.saturating_sub(rhs.0)
    }
}
