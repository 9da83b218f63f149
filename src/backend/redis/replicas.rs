//! Replication-aware grants (docs/backends/redis.md: "Redis as deployed", `--redis-replicas`):
//! a script that grants or renews a lease is followed, in the same round
//! trip, by `WAIT N`, and counts only once N replicas acknowledged it.

use std::time::Duration;

use redis::{Connection, FromRedisValue, ScriptInvocation, ServerErrorKind};

use crate::backend::net::{Failure, Kind};
use crate::platform::clock::Moment;

/// The longest `WAIT`: a replica that is there acknowledges in milliseconds.
const MOST: Duration = Duration::from_secs(1);

#[derive(Clone, Copy)]
pub struct Replicas {
    wanted: u32,
}

impl Replicas {
    pub fn new(wanted: u32) -> Self {
        Self { wanted }
    }

    /// At least `count` replicas, and no fewer than these.
    #[must_use]
    pub fn at_least(self, count: u32) -> Self {
        Self {
            wanted: self.wanted.max(count),
        }
    }

    /// Runs `invocation`, then (when replicas are wanted) `WAIT` for them for
    /// at most half the call's `timeout`: the script's answer and how many
    /// replicas acknowledged it.
    pub fn invoke<T: FromRedisValue>(
        self,
        connection: &mut Connection,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> redis::RedisResult<(T, u32)> {
        if self.wanted == 0 {
            return invocation.invoke(connection).map(|answer| (answer, 0));
        }
        let started = Moment::now();
        let pipe = |within: Duration| {
            // WAIT 0 would wait forever.
            let wait = (within / 2).min(MOST).max(Duration::from_millis(1));
            let mut pipe = redis::pipe();
            pipe.invoke_script(invocation)
                .cmd("WAIT")
                .arg(self.wanted)
                .arg(wait.as_millis() as u64);
            pipe
        };
        match pipe(timeout).query(connection) {
            Err(err) if err.kind() == ServerErrorKind::NoScript.into() => {
                // The first WAIT took its time already: the call has one deadline.
                invocation.load(connection)?;
                pipe(timeout.saturating_sub(Moment::now() - started)).query(connection)
            }
            result => result,
        }
    }

    /// Trouble to ride out when fewer replicas than wanted acknowledged.
    pub fn short(self, acknowledged: u32) -> Option<Failure> {
        (acknowledged < self.wanted).then(|| {
            Failure::new(
                Kind::Transient,
                format!(
                    "only {acknowledged} of the {} replicas --redis-replicas asks for acknowledged it",
                    self.wanted
                ),
            )
        })
    }
}
