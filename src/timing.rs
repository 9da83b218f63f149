//! The lease's timing plan: every fraction of `--ttl` that lockrun acts on,
//! and how long one call to a lock server may take (README: "When the server has trouble").
//!
//! A holder renews every TTL/3 and gives its command SIGTERM a kill grace
//! before the lease's end; a waiter keeps its place alive every TTL/3. A call
//! made for a held lease must come back well inside a renewal interval; a call
//! made by a run that holds nothing is bounded without reference to the TTL,
//! since a server's restart or an etcd election takes seconds whatever the TTL.

use std::time::Duration;

/// How long a call to a lock server may take when nothing held depends on it
/// (a waiter's look, `status`, `release`): long enough to outlast an etcd
/// election or a PostgreSQL restart's first moments, short enough that a
/// silent server is retried (or reported) within seconds.
pub const FREE_CALL: Duration = Duration::from_secs(5);
/// The least any call may take: etcd's authentication checks a bcrypt hash.
const MIN_CALL: Duration = Duration::from_millis(500);
/// The kill grace when `--kill-grace` is not given.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// The timing of one lease of length `ttl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    ttl: Duration,
}

impl Plan {
    pub const fn new(ttl: Duration) -> Self {
        Self { ttl }
    }

    /// The lease's length as asked for (`--ttl`).
    pub fn ttl(self) -> Duration {
        self.ttl
    }

    /// How often a held lease is renewed, and how far before its grant a
    /// lease's clock may be taken to start when the grant's time is unknown.
    pub fn renew_every(self) -> Duration {
        self.ttl / 3
    }

    /// How soon a renewal that failed is tried again: well before the command's stop.
    pub fn renewal_retry(self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// How often a waiter refreshes its place in line, lest it lapse with the TTL.
    pub fn keep_place_every(self) -> Duration {
        self.ttl / 3
    }

    /// A lease with less than this left before its command's stop is renewed
    /// before anything runs under it.
    pub fn confirm_margin(self) -> Duration {
        self.ttl / 6
    }

    /// How long after its last refresh a waiter's place lease is refreshed
    /// at its next look; when told that a slot is its own, taking the slot
    /// comes first and the refresh waits longer.
    pub fn refresh_place_after(self, taking: bool) -> Duration {
        if taking { self.ttl / 2 } else { self.ttl / 6 }
    }

    /// The grace between SIGTERM and SIGKILL: `--kill-grace` (10 s unless
    /// given), and on a lease at most a third of it, so that the command is
    /// gone before the lease could pass to another holder.
    pub fn kill_grace(self, asked: Option<Duration>, leases: bool) -> Duration {
        let grace = asked.unwrap_or(DEFAULT_KILL_GRACE);
        if leases {
            grace.min(self.ttl / 3)
        } else {
            grace
        }
    }

    /// How long one call made for a held lease (a renewal, a release, a
    /// take) may take: a fifth of the TTL, well inside a renewal interval,
    /// at least [`MIN_CALL`] and at most [`FREE_CALL`]. A renewal is also
    /// bounded by the command's stop.
    pub fn holder_call(self) -> Duration {
        (self.ttl / 5).clamp(MIN_CALL, FREE_CALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_of_a_thirty_second_lease() {
        let plan = Plan::new(Duration::from_secs(30));
        assert_eq!(plan.renew_every(), Duration::from_secs(10));
        assert_eq!(plan.keep_place_every(), Duration::from_secs(10));
        assert_eq!(plan.confirm_margin(), Duration::from_secs(5));
        assert_eq!(plan.refresh_place_after(true), Duration::from_secs(15));
        assert_eq!(plan.renewal_retry(), Duration::from_secs(1));
        assert_eq!(plan.kill_grace(None, true), Duration::from_secs(10));
        assert_eq!(plan.holder_call(), FREE_CALL);
    }

    #[test]
    fn a_short_lease_shortens_the_grace_but_not_below_a_call_floor() {
        let plan = Plan::new(Duration::from_secs(2));
        assert_eq!(plan.kill_grace(None, true), Duration::from_secs(2) / 3);
        assert_eq!(plan.kill_grace(None, false), DEFAULT_KILL_GRACE);
        assert_eq!(plan.holder_call(), MIN_CALL);
        assert_eq!(plan.renewal_retry(), Duration::from_millis(200));
    }
}
