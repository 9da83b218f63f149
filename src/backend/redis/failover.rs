//! Writes that a failover must not lose (docs/backends/redis.md: "Redis as deployed"): a
//! release or a leave that the old primary took after a replica was promoted
//! is lost with the old primary's demotion, and the new one would keep the
//! slot or place of a run that has gone for a TTL. Such a write waits for
//! the replicas (`WAIT`) and, when too few acknowledged it, is made again
//! where the Sentinels name the primary now.

use std::cell::RefCell;
use std::time::Duration;

use redis::{FromRedisValue, ScriptInvocation};

use super::link::{RedisLink, Route, pause};
use super::replicas::Replicas;
use crate::backend::net::{Deadline, Failure, Kind};

/// Runs `invocation`, a write that is safe to make again, on the primary of
/// `route` within `timeout`: with `replicas`, made good through a failover
/// (see [`made_good`]); without, once.
pub fn write<T: FromRedisValue>(
    link: &RefCell<RedisLink>,
    replicas: Option<Replicas>,
    route: Route<'_>,
    what: &str,
    timeout: Duration,
    invocation: &ScriptInvocation<'_>,
) -> Result<T, Failure> {
    match replicas {
        Some(replicas) => made_good(link, replicas, route, what, timeout, invocation),
        None => link
            .borrow_mut()
            .call(route, what, timeout, |c| invocation.invoke(c)),
    }
}

/// Runs `invocation`, a write that is safe to make again, on the primary of
/// `route` within `timeout`, followed by `WAIT` for `replicas` (on a Sentinel
/// deployment, for every replica the primary had when found, as a planned
/// failover's promoted replica leaves the old primary without it). When too
/// few acknowledged it, asks the Sentinels again: a primary they no longer
/// name has the write made again on the one they name; the one they still
/// name has it made again until enough acknowledge it or `timeout` passes;
/// one that failed with trouble that may pass is made again meanwhile too.
/// The first answer: what the write found where it was made first.
fn made_good<T: FromRedisValue>(
    link: &RefCell<RedisLink>,
    replicas: Replicas,
    route: Route<'_>,
    what: &str,
    timeout: Duration,
    invocation: &ScriptInvocation<'_>,
) -> Result<T, Failure> {
    let deadline = Deadline::after(timeout);
    let mut first: Option<T> = None;
    let mut moved = false;
    // Never fewer than any primary had: one being demoted lost the promoted replica.
    let mut wanted = replicas;
    loop {
        let at = match link.borrow_mut().sentinel_primary(deadline) {
            Ok(Some((address, seen))) => {
                wanted = wanted.at_least(seen);
                Some(address)
            }
            Ok(None) => None,
            // The call below follows the Sentinels for as long as the time allows.
            Err(_) if first.is_none() => None,
            Err(_) => return Ok(first.expect("checked above")),
        };
        let made = link
            .borrow_mut()
            .call(route, what, deadline.remaining(), |c| {
                wanted.invoke(c, invocation, deadline.remaining())
            });
        let (answer, acknowledged): (T, u32) = match made {
            Ok(made) => made,
            // A server restarting, or a failover the call could not follow in its
            // time: made again while the time allows, as it is safe to.
            Err(failure) if first.is_none() && passes(&failure) && pause(deadline) => continue,
            Err(failure) => return first.ok_or(failure),
        };
        first.get_or_insert(answer);
        let done = at.is_none() || wanted.short(acknowledged).is_none() || {
            link.borrow_mut().forget_primary();
            match link.borrow_mut().sentinel_primary(deadline) {
                Ok(Some((named, _))) if Some(&named) != at.as_ref() => {
                    moved = true;
                    false
                }
                // The failover is behind us: the primary it left has the write.
                Ok(_) if moved => true,
                _ => !pause(deadline),
            }
        };
        if done {
            return Ok(first.take().expect("set above"));
        }
    }
}

/// Whether the failure may pass by itself: the server unreachable or busy.
fn passes(failure: &Failure) -> bool {
    matches!(failure.kind(), Kind::Unreachable | Kind::Transient)
}
