//! The way to the server a call is for, as Redis is deployed (README: "Redis
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
use super::sentinel::Sentinels;
use super::url::{Deployment, RedisTarget};
use crate::backend::net::{Deadline, Failure, Kind, Secret};
use crate::timing::FREE_CALL;

/// How long a call waits before it asks again where the primary is, while a
/// failover is under way.
const FOLLOW_PAUSE: Duration = Duration::from_millis(100);
/// Calls made again at once (a redirect, a connection the server closed since
/// the last call) before a failure ends the call.
const MAX_AGAIN: u32 = 5;

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
        primary: Option<Node>,
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
        let mut again = 0;
        loop {
            let (node, asking) = match self.node(route, deadline) {
                Ok(found) => found,
                Err(failure) if failure.is_transient() && pause(deadline) => continue,
                Err(failure) => return Err(self.failure(what, &failure)),
            };
            let reused = node.is_connected();
            let err = match node.call(deadline, |c| asked(c, asking, &mut call)) {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            match self.next(&err, reused) {
                Next::Again if again < MAX_AGAIN => again += 1,
                Next::Follow if pause(deadline) => {}
                _ => return Err(self.error(what, &err)),
            }
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
                Ok((primary.as_mut().expect("found above"), false))
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
        let (kind, why) = sort(err);
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
fn pause(deadline: Deadline) -> bool {
    if deadline.remaining() <= FOLLOW_PAUSE {
        return false;
    }
    thread::sleep(FOLLOW_PAUSE);
    true
}
