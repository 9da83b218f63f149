//! The Redis backend (SPEC §4): leases as slot keys with a PX TTL kept by the
//! server, changed only by atomic Lua scripts that check the holder's token;
//! a release wakes one waiter at once through a list the waiters BLPOP.

mod link;
mod scripts;

use std::time::{Duration, SystemTime};

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::{Acquired, Backend, Holder, Renewal, Request, Wait};
use crate::error::{Error, Result};
use crate::identity::{Process, epoch_millis};
use crate::name::Name;
use crate::platform::clock::Moment;
use link::{Link, MAX_CALL_TIMEOUT};
use scripts::{Keys, Scripts};

/// How long a wake-up waits in its list for a waiter: long enough to cover a
/// waiter between its failed attempt and its BLPOP, short enough that stale
/// wake-ups do not pile up.
const WAKE_TTL: Duration = Duration::from_secs(2);
/// The most slots a name can have (`--parallelism`), used to cap wake lists.
const MAX_SLOTS: u32 = 1024;
/// Keys asked for per SCAN step.
const SCAN_COUNT: usize = 1000;

/// What a slot key holds: the holder's token and what `status` shows.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    token: String,
    pid: u32,
    start_time: u64,
    boot_id: String,
    host: String,
    command: String,
    /// Milliseconds since the Unix epoch, by the holder's clock (shown, never compared).
    acquired_at: u64,
    /// Set by the acquire script, which writes it first.
    #[serde(default, skip_serializing_if = "is_zero")]
    fence: u64,
    /// Kept taken by `--min-hold` after its holder released it; set by the release script.
    #[serde(default, skip_serializing_if = "is_false")]
    kept: bool,
}

impl Record {
    fn process(&self) -> Process {
        Process {
            pid: self.pid,
            start_time: self.start_time,
            boot_id: self.boot_id.clone(),
            host: self.host.clone(),
        }
    }

