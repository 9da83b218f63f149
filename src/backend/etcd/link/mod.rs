//! A blocking client of etcd's v3 API through its JSON gateway (`/v3/...`),
//! covering what the lock recipe needs: authentication, leases, transactions,
//! ranges in create order and watches. Why the gateway rather than gRPC:
//! ARCHITECTURE.md: "Design".
//!
//! **Threads**: none. A call is a write and blocking reads on one socket in
//! the caller's thread, each bounded by the call's deadline, so lockrun stays
//! a single thread while the command runs (its supervisor's signalfd, the
//! watchdog's fork and the file backend's SIGALRM rely on that).
//!
//! **Several members**: a call goes to the member that answered last. When
//! that member cannot be reached, does not answer in time or answers that it
//! cannot serve now (no leader, request timed out), the call moves on to the
//! next one, round after round while one of them answers (an election), all
//! within the call's time limit. So any call may reach etcd twice, and the
//! caller makes each safe to: reads, keep-alives and revokes are idempotent;
//! a grant that is retried at worst leaves a lease with no keys, which expires
//! by itself; transactions check what an earlier try would have changed.

mod endpoint;
mod error;
mod kv;
mod watch;
mod wire;

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rustls::ClientConfig;
use serde::Serialize;

use crate::backend::net::http::{self, Connection};
use crate::backend::net::probe::{self, Protocol};
use crate::backend::net::{Deadline, Kind, Secret};
use error::{AttemptError, Remedy, Tally, code};
use wire::{
    AuthenticateRequest, AuthenticateResponse, LeaseRequest, LeaseResponse, RangeRequest,
    RangeResponse, TxnResponse, WatchCreateRequest, WatchRequest, decode, decode_streamed,
};

pub use endpoint::Endpoints;
pub use error::{Error, Result};
pub use kv::{Listing, Op, Txn, TxnOutcome};
pub use watch::Watch;
pub use wire::{EventKind, KeyValue, Keys, WatchEvent};

/// etcd's `hasleader` metadata (the gateway passes `Grpc-Metadata-*` headers
/// on): a member cut off from the others refuses at once, and cancels its
/// watches, instead of hanging until a timeout or serving a stale view.
const REQUIRE_LEADER: (&str, &str) = ("Grpc-Metadata-Hasleader", "true");

/// How long asking a member that would not answer what it speaks may take.
const PROBE: Duration = Duration::from_millis(700);

/// Between two rounds over the members while the cluster elects a leader.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

enum Auth {
    /// No credentials given, or the cluster has auth off.
    Off,
    /// Credentials given and no valid token yet.
    Needed,
    Token(Secret),
}

/// A lease the cluster granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedLease {
    pub id: i64,
    /// What the cluster granted, in whole seconds (it may round up short TTLs).
    pub ttl: Duration,
}

pub struct Client {
    endpoints: Endpoints,
    /// The member calls go to first: the last one that answered.
    current: usize,
    /// The open connection to the current member, kept between calls.
    connection: Option<Connection>,
    auth: Auth,
    /// Loaded on the first `https://` connection.
    tls: Option<Arc<ClientConfig>>,
}

impl Client {
    /// A client of the cluster at `endpoints`; it connects on the first call.
    /// Every call is given the time it may take (over all members it tries).
    pub fn new(endpoints: Endpoints) -> Self {
        let auth = if endpoints.credentials.is_some() {
            Auth::Needed
        } else {
            Auth::Off
        };
        Self {
            endpoints,
            current: 0,
            connection: None,
            auth,
            tls: None,
        }
    }

    /// A new lease of `ttl`, rounded up to whole seconds as etcd counts them
    /// (the cluster may grant more: it has a minimum).
    pub fn lease_grant(&mut self, ttl: Duration, within: Duration) -> Result<GrantedLease> {
        let request = LeaseRequest {
            id: 0,
            ttl: whole_seconds(ttl),
        };
        let granted: LeaseResponse =
            self.call("lease grant", "/v3/lease/grant", &request, within, decode)?;
        if !granted.error.is_empty() {
            return Err(Error::new(
                Kind::Permanent,
                format!("etcd: lease grant failed: {}", granted.error),
            ));
        }
        Ok(GrantedLease {
            id: granted.id,
            ttl: seconds(granted.ttl),
        })
    }

    /// Renews `lease` once; returns its TTL, or `None` when the lease is gone
    /// (expired or revoked: it is never revived).
    pub fn lease_keep_alive(&mut self, lease: i64, within: Duration) -> Result<Option<Duration>> {
        let request = LeaseRequest { id: lease, ttl: 0 };
        let renewed: LeaseResponse = self.call(
            "lease keep-alive",
            "/v3/lease/keepalive",
            &request,
            within,
            decode_streamed,
        )?;
        Ok((renewed.ttl > 0).then(|| seconds(renewed.ttl)))
    }

