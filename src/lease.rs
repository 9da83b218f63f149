//! Lease timekeeping (SPEC §4): renew every TTL/3; the lease is ours until the
//! last confirmed renewal + TTL; the command is told to stop `grace` before that.

use std::time::Duration;

use crate::platform::clock::Moment;

#[derive(Debug)]
pub struct Lease {
    ttl: Duration,
    grace: Duration,
    confirmed_until: Moment,
    next_renewal: Moment,
}

impl Lease {
    /// A lease whose acquisition was sent at `sent` (it cannot run longer than from then).
    pub fn new(sent: Moment, ttl: Duration, grace: Duration) -> Self {
        Self {
            ttl,
            grace,
            confirmed_until: sent + ttl,
            next_renewal: sent + ttl / 3,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn renewal_due(&self) -> Moment {
        self.next_renewal
    }

    /// When the command gets SIGTERM if no renewal is confirmed before.
    pub fn stop_at(&self) -> Moment {
        self.confirmed_until - self.grace
    }

    /// When another holder may get the slot: the command must be gone by then.
    pub fn deadline(&self) -> Moment {
        self.confirmed_until
    }

    /// A renewal sent at `sent` was confirmed.
    pub fn renewed(&mut self, sent: Moment) {
        self.confirmed_until = self.confirmed_until.max(sent + self.ttl);
        self.next_renewal = sent + self.ttl / 3;
    }

    /// A renewal could not be confirmed: try again soon, well before the stop.
    pub fn renewal_failed(&mut self, now: Moment) {
        let retry = (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        self.next_renewal = now + retry;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);
    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn renewal_is_due_at_a_third_of_the_ttl() {
        let start = Moment::now();
        let lease = Lease::new(start, TTL, GRACE);
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(10));
        assert_eq!(lease.deadline() - start, TTL);
        assert_eq!(lease.stop_at() - start, Duration::from_secs(20));
    }

    #[test]
    fn a_renewal_extends_from_when_it_was_sent() {
        let start = Moment::now();
        let mut lease = Lease::new(start, TTL, GRACE);
        lease.renewed(start + Duration::from_secs(10));
        assert_eq!(lease.deadline() - start, Duration::from_secs(40));
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(20));
    }

    #[test]
    fn failures_retry_soon_without_moving_the_deadline() {
        let start = Moment::now();
        let mut lease = Lease::new(start, TTL, GRACE);
        lease.renewal_failed(start + Duration::from_secs(10));
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(11));
        assert_eq!(lease.deadline() - start, TTL);
    }
}