    fn holder(self, name: &str, slot: u32, pttl: i64) -> Holder {
        Holder {
            name: name.to_owned(),
            slot,
            pid: self.pid,
            host: self.host,
            command: self.command,
            acquired_at: self.acquired_at,
            expires_at: u64::try_from(pttl)
                .ok()
                .map(|ttl| epoch_millis(SystemTime::now()) + ttl),
            fence: self.fence,
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(b: &bool) -> bool {
    !*b
}

/// The slot this lockrun holds.
struct Held {
    keys: Keys,
    slot: u32,
    token: String,
    ttl: Duration,
    parallelism: u32,
}

pub struct RedisBackend {
    link: Link,
    prefix: String,
    scripts: Scripts,
    held: Option<Held>,
    /// When the first current holder's lease runs out, as the last failed attempt saw it.
    earliest_expiry: Option<Moment>,
    /// Holders on this host seen by the last failed attempt: (slot, record).
    same_host: Vec<(u32, Record)>,
    /// The name and parallelism of the last request, so its holders can be read without SCAN.
    requested: Option<(Name, u32)>,
}

/// What the acquire script answered.
enum Attempt {
    Taken(Acquired),
    Busy {
        earliest_pttl: Option<u64>,
        same_host: Vec<(u32, Record)>,
    },
}

impl RedisBackend {
    pub fn open(url: &str, prefix: &str) -> Result<Self> {
        Ok(Self {
            link: Link::new(url)?,
            prefix: prefix.to_owned(),
            scripts: Scripts::new(),
            held: None,
            earliest_expiry: None,
            same_host: Vec::new(),
            requested: None,
        })
    }

    /// The timeout of one call made for a lease of `ttl`: well inside a renewal interval.
    fn call_timeout(ttl: Duration) -> Duration {
        (ttl / 5).min(MAX_CALL_TIMEOUT)
    }

    fn meta(request: &Request) -> Result<String> {
        let process = &request.owner.process;
        let record = Record {
            token: request.owner.token.clone(),
            pid: process.pid,
            start_time: process.start_time,
            boot_id: process.boot_id.clone(),
            host: process.host.clone(),
            command: request.owner.command.clone(),
            acquired_at: epoch_millis(SystemTime::now()),
            fence: 0,
            kept: false,
        };
        serde_json::to_string(&record)
            .map_err(|err| Error::internal("encoding holder metadata", err))
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let keys = Keys::new(&self.prefix, &request.name);
        let start = rand::rng().random_range(0..request.parallelism);
        let mut invocation = self.scripts.acquire.key(keys.fence());
        for slot in 0..request.parallelism {
            invocation.key(keys.slot(slot));
        }
        invocation
            .arg(Self::meta(request)?)
            .arg(request.ttl.as_millis() as u64)
            .arg(start)
            .arg(&request.owner.process.boot_id);
        let sent = Moment::now();
        let (taken, first, second, same_host): (i64, i64, i64, Vec<(u32, String)>) = self
            .link
            .call("acquiring a slot", Self::call_timeout(request.ttl), |c| {
                invocation.invoke(c)
            })?;
        if taken == 1 {
            self.held = Some(Held {
                keys,
                slot: first as u32,
                token: request.owner.token.clone(),
                ttl: request.ttl,
                parallelism: request.parallelism,
            });
            return Ok(Attempt::Taken(Acquired {
                slot: first as u32,
                fence: second as u64,
                sent,
            }));
        }
        Ok(Attempt::Busy {
            earliest_pttl: u64::try_from(first).ok(),
            same_host: same_host
                .into_iter()
                .filter_map(|(slot, json)| Some((slot, serde_json::from_str(&json).ok()?)))
                .collect(),
        })
    }

    /// Takes over a slot whose holder ran on this host and whose process is gone.
    fn reclaim_dead(&mut self, request: &Request) -> Result<Option<Acquired>> {
        let dead: Vec<(u32, Record)> = std::mem::take(&mut self.same_host)
            .into_iter()
            .filter(|(_, record)| !record.kept && record.process().is_gone())
            .collect();
        let keys = Keys::new(&self.prefix, &request.name);
        for (slot, record) in dead {
            let mut invocation = self.scripts.take_over.key(keys.fence());
            invocation
                .key(keys.slot(slot))
                .arg(&record.token)
                .arg(Self::meta(request)?)
                .arg(request.ttl.as_millis() as u64);
            let sent = Moment::now();
            let fence: u64 = self.link.call(
                "taking over a dead holder's slot",
                Self::call_timeout(request.ttl),
                |c| invocation.invoke(c),
            )?;
            if fence > 0 {
                self.held = Some(Held {
                    keys,
                    slot,
                    token: request.owner.token.clone(),
                    ttl: request.ttl,
                    parallelism: request.parallelism,
                });
                return Ok(Some(Acquired { slot, fence, sent }));
            }
        }
        Ok(None)
    }

    /// The holders in `keys`, read in one round trip.
    fn read_holders(&mut self, keys: &[String]) -> Result<Vec<Holder>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
        }
        let replies: Vec<(Option<String>, i64)> =
            self.link
                .call_idempotent("reading holders", MAX_CALL_TIMEOUT, |c| pipe.query(c))?;
        let mut holders: Vec<Holder> = keys
            .iter()
            .zip(replies)
            .filter_map(|(key, (value, pttl))| {
                let (name, slot) = scripts::parse_slot_key(&self.prefix, key)?;
                let record: Record = serde_json::from_str(&value?).ok()?;
                Some(record.holder(name, slot, pttl))
            })
            .collect();
        holders.sort_by(|a, b| (&a.name, a.slot).cmp(&(&b.name, b.slot)));
        Ok(holders)
    }

    /// Every key matching `pattern`, by SCAN (never KEYS, which blocks the server).
    fn scan(&mut self, pattern: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) =
                self.link
                    .call_idempotent("listing lock keys", MAX_CALL_TIMEOUT, |c| {
                        redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(pattern)
                            .arg("COUNT")
                            .arg(SCAN_COUNT)
                            .query(c)
                    })?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Frees `slot_key` if it is still held with `token`, waking one waiter.
    fn release_slot(
        &mut self,
        keys: &Keys,
        slot_key: &str,
        token: &str,
        keep: Duration,
        parallelism: u32,
        timeout: Duration,
    ) -> Result<bool> {
        let mut invocation = self.scripts.release.key(slot_key);
        invocation
            .key(keys.wake())
            .arg(token)
            .arg(keep.as_millis() as u64)
            .arg(parallelism)
            .arg(WAKE_TTL.as_millis() as u64);
        let released: i64 = self
            .link
            .call_idempotent("releasing the lock", timeout, |c| invocation.invoke(c))?;
        Ok(released == 1)
    }

    /// Warnings about the server's setup that can break locks (shown with `-v`).
    fn eviction_warning(&mut self) -> Result<Option<String>> {
        let info: String =
            self.link
                .call("reading the server's settings", MAX_CALL_TIMEOUT, |c| {
                    redis::cmd("INFO").arg("memory").query(c)
                })?;
        let policy = info
            .lines()
            .find_map(|line| line.strip_prefix("maxmemory_policy:"))
            .map(str::trim);
        Ok(match policy {
            Some("noeviction") | None => None,
            Some(policy) => Some(format!(
                "Redis at {} has maxmemory-policy {policy}: when it runs out of memory it may evict lock keys, letting a second holder in; use noeviction",
                self.link.shown()
            )),
        })
    }
}

impl Backend for RedisBackend {
    fn try_acquire(&mut self, request: &Request) -> Result<Option<Acquired>> {
        self.requested = Some((request.name.clone(), request.parallelism));
        let sent = Moment::now();
        match self.attempt(request)? {
            Attempt::Taken(acquired) => Ok(Some(acquired)),
            Attempt::Busy {
                earliest_pttl,
                same_host,
            } => {
                // PTTL rounds down: one more millisecond and the key has certainly expired.
                self.earliest_expiry =
                    earliest_pttl.map(|pttl| sent + Duration::from_millis(pttl + 1));
                self.same_host = same_host;
                self.reclaim_dead(request)
            }
        }
    }

