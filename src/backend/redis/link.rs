//! The way to the server a call is for, as Redis is deployed (docs/backends/redis.md: "Redis
//! as deployed"): the one server; the primary that the Sentinels name,
//! followed through a failover; or the Cluster node that serves a key,
//! following `MOVED` and `ASK`. Every call runs under one deadline, whatever
//! it takes to find its server; its failure is sorted into the network
//! layer's kinds, in words that never show the password.

use std::thread;
use std::time::Duration;

use redis::{Connection, RedisError};

use super::cluster::Cluster;
use super::node::{Node, interrupted, sort};
use super::sentinel::{Primary, Sentinels};
use super::url::{Deployment, RedisTarget};
use crate::backend::net::probe::{self, Protocol};
use crate::backend::net::{Deadline, Failure, Kind, Secret};
use crate::timing::FREE_CALL;

/// How long a call waits before it asks again where the primary is, while a
/// failover is under way.
const FOLLOW_PAUSE: Duration = Duration::from_millis(100);
/// Calls made again at once (a redirect, a connection the server closed since
/// the last call) before a failure ends the call.
const MAX_AGAIN: u32 = 5;
/// How long asking a server that would not answer what it speaks may take.
const PROBE: Duration = Duration::from_millis(700);
/// What a `rediss://` URL at a plain Redis is told.
const PLAIN_AT_TLS: &str =
    "the server speaks Redis without TLS: use redis:// for it, not rediss://";
/// How long a TLS handshake may go unanswered before lockrun asks whether
/// the server speaks plain Redis.
const TLS_ASK_AFTER: Duration = Duration::from_millis(500);

