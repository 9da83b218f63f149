//! A blocking client of etcd's v3 API through its JSON gateway (`/v3/...`),
//! covering what the lock recipe needs: authentication, leases, a
//! put-if-absent transaction, ranges ordered by create revision, deletes and
//! watches. Why the gateway rather than gRPC: docs/etcd-client.md.
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
//! within the call's time limit. So any call may reach etcd twice,
//! and each is safe to: reads, keep-alives, deletes and revokes are
//! idempotent; a grant that is retried at worst leaves a lease with no keys,
//! which expires by itself; put-if-absent recognises a key it put itself by
//! its lease.

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use serde::Serialize;

use super::endpoint::Secret;
use super::error::{Failure, Verdict, code};
use super::http::{self, Connection};
use super::wire::{
    Absent, AuthenticateRequest, AuthenticateResponse, DeleteResponse, LeaseRequest, LeaseResponse,
    PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
    WatchCreateRequest, WatchRequest, decode, decode_streamed,
};

pub use super::endpoint::Endpoints;
pub use super::error::{Error, ErrorKind, Result};
pub use super::watch::Watch;
pub use super::wire::{Event, EventKind, KeyValue, Keys};

/// etcd's `hasleader` metadata (the gateway passes `Grpc-Metadata-*` headers
/// on): a member cut off from the others refuses at once, and cancels its
/// watches, instead of hanging until a timeout or serving a stale view.
const REQUIRE_LEADER: (&str, &str) = ("Grpc-Metadata-Hasleader", "true");

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
pub struct Lease {
    pub id: i64,
    /// What the cluster granted, in whole seconds (it may round up short TTLs).
    pub ttl: Duration,
}

/// What is left of a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTtl {
    pub remaining: Duration,
    pub granted: Duration,
}

/// The outcome of [`Client::put_if_absent`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Whether the key is ours: this call or an earlier try of it put it.
    pub created: bool,
    /// The key as it is now.
    pub kv: KeyValue,
}

/// The keys a range found, and the revision it read them at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    /// How many keys are in the whole range: etcd counts before `limit` and
    /// `created_before` filter, so a place in line is an index into `kvs`.
    pub count: i64,
    /// The store's revision when it was read: a watch from one past it misses nothing.
    pub revision: i64,
}

/// Which keys a [`Client::range`] reads: oldest (lowest create revision) first.
#[derive(Clone, Debug)]
pub struct Range {
    keys: Keys,
    limit: i64,
    newest_first: bool,
    max_create_revision: i64,
    count_only: bool,
}

impl Range {
    pub fn of(keys: Keys) -> Self {
        Self {
            keys,
            limit: 0,
            newest_first: false,
            max_create_revision: 0,
            count_only: false,
        }
    }

    /// At most `limit` keys.
    #[must_use]
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    #[must_use]
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    /// Only keys created before `revision`: with `newest_first` and a limit of
    /// one, the key just ahead of the one created at `revision`.
    #[must_use]
    pub fn created_before(mut self, revision: i64) -> Self {
        self.max_create_revision = revision - 1;
        self
    }

    /// Only the count, no keys.
    #[must_use]
    pub fn count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
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
    timeout: Duration,
}

