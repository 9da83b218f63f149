//! Expiry that trusts no clock (docs/backends/s3.md: "S3 backend"): an entry is gone only
//! once this lockrun has seen its heartbeat counter unchanged for the entry's
//! whole TTL, measured on this host's boot clock. No wall clock, ours or
//! another host's, is compared with anything. What was seen is kept in memory
//! for the run; a lockrun that starts looking only now waits up to one TTL
//! before it may take over from a holder that crashed.

use std::collections::HashMap;
use std::time::Duration;

use super::state::State;
use crate::platform::clock::Moment;

/// The heartbeats seen, by owner token: the counter and when it was first seen at that value.
#[derive(Default)]
pub struct Heartbeats {
    seen: HashMap<String, (u64, Moment)>,
}

impl Heartbeats {
    /// Notes the counters of `state` (a changed one starts a new silence) and
    /// forgets owners no longer there.
    pub fn observe(&mut self, state: &State) {
        let now = Moment::now();
        let mut present = HashMap::with_capacity(self.seen.len());
        for (owner, beat, _) in state.beats() {
            let since = match self.seen.get(&owner.token) {
                Some(&(seen, since)) if seen == beat => since,
                _ => now,
            };
            present.insert(owner.token.clone(), (beat, since));
        }
        self.seen = present;
    }

    /// When the entry of `token` (silent for up to `ttl_ms`) counts as gone,
    /// should its counter not change: a TTL after we first saw its value.
    pub fn ends(&self, token: &str, ttl_ms: u64) -> Moment {
        let since = self
            .seen
            .get(token)
            .map_or_else(Moment::now, |&(_, since)| since);
        since + Duration::from_millis(ttl_ms)
    }

    /// Takes out of `state` the entries, other than `mine`, whose counters
    /// this lockrun saw unchanged for their whole TTL; whether it took any.
    pub fn drop_silent(&self, state: &mut State, mine: &str) -> bool {
        let gone =
            |token: &str, ttl_ms: u64| token != mine && self.ends(token, ttl_ms).has_passed();
        let before = state.holders.len() + state.line.len();
        state
            .holders
            .retain(|holder| !gone(&holder.record.owner.token, holder.ttl_ms));
        state
            .line
            .retain(|waiter| !gone(&waiter.record.owner.token, waiter.ttl_ms));
        before != state.holders.len() + state.line.len()
    }
}
