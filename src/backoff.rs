//! Jittered exponential backoff (README: "Usage"): the n-th wait is
//! `min(delay_n * U(0.5, 1.5), max_delay)`, `delay_{n+1} = min(delay_n * multiplier, max_delay)`.

use std::time::Duration;

use rand::{Rng, RngExt};

#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub initial_delay: Duration,
    pub max_delay: Duration,
    pub multiplier: f64,
}

/// The shortest wait: an `--initial-delay` of 0 retries often, but does not spin.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// The delays of one wait, in order.
#[derive(Debug)]
pub struct Backoff {
    policy: Policy,
    delay: Duration,
}

impl Backoff {
    pub fn new(policy: Policy) -> Self {
        Self {
            delay: policy.initial_delay.min(policy.max_delay),
            policy,
        }
    }

    /// `delay × factor`, capped at the maximum delay (also when it overflows).
    fn scaled(&self, factor: f64) -> Duration {
        Duration::try_from_secs_f64(self.delay.as_secs_f64() * factor)
            .map_or(self.policy.max_delay, |scaled| {
                scaled.min(self.policy.max_delay)
            })
    }

    /// The next wait, never longer than `left` (the time to the `--timeout` deadline).
    pub fn next_wait(&mut self, left: Option<Duration>) -> Duration {
        // Seeded only here, on the first wait: an uncontended run never pays for it.
        self.next_wait_with(&mut rand::rng(), left)
    }

    fn next_wait_with(&mut self, rng: &mut impl Rng, left: Option<Duration>) -> Duration {
        let jitter = rng.random_range(0.5..1.5);
        let wait = self.scaled(jitter).max(MIN_WAIT);
        self.delay = self.scaled(self.policy.multiplier);
        left.map_or(wait, |left| wait.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const DEFAULTS: Policy = Policy {
        initial_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(30),
        multiplier: 1.5,
    };

    #[test]
    fn waits_follow_the_formula_with_seeded_jitter() {
        let mut backoff = Backoff::new(DEFAULTS);
        let mut rng = StdRng::seed_from_u64(7);
        let mut jitter_rng = StdRng::seed_from_u64(7);
        let mut delay = 1.0_f64;
        for _ in 0..20 {
            let jitter: f64 = jitter_rng.random_range(0.5..1.5);
            let expected = (delay * jitter).min(30.0);
            let wait = backoff.next_wait_with(&mut rng, None).as_secs_f64();
            assert!((wait - expected).abs() < 1e-6, "wait {wait} != {expected}");
            delay = (delay * 1.5).min(30.0);
        }
    }

    #[test]
    fn jitter_stays_within_half_to_one_and_a_half() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            let wait = Backoff::new(DEFAULTS).next_wait_with(&mut rng, None);
            assert!(wait >= Duration::from_millis(500) && wait < Duration::from_millis(1500));
        }
    }

    #[test]
    fn capped_by_max_delay() {
        let mut backoff = Backoff::new(DEFAULTS);
        let mut rng = StdRng::seed_from_u64(3);
        let waits: Vec<_> = (0..40)
            .map(|_| backoff.next_wait_with(&mut rng, None))
            .collect();
        assert!(waits.iter().all(|w| *w <= Duration::from_secs(30)));
        assert!(
            waits[30..].iter().any(|w| *w == Duration::from_secs(30)),
            "late waits reach the cap"
        );
    }

    #[test]
    fn never_sleeps_past_the_deadline() {
        let mut backoff = Backoff::new(DEFAULTS);
        let mut rng = StdRng::seed_from_u64(5);
        let left = Duration::from_millis(120);
        assert_eq!(backoff.next_wait_with(&mut rng, Some(left)), left);
    }

    #[test]
    fn huge_values_cap_instead_of_overflowing() {
        let policy = Policy {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(u64::MAX / 2),
            multiplier: 1e300,
        };
        let mut backoff = Backoff::new(policy);
        let mut rng = StdRng::seed_from_u64(2);
        backoff.next_wait_with(&mut rng, None);
        // The delay is capped at the maximum; the jittered wait is half to all of it.
        let wait = backoff.next_wait_with(&mut rng, None);
        assert!(wait <= policy.max_delay);
        assert!(wait.as_secs_f64() >= policy.max_delay.as_secs_f64() * 0.49);
    }

    #[test]
    fn a_zero_delay_still_waits_a_little() {
        let policy = Policy {
            initial_delay: Duration::ZERO,
            ..DEFAULTS
        };
        let mut rng = StdRng::seed_from_u64(4);
        assert_eq!(
            Backoff::new(policy).next_wait_with(&mut rng, None),
            MIN_WAIT
        );
    }

    #[test]
    fn multiplier_one_keeps_the_delay() {
        let policy = Policy {
            multiplier: 1.0,
            ..DEFAULTS
        };
        let mut backoff = Backoff::new(policy);
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..10 {
            let wait = backoff.next_wait_with(&mut rng, None);
            assert!(wait >= Duration::from_millis(500) && wait < Duration::from_millis(1500));
        }
    }
}