    fn wait(&mut self, request: &Request, wait: Wait) -> Result<Option<Acquired>> {
        let until = [
            Some(wait.step_until),
            wait.deadline,
            self.earliest_expiry.take(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(wait.step_until);
        let block = until.remaining();
        if block < Duration::from_millis(1) {
            return Ok(None);
        }
        let wake = Keys::new(&self.prefix, &request.name).wake();
        // BLPOP's own timeout ends the wait; the socket's only catches a server that went silent.
        let socket_timeout = block + MAX_CALL_TIMEOUT;
        let _woken: Option<(String, String)> =
            self.link
                .call_idempotent("waiting for a release", socket_timeout, |c| {
                    redis::cmd("BLPOP")
                        .arg(&wake)
                        .arg(format!("{:.3}", block.as_secs_f64()))
                        .query(c)
                })?;
        // Woken or not, the acquire loop tries again now.
        Ok(None)
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let Some(held) = &self.held else {
            return Ok(Renewal::Lost);
        };
        let mut invocation = self.scripts.renew.key(held.keys.slot(held.slot));
        invocation.arg(&held.token).arg(held.ttl.as_millis() as u64);
        let timeout = Self::call_timeout(held.ttl).min(within);
        let renewed: i64 = self
            .link
            .call_idempotent("renewing the lease", timeout, |c| invocation.invoke(c))?;
        Ok(Renewal::confirmed(renewed == 1))
    }

    fn release(&mut self, keep_until: Option<SystemTime>) -> Result<()> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        // A duration from now, not a time: only the server's clock decides expiry.
        let keep = keep_until
            .and_then(|until| until.duration_since(SystemTime::now()).ok())
            .filter(|keep| keep.as_millis() > 0)
            .unwrap_or_default();
        self.release_slot(
            &held.keys,
            &held.keys.slot(held.slot),
            &held.token,
            keep,
            held.parallelism,
            Self::call_timeout(held.ttl),
        )?;
        Ok(())
    }

    fn holders(&mut self, name: Option<&Name>) -> Result<Vec<Holder>> {
        let keys = match (name, &self.requested) {
            (Some(name), Some((requested, parallelism))) if name == requested => {
                let keys = Keys::new(&self.prefix, name);
                (0..*parallelism).map(|slot| keys.slot(slot)).collect()
            }
            (Some(name), _) => self.scan(&Keys::new(&self.prefix, name).slot_pattern())?,
            (None, _) => self.scan(&scripts::all_slots_pattern(&self.prefix))?,
        };
        self.read_holders(&keys)
    }

    fn break_leases(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Holder>> {
        let keys = Keys::new(&self.prefix, name);
        let wanted: Vec<String> = match slot {
            Some(slot) => vec![keys.slot(slot)],
            None => self.scan(&keys.slot_pattern())?,
        };
        let mut broken = Vec::new();
        for key in wanted {
            let value: Option<String> =
                self.link
                    .call_idempotent("reading a holder", MAX_CALL_TIMEOUT, |c| {
                        redis::cmd("GET").arg(&key).query(c)
                    })?;
            let Some(record) = value.and_then(|v| serde_json::from_str::<Record>(&v).ok()) else {
                continue;
            };
            let Some((_, slot)) = scripts::parse_slot_key(&self.prefix, &key) else {
                continue;
            };
            let token = record.token.clone();
            if self.release_slot(
                &keys,
                &key,
                &token,
                Duration::ZERO,
                MAX_SLOTS,
                MAX_CALL_TIMEOUT,
            )? {
                broken.push(record.holder(name.as_str(), slot, -1));
            }
        }
        Ok(broken)
    }

    fn warnings(&mut self) -> Vec<String> {
        // A server that cannot be reached or read (an ACL without INFO) gets no
        // warning here: the acquire right after reports any real failure.
        self.eviction_warning().ok().flatten().into_iter().collect()
    }
}
