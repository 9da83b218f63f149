//! The moment a call must be over by, on the boot clock (it keeps counting
//! while lockrun is stopped or the machine suspended, as leases do).

use std::time::Duration;

use crate::platform::clock::Moment;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[must_use]
pub struct Deadline(Moment);

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self(Moment::now() + budget)
    }

    pub fn at(moment: Moment) -> Self {
        Self(moment)
    }

    pub fn moment(self) -> Moment {
        self.0
    }

    pub fn remaining(self) -> Duration {
        self.0.remaining()
    }

    pub fn has_passed(self) -> bool {
        self.0.has_passed()
    }

    /// The time left as a socket timeout, which must not be zero (that means none).
    pub fn io_timeout(self) -> Duration {
        self.remaining().max(Duration::from_millis(1))
    }

    /// The earlier of this deadline and `budget` from now.
    pub fn within(self, budget: Duration) -> Self {
        self.min(Self::after(budget))
    }

    /// One of `shares` equal parts of the time left, from now: for one
    /// attempt of several that must all fit before this deadline.
    pub fn share(self, shares: u32) -> Self {
        Self::after(self.remaining() / shares.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_deadline_still_gives_sockets_a_timeout() {
        let passed = Deadline::after(Duration::ZERO);
        assert!(passed.has_passed());
        assert_eq!(passed.io_timeout(), Duration::from_millis(1));
    }

    #[test]
    fn shares_and_budgets_never_reach_past_the_deadline() {
        let deadline = Deadline::after(Duration::from_secs(4));
        assert!(deadline.share(4) <= Deadline::after(Duration::from_secs(1)));
        assert!(deadline.within(Duration::from_secs(60)) == deadline);
        assert!(deadline.within(Duration::from_secs(1)) < deadline);
    }
}