    /// Revokes `lease`, deleting every key attached to it; false when it was gone already.
    pub fn lease_revoke(&mut self, lease: i64, within: Duration) -> Result<bool> {
        let request = LeaseRequest { id: lease, ttl: 0 };
        let revoked: Result<LeaseResponse> =
            self.call("lease revoke", "/v3/lease/revoke", &request, within, decode);
        match revoked {
            Ok(_) => Ok(true),
            Err(err) if err.lease_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The time left to `lease` (in whole seconds); `None` when it is gone.
    pub fn lease_time_to_live(&mut self, lease: i64, within: Duration) -> Result<Option<Duration>> {
        let request = LeaseRequest { id: lease, ttl: 0 };
        let found: LeaseResponse = self.call(
            "lease time-to-live",
            "/v3/lease/timetolive",
            &request,
            within,
            decode,
        )?;
        Ok((found.ttl >= 0).then(|| seconds(found.ttl)))
    }

    /// Runs `txn` at one revision. A put attached to a lease that is gone
    /// fails the whole transaction ([`Error::lease_not_found`]).
    pub fn txn(&mut self, txn: &Txn, within: Duration) -> Result<TxnOutcome> {
        let answer: TxnResponse =
            self.call("transaction", "/v3/kv/txn", txn.request(), within, decode)?;
        Ok(TxnOutcome {
            succeeded: answer.succeeded,
            revision: answer.header.revision,
            listings: answer
                .responses
                .into_iter()
                .filter_map(|response| response.response_range)
                .map(listing)
                .collect(),
        })
    }

    /// Reads every key of `keys`, oldest (lowest create revision) first.
    pub fn range(&mut self, keys: &Keys, within: Duration) -> Result<Listing> {
        let request = RangeRequest::oldest_first(keys.clone());
        let found: RangeResponse = self.call("range", "/v3/kv/range", &request, within, decode)?;
        Ok(listing(found))
    }

    /// Watches `keys` from `start_revision` (0: from now), only their deletes
    /// when `deletes_only`, on a connection of its own; returns once a member
    /// has confirmed the watch.
    pub fn watch(
        &mut self,
        keys: &Keys,
        start_revision: i64,
        deletes_only: bool,
        within: Duration,
    ) -> Result<Watch> {
        let body = json(&WatchRequest {
            create_request: WatchCreateRequest {
                keys: keys.clone(),
                start_revision,
                progress_notify: true,
                filters: if deletes_only { vec!["NOPUT"] } else { vec![] },
            },
        });
        self.on_a_member("watch", within, |client, deadline| {
            let connection = client.open(deadline)?;
            let endpoint = client.endpoints.members[client.current].to_string();
            Watch::start(connection, endpoint, &client.headers(), &body, deadline)
        })
    }

    /// POSTs `request` to `path` on a member and decodes its answer.
    fn call<T>(
        &mut self,
        what: &str,
        path: &str,
        request: &impl Serialize,
        budget: Duration,
        decode: fn(&[u8]) -> Result<T, AttemptError>,
    ) -> Result<T> {
        let body = json(request);
        self.on_a_member(what, budget, |client, deadline| {
            decode(&client.exchange(path, &body, deadline)?)
        })
    }

    /// Runs `attempt` on the current member, then on the others in turn,
    /// until one succeeds or `budget` is spent; each attempt gets a share of
    /// the time left, so that a member that hangs leaves time for the others.
    /// When every member failed but one of them answered or kept silent (an
    /// election is under way), the round starts again after a pause while time
    /// is left; when all of them refused at once, there is nothing to wait for.
    fn on_a_member<T>(
        &mut self,
        what: &str,
        budget: Duration,
        mut attempt: impl FnMut(&mut Self, Deadline) -> Result<T, AttemptError>,
    ) -> Result<T> {
        let deadline = Deadline::after(budget);
        let members = self.endpoints.members.len();
        let mut token_renewed = false;
        let mut tally = Tally::default();
        loop {
            let mut untried = members;
            while untried > 0 {
                // A share as if another round over the others were to follow:
                // a follower that has not yet noticed its leader's death holds
                // a request until it times out, and the next member may have
                // the new leader by then.
                let shares = untried + members - 1;
                let attempt_deadline = deadline.share(shares as u32);
                let failure = match self
                    .authenticate(attempt_deadline)
                    .and_then(|()| attempt(self, attempt_deadline))
                {
                    Ok(value) => return Ok(value),
                    Err(failure) => failure,
                };
                let member = self.endpoints.members[self.current].to_string();
                match failure.verdict() {
                    Remedy::StaleToken if !token_renewed => {
                        token_renewed = true;
                        self.auth = Auth::Needed;
                        continue;
                    }
                    Remedy::Transient => {}
                    verdict => {
                        let context = format!("etcd at {member}: {what} failed");
                        return Err(failure.into_error(verdict.kind(), &context));
                    }
                }
                tally.add(&member, &failure);
                self.connection = None;
                self.current = (self.current + 1) % members;
                untried -= 1;
            }
            if !tally.worth_another_round() || deadline.remaining() <= ROUND_PAUSE {
                return Err(tally.into_error(what));
            }
            tally.next_round();
            thread::sleep(ROUND_PAUSE);
        }
    }

    /// Gets an auth token when one is needed.
    fn authenticate(&mut self, deadline: Deadline) -> Result<(), AttemptError> {
        let (Auth::Needed, Some(credentials)) = (&self.auth, &self.endpoints.credentials) else {
            return Ok(());
        };
        let body = json(&AuthenticateRequest {
            name: &credentials.user,
            password: credentials.password.expose(),
        });
        let answer = self
            .exchange("/v3/auth/authenticate", &body, deadline)
            .and_then(|reply| decode::<AuthenticateResponse>(&reply));
        self.auth = match answer {
            Ok(answer) => Auth::Token(Secret::new(answer.token)),
            Err(AttemptError::Answer { code, message })
                if code == code::FAILED_PRECONDITION
                    && message.contains("authentication is not enabled") =>
            {
                Auth::Off
            }
            Err(failure) => return Err(failure),
        };
        Ok(())
    }

    /// POSTs `body` to `path` on the current member and returns the body of a
    /// 200 OK answer. The open connection is reused; if it fails (the member
    /// may have closed it since, or restarted), a new one is tried once.
    fn exchange(
        &mut self,
        path: &str,
        body: &[u8],
        deadline: Deadline,
    ) -> Result<Vec<u8>, AttemptError> {
        if let Some(connection) = self.connection.take() {
            match self.exchange_on(connection, path, body, deadline) {
                Err(AttemptError::Io(_)) => {}
                answered => return answered,
            }
        }
        let connection = self.open(deadline)?;
        match self.exchange_on(connection, path, body, deadline) {
            Err(AttemptError::Io(err)) => Err(self.on_first_contact(err)),
            answered => answered,
        }
    }

    /// A member that closed a fresh connection without an answer, or kept
    /// silent, may be a server of another kind, which waiting will not change
    /// (docs/guide.md: "When the server has trouble"): asked what it speaks, a Redis
    /// or PostgreSQL server makes it a verdict.
    fn on_first_contact(&self, err: io::Error) -> AttemptError {
        let closed_or_silent = matches!(
            err.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::TimedOut
                | io::ErrorKind::WouldBlock
        );
        let member = &self.endpoints.members[self.current];
        if !closed_or_silent || member.address.tls.is_some() {
            return AttemptError::Io(err);
        }
        let candidates = [Protocol::Redis, Protocol::PostgreSql];
        match probe::identify(
            &member.address.host,
            member.address.port,
            &candidates,
            Deadline::after(PROBE),
        ) {
            Some(other) => AttemptError::Foreign(format!(
                "the server speaks {}, not etcd's HTTP gateway: is the endpoint right?",
                other.name()
            )),
            None => AttemptError::Io(err),
        }
    }

    fn exchange_on(
        &mut self,
        mut connection: Connection,
        path: &str,
        body: &[u8],
        deadline: Deadline,
    ) -> Result<Vec<u8>, AttemptError> {
        let status = connection.post(path, &self.headers(), body, deadline)?;
        let reply = connection.read_to_end(deadline)?;
        if connection.reusable() {
            self.connection = Some(connection);
        }
        if status == 200 {
            Ok(reply)
        } else {
            Err(AttemptError::from_reply(status, &reply))
        }
    }

    fn open(&mut self, deadline: Deadline) -> Result<Connection, AttemptError> {
        let tls = match self.endpoints.members[self.current].address.tls {
            Some(_) => Some(self.tls_config()?),
            None => None,
        };
        let endpoint = &self.endpoints.members[self.current].address;
        Ok(Connection::open(endpoint, tls.as_ref(), deadline)?)
    }

    fn tls_config(&mut self) -> io::Result<Arc<ClientConfig>> {
        if let Some(config) = &self.tls {
            return Ok(Arc::clone(config));
        }
        let config = http::tls_config()?;
        self.tls = Some(Arc::clone(&config));
        Ok(config)
    }

    fn headers(&self) -> Vec<(&'static str, &str)> {
        let mut headers = vec![REQUIRE_LEADER];
        if let Auth::Token(token) = &self.auth {
            headers.push(("Authorization", token.expose()));
        }
        headers
    }
}

fn json(request: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(request).expect("requests are plain data that always serialize")
}

/// `ttl` in whole seconds, rounded up, at least one.
fn whole_seconds(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

fn listing(found: RangeResponse) -> Listing {
    Listing {
        kvs: found.kvs,
        revision: found.header.revision,
    }
}

fn seconds(count: i64) -> Duration {
    Duration::from_secs(count.max(0) as u64)
}