/// Which server a call goes to.
#[derive(Clone, Copy)]
pub enum Route<'k> {
    /// The primary that serves this key.
    Key(&'k str),
    /// One of [`RedisLink::primaries`].
    Primary(&'k str),
}

enum Way {
    Single(Node),
    Sentinel {
        sentinels: Sentinels,
        primary: Option<Primary>,
    },
    Cluster(Cluster),
}

/// What to do after a call failed.
enum Next {
    /// Call again at once: the failure named the right server, or only closed an old connection.
    Again,
    /// Call again after a pause, once the server has been looked for anew (a failover).
    Follow,
    /// The call has failed.
    Fail,
}

pub struct RedisLink {
    way: Way,
    /// The URL with its password replaced, for messages.
    shown: String,
    /// The password, so that no message built from a server or library error can repeat it.
    secret: Option<Secret>,
}

impl RedisLink {
    /// Reads `url`; connects lazily, on the first call.
    pub fn new(url: &str) -> Result<Self, Failure> {
        let RedisTarget {
            deployment,
            shown,
            secret,
        } = RedisTarget::parse(url)?;
        let way = match deployment {
            Deployment::Single(info) => Way::Single(Node::new(info)),
            Deployment::Sentinel {
                sentinels,
                primary,
                nodes,
            } => Way::Sentinel {
                sentinels: Sentinels::new(sentinels, primary, nodes),
                primary: None,
            },
            Deployment::Cluster { seeds, nodes } => Way::Cluster(Cluster::new(seeds, nodes)),
        };
        Ok(Self { way, shown, secret })
    }

    /// The server as messages show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Whether the primary is found through Sentinel.
    pub fn is_sentinel(&self) -> bool {
        matches!(self.way, Way::Sentinel { .. })
    }

    /// Every primary, for [`Route::Primary`]: a Cluster's addresses, or
    /// outside a Cluster the one primary (an empty address).
    pub fn primaries(&mut self, what: &str) -> Result<Vec<String>, Failure> {
        let Way::Cluster(cluster) = &mut self.way else {
            return Ok(vec![String::new()]);
        };
        match cluster.primaries(Deadline::after(FREE_CALL)) {
            Ok(primaries) => Ok(primaries),
            Err(failure) => Err(self.failure(what, &failure)),
        }
    }

    /// The primary the Sentinels name, as found by the last call (or now,
    /// before `deadline`, when none has found it yet): its address and how
    /// many replicas it had then. `None` outside a Sentinel deployment.
    pub fn sentinel_primary(
        &mut self,
        deadline: Deadline,
    ) -> Result<Option<(String, u32)>, Failure> {
        let Way::Sentinel { sentinels, primary } = &mut self.way else {
            return Ok(None);
        };
        if primary.is_none() {
            *primary = Some(sentinels.primary(deadline)?);
        }
        Ok(primary
            .as_ref()
            .map(|found| (found.address.clone(), found.replicas)))
    }

    /// Makes the next call ask the Sentinels where the primary is: a write
    /// that too few replicas acknowledged may have gone to a primary that a
    /// failover is demoting.
    pub fn forget_primary(&mut self) {
        if let Way::Sentinel { primary, .. } = &mut self.way {
            *primary = None;
        }
    }

    /// Runs `call` on the server of `route` within `timeout`, following a
    /// failover or a redirect while the time allows. Every call lockrun makes
    /// is safe to make twice: a lost reply is made good by asking again.
    pub fn call<T>(
        &mut self,
        route: Route<'_>,
        what: &str,
        timeout: Duration,
        mut call: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        let deadline = Deadline::after(timeout);
        // Connected just now, the first call's connection is no old one.
        let mut fresh = match self.plain_server_at_a_tls_url(deadline) {
            Ok(connected) => connected,
            Err(verdict) => return Err(self.failure(what, &verdict)),
        };
        let mut again = 0;
        loop {
            let (node, asking) = match self.node(route, deadline) {
                Ok(found) => found,
                Err(failure) if failure.is_transient() && pause(deadline) => continue,
                Err(failure) => return Err(self.failure(what, &failure)),
            };
            let reused = node.is_connected() && !std::mem::take(&mut fresh);
            let err = match node.call(deadline, |c| asked(c, asking, &mut call)) {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            match self.next(&err, reused) {
                Next::Again if again < MAX_AGAIN => again += 1,
                Next::Follow if pause(deadline) => {}
                _ if !reused => return Err(self.first_contact_error(what, &err)),
                _ => return Err(self.error(what, &err)),
            }
        }
    }

    /// A TLS handshake that a single server leaves unanswered for a moment
    /// may be with a server that speaks plain Redis and waits for the end of
    /// a line: asked, it says so (docs/guide.md: "When the server has trouble"). A
    /// TLS server that is only slow gets the rest of the time on the next try.
    /// `Ok(true)` when it connected. It costs a `rediss://` run's first
    /// connection one round trip.
    fn plain_server_at_a_tls_url(&mut self, deadline: Deadline) -> Result<bool, Failure> {
        let Way::Single(node) = &mut self.way else {
            return Ok(false);
        };
        if node.is_connected() || !node.tcp_address().is_some_and(|(_, _, tls)| tls) {
            return Ok(false);
        }
        // The handshake comes with the first exchange: a PING, under a short timeout.
        let ping = |c: &mut Connection| redis::cmd("PING").query::<redis::Value>(c);
        let Err(err) = node.call(deadline.within(TLS_ASK_AFTER), ping) else {
            return Ok(true);
        };
        let plain = node.tcp_address().is_some_and(|(host, port, _)| {
            err.is_timeout() && probe::identify(host, port, &[Protocol::Redis], deadline).is_some()
        });
        if plain {
            return Err(Failure::new(Kind::Permanent, PLAIN_AT_TLS));
        }
        Ok(false)
    }

    /// The error of a call on a fresh connection. A single server that closed
    /// it or kept silent may be of another kind, which waiting will not change
    /// (docs/guide.md: "When the server has trouble"): asked what it speaks, a
    /// PostgreSQL or HTTP server (etcd's), or a plain Redis at a TLS URL,
    /// makes it a verdict.
    fn first_contact_error(&self, what: &str, err: &RedisError) -> Failure {
        let failure = self.error(what, err);
        let Way::Single(node) = &self.way else {
            return failure;
        };
        let Some((host, port, tls)) = node.tcp_address() else {
            return failure;
        };
        if failure.kind() != Kind::Unreachable || err.is_connection_refusal() {
            return failure;
        }
        let candidates: &[Protocol] = if tls {
            &[Protocol::Redis, Protocol::Http, Protocol::PostgreSql]
        } else {
            &[Protocol::Http, Protocol::PostgreSql]
        };
        match probe::identify(host, port, candidates, Deadline::after(PROBE)) {
            Some(Protocol::Redis) => {
                self.failure(what, &Failure::new(Kind::Permanent, PLAIN_AT_TLS))
            }
            Some(other) => self.failure(
                what,
                &Failure::new(
                    Kind::Permanent,
                    format!(
                        "the server speaks {}, not Redis: is the URL right?",
                        other.name()
                    ),
                ),
            ),
            None => failure,
        }
    }

    /// Like [`RedisLink::call`], for a call that waits to be told something
    /// (BLPOP), made once: `None` when the wait was cut short (lockrun was
    /// stopped and continued, the server went away or handed the key on), so
    /// that the caller looks for itself at once (what it was told may have
    /// been lost with the connection, or be told on another server now).
    pub fn wait_for<T>(
        &mut self,
        route: Route<'_>,
        what: &str,
        timeout: Duration,
        mut call: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<Option<T>, Failure> {
        let deadline = Deadline::after(timeout);
        let (node, asking) = match self.node(route, deadline) {
            Ok(found) => found,
            Err(failure) => return Err(self.failure(what, &failure)),
        };
        let reused = node.is_connected();
        match node.call(deadline, |c| asked(c, asking, &mut call)) {
            Ok(value) => Ok(Some(value)),
            Err(err) if interrupted(&err) => Ok(None),
            Err(err) => match self.next(&err, reused) {
                Next::Fail => Err(self.error(what, &err)),
                Next::Again | Next::Follow => Ok(None),
            },
        }
    }

    /// The server of `route`, and whether the call must say `ASKING` first.
    fn node(&mut self, route: Route<'_>, deadline: Deadline) -> Result<(&mut Node, bool), Failure> {
        match &mut self.way {
            Way::Single(node) => Ok((node, false)),
            Way::Sentinel { sentinels, primary } => {
                if primary.is_none() {
                    *primary = Some(sentinels.primary(deadline)?);
                }
                Ok((&mut primary.as_mut().expect("found above").node, false))
            }
            Way::Cluster(cluster) => match route {
                Route::Key(key) => cluster.node_for(key, deadline),
                Route::Primary(address) => Ok((cluster.primary(address), false)),
            },
        }
    }

    /// What to do after `err` ended a call on a connection that was `reused`.
    fn next(&mut self, err: &RedisError, reused: bool) -> Next {
        // Stopped and continued; or the server closed an idle connection (a restart).
        if interrupted(err) || (reused && err.is_connection_dropped()) {
            return Next::Again;
        }
        let passes = sort(err).0 != Kind::Permanent;
        match &mut self.way {
            Way::Single(_) => Next::Fail,
            Way::Sentinel { primary, .. } => {
                // A demoted or dead primary: ask the Sentinels again.
                if passes {
                    *primary = None;
                    Next::Follow
                } else {
                    Next::Fail
                }
            }
            Way::Cluster(cluster) => {
                if !passes {
                    Next::Fail
                } else if cluster.learn(err) {
                    Next::Again
                } else {
                    Next::Follow
                }
            }
        }
    }

    /// The error as the user should read it, sorted: trouble that may pass (the
    /// server unreachable, restarting, failing over) or a refusal that will not.
    fn error(&self, what: &str, err: &RedisError) -> Failure {
        let (kind, why) = match &self.way {
            // A Cluster node sends a name elsewhere for good: nothing here follows it.
            Way::Single(_) if matches!(err.code(), Some("MOVED" | "ASK")) => (
                Kind::Permanent,
                format!(
                    "the server is a Redis Cluster node, which serves this name elsewhere ({err}): use redis+cluster:// with its address"
                ),
            ),
            _ => sort(err),
        };
        self.failure(what, &Failure::new(kind, why))
    }

    /// `failure` met while doing `what`, as the user should read it.
    pub fn failure(&self, what: &str, failure: &Failure) -> Failure {
        let message = format!("Redis at {}: {what} failed: {failure}", self.shown);
        Failure::new(
            failure.kind(),
            Secret::scrub_with(self.secret.as_ref(), &message),
        )
    }
}

/// Runs `call`, after `ASKING` when the Cluster sent us to a slot's new node.
fn asked<T>(
    connection: &mut Connection,
    asking: bool,
    call: &mut impl FnMut(&mut Connection) -> redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    if asking {
        redis::cmd("ASKING").query::<()>(connection)?;
    }
    call(connection)
}

/// Waits a moment before the next try, if the deadline leaves time for one.
pub fn pause(deadline: Deadline) -> bool {
    if deadline.remaining() <= FOLLOW_PAUSE {
        return false;
    }
    thread::sleep(FOLLOW_PAUSE);
    true
}