impl Client {
    /// A client of the cluster at `endpoints`, which gives every call
    /// `timeout` (over all members it tries); it connects on the first call.
    pub fn new(endpoints: Endpoints, timeout: Duration) -> Self {
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
            timeout,
        }
    }

    /// A new lease of `ttl`, rounded up to whole seconds as etcd counts them.
    pub fn lease_grant(&mut self, ttl: Duration) -> Result<Lease> {
        let request = LeaseRequest {
            id: 0,
            ttl: whole_seconds(ttl),
        };
        let granted: LeaseResponse = self.call(
            "lease grant",
            "/v3/lease/grant",
            &request,
            self.timeout,
            decode,
        )?;
        if !granted.error.is_empty() {
            return Err(Error::new(
                ErrorKind::Rejected,
                format!("etcd: lease grant failed: {}", granted.error),
            ));
        }
        Ok(Lease {
            id: granted.id,
            ttl: seconds(granted.ttl),
        })
    }

    /// Renews `lease` once, giving up after `within`; returns its new TTL, or
    /// `None` when the lease is gone (expired or revoked: it is never revived).
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
    pub fn lease_revoke(&mut self, lease: i64) -> Result<bool> {
        let request = LeaseRequest { id: lease, ttl: 0 };
        let revoked: Result<LeaseResponse> = self.call(
            "lease revoke",
            "/v3/lease/revoke",
            &request,
            self.timeout,
            decode,
        );
        match revoked {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some(code::NOT_FOUND) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// What is left of `lease`; `None` when it is gone.
    pub fn lease_time_to_live(&mut self, lease: i64) -> Result<Option<LeaseTtl>> {
        let request = LeaseRequest { id: lease, ttl: 0 };
        let found: LeaseResponse = self.call(
            "lease time-to-live",
            "/v3/lease/timetolive",
            &request,
            self.timeout,
            decode,
        )?;
        Ok((found.ttl >= 0).then(|| LeaseTtl {
            remaining: seconds(found.ttl),
            granted: seconds(found.granted_ttl),
        }))
    }

    /// Puts `key` attached to `lease` unless the key exists, in one
    /// transaction that reads the key back either way. A key that exists with
    /// `lease` counts as created: an earlier try of this call put it (the
    /// caller makes the key unique to itself), so retrying is safe.
    pub fn put_if_absent(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<Claim> {
        let read_back = || RequestOp::Range(Keys::one(key));
        let request = TxnRequest {
            compare: vec![Absent::key(key)],
            success: vec![
                RequestOp::Put(PutRequest {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    lease,
                }),
                read_back(),
            ],
            failure: vec![read_back()],
        };
        let answer: TxnResponse = self.call(
            "put-if-absent",
            "/v3/kv/txn",
            &request,
            self.timeout,
            decode,
        )?;
        let kv = answer
            .responses
            .into_iter()
            .find_map(|response| response.response_range)
            .and_then(|range| range.kvs.into_iter().next())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Transient,
                    "etcd: put-if-absent found no key (its lease expired at once?)",
                )
            })?;
        Ok(Claim {
            created: answer.succeeded || (lease != 0 && kv.lease == lease),
            kv,
        })
    }

    /// Reads the keys `range` selects.
    pub fn range(&mut self, range: &Range) -> Result<Listing> {
        let request = RangeRequest {
            keys: range.keys.clone(),
            limit: range.limit,
            sort_order: if range.newest_first {
                "DESCEND"
            } else {
                "ASCEND"
            },
            sort_target: "CREATE",
            max_create_revision: range.max_create_revision,
            count_only: range.count_only,
        };
        let found: RangeResponse =
            self.call("range", "/v3/kv/range", &request, self.timeout, decode)?;
        Ok(Listing {
            kvs: found.kvs,
            count: found.count,
            revision: found.header.revision,
        })
    }

    /// Deletes `key`; false when it did not exist.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        let deleted: DeleteResponse = self.call(
            "delete",
            "/v3/kv/deleterange",
            &Keys::one(key),
            self.timeout,
            decode,
        )?;
        Ok(deleted.deleted > 0)
    }

    /// Watches `keys` from `start_revision` (0: from now) on a connection of
    /// its own; returns once a member has confirmed the watch.
    pub fn watch(&mut self, keys: &Keys, start_revision: i64) -> Result<Watch> {
        let body = json(&WatchRequest {
            create_request: WatchCreateRequest {
                keys: keys.clone(),
                start_revision,
                progress_notify: true,
            },
        });
        self.on_a_member("watch", self.timeout, |client, deadline| {
            let connection = client.open(deadline)?;
            let endpoint = client.endpoints.members[client.current].to_string();
            Watch::start(
                connection,
                endpoint,
                &client.headers(),
                &body,
                start_revision,
                deadline,
            )
        })
    }

    /// POSTs `request` to `path` on a member and decodes its answer.
    fn call<T>(
        &mut self,
        what: &str,
        path: &str,
        request: &impl Serialize,
        budget: Duration,
        decode: fn(&[u8]) -> Result<T, Failure>,
    ) -> Result<T> {
        let body = json(request);
        self.on_a_member(what, budget, |client, deadline| {
            decode(&client.exchange(path, &body, deadline)?)
        })
    }

    /// Runs `attempt` on the current member, then on the others in turn,
    /// until one succeeds or `budget` is spent; each attempt gets a fair share
    /// of the time left, so that a member that hangs leaves time for the next.
    /// When every member failed but one of them answered (an election is
    /// under way), the round starts again after a pause while time is left.
    fn on_a_member<T>(
        &mut self,
        what: &str,
        budget: Duration,
        mut attempt: impl FnMut(&mut Self, Instant) -> Result<T, Failure>,
    ) -> Result<T> {
        let deadline = Instant::now() + budget;
        let members = self.endpoints.members.len();
        let mut token_renewed = false;
        loop {
            let mut answered = false;
            let mut failures = Vec::new();
            let mut untried = members;
            while untried > 0 {
                let share = deadline.saturating_duration_since(Instant::now()) / untried as u32;
                let attempt_deadline = Instant::now() + share;
                let failure = match self
                    .authenticate(attempt_deadline)
                    .and_then(|()| attempt(self, attempt_deadline))
                {
                    Ok(value) => return Ok(value),
                    Err(failure) => failure,
                };
                let member = self.endpoints.members[self.current].to_string();
                match failure.verdict() {
                    Verdict::StaleToken if !token_renewed => {
                        token_renewed = true;
                        self.auth = Auth::Needed;
                        continue;
                    }
                    Verdict::Transient => {}
                    verdict => {
                        let context = format!("etcd at {member}: {what} failed");
                        return Err(failure.into_error(verdict.kind(), &context));
                    }
                }
                answered |= matches!(failure, Failure::Answer { .. });
                failures.push(format!("{member}: {failure}"));
                self.connection = None;
                self.current = (self.current + 1) % members;
                untried -= 1;
            }
            if !answered || Instant::now() + ROUND_PAUSE >= deadline {
                let kind = if answered {
                    ErrorKind::Transient
                } else {
                    ErrorKind::Unreachable
                };
                let message = format!("etcd: {what} failed: {}", failures.join("; "));
                return Err(Error::new(kind, message));
            }
            thread::sleep(ROUND_PAUSE);
        }
    }

    /// Gets an auth token when one is needed.
    fn authenticate(&mut self, deadline: Instant) -> Result<(), Failure> {
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
            Err(Failure::Answer { code, message })
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
    fn exchange(&mut self, path: &str, body: &[u8], deadline: Instant) -> Result<Vec<u8>, Failure> {
        if let Some(connection) = self.connection.take() {
            match self.exchange_on(connection, path, body, deadline) {
                Err(Failure::Io(_)) => {}
                answered => return answered,
            }
        }
        let connection = self.open(deadline)?;
        self.exchange_on(connection, path, body, deadline)
    }

    fn exchange_on(
        &mut self,
        mut connection: Connection,
        path: &str,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Vec<u8>, Failure> {
        let status = connection.post(path, &self.headers(), body, deadline)?;
        let reply = connection.read_to_end(deadline)?;
        if connection.reusable() {
            self.connection = Some(connection);
        }
        if status == 200 {
            Ok(reply)
        } else {
            Err(Failure::from_reply(status, &reply))
        }
    }

    fn open(&mut self, deadline: Instant) -> Result<Connection, Failure> {
        let tls = match self.endpoints.members[self.current].tls {
            Some(_) => Some(self.tls_config()?),
            None => None,
        };
        let endpoint = &self.endpoints.members[self.current];
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

fn seconds(count: i64) -> Duration {
    Duration::from_secs(count.max(0) as u64)
}
