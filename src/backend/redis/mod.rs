//! The Redis backend (README: "Redis backend"): leases as slot keys with a PX
//! TTL kept by the server, a waiting line as a sorted set by ticket, changed
//! only by atomic Lua scripts that check tokens; a release wakes the one
//! waiter the freed slot is for, through a list it BLPOPs.

mod link;
mod scripts;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use super::record::{HolderRecord, WaiterRecord, local_ahead, sort, waiting};
use super::{
    Abilities, Attempt, Common, Entry, Line, Owner, Released, Renewal, Request, Slot, Store, Waited,
};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::timing::{FREE_CALL, Plan};
use link::Link;
use scripts::{Keys, Scripts};

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    #[arg(
        long,
        help = "Redis server: redis://[user:pass@]host:port[/db], rediss:// (TLS) or redis+unix:///path",
        env = "LOCKRUN_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        value_name = "URL",
        hide_env_values = true
    )]
    pub redis_url: String,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        Ok(Box::new(RedisStore {
            link: Rc::new(RefCell::new(Link::new(&self.redis_url)?)),
            location: format!("Redis at {}", link::redact(&self.redis_url)),
            prefix: common.prefix.to_owned(),
            scripts: Rc::new(Scripts::new()),
            since: None,
        }))
    }
}

/// The acquire script's answer: taken (1) with slot and fence, or not (0) with
/// place, earliest holder PTTL, and the records of holders and the waiter ahead on our host.
type Reply = (i64, i64, i64, Vec<String>, Vec<String>);

/// How long a wake-up waits in its list for its waiter: long enough to cover
/// a waiter between its look at the line and its BLPOP.
const WAKE_TTL: Duration = Duration::from_secs(2);
/// Keys asked for per SCAN step.
const SCAN_COUNT: usize = 1000;

struct RedisStore {
    link: Rc<RefCell<Link>>,
    /// The server, its password redacted.
    location: String,
    prefix: String,
    scripts: Rc<Scripts>,
    /// When our first look at the line was: a waiter's record says it began waiting then.
    since: Option<u64>,
}

fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::internal("encoding a record", err))
}

impl RedisStore {
    fn keys(&self, name: &Name) -> Keys {
        Keys::new(&self.prefix, name)
    }

    /// The holders in `keys` (slot keys) and their leases' ends, read in one round trip.
    fn read_holders(&self, keys: &[String]) -> Result<Vec<Entry>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
        }
        let replies: Vec<(Option<String>, i64)> =
            self.link
                .borrow_mut()
                .call_idempotent("reading holders", FREE_CALL, |c| pipe.query(c))?;
        let now = now_millis();
        Ok(keys
            .iter()
            .zip(replies)
            .filter_map(|(key, (value, pttl))| {
                let (_, slot) = scripts::parse_slot_key(&self.prefix, key)?;
                let record: HolderRecord = serde_json::from_str(&value?).ok()?;
                let live = record.kept_until.is_some() || !record.owner.process.is_gone();
                live.then(|| record.entry(slot).expiring(expiry(now, pttl)))
            })
            .collect())
    }

    /// The live waiters of the line at `keys`, in line order.
    fn read_line(&self, keys: &Keys) -> Result<Vec<Entry>> {
        let tokens: Vec<String> =
            self.link
                .borrow_mut()
                .call_idempotent("reading the line", FREE_CALL, |c| {
                    redis::cmd("ZRANGE")
                        .arg(keys.line())
                        .arg(0)
                        .arg(-1)
                        .query(c)
                })?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for token in &tokens {
            let key = keys.waiter(token);
            pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
        }
        let replies: Vec<(Option<String>, i64)> =
            self.link
                .borrow_mut()
                .call_idempotent("reading waiters", FREE_CALL, |c| pipe.query(c))?;
        let now = now_millis();
        let records: Vec<(WaiterRecord, i64)> = replies
            .into_iter()
            .filter_map(|(value, pttl)| Some((serde_json::from_str(&value?).ok()?, pttl)))
            .collect();
        Ok(waiting(records.iter().map(|(record, pttl)| {
            (
                record.name.as_str(),
                &record.owner,
                record.since,
                expiry(now, *pttl),
            )
        })))
    }

    /// Every key matching `pattern`, by SCAN (never KEYS, which blocks the server).
    fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) =
                self.link
                    .borrow_mut()
                    .call_idempotent("listing lock keys", FREE_CALL, |c| {
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

    /// Warnings about the server's setup that can break locks (shown with `-v`).
    fn eviction_warning(&self) -> Result<Option<String>> {
        let mut link = self.link.borrow_mut();
        let info: String = link.call("reading the server's settings", FREE_CALL, |c| {
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
                link.shown()
            )),
        })
    }
}

impl Store for RedisStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn abilities(&self) -> Abilities {
        Abilities::LEASES_THAT_TELL
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let keys = self.keys(&request.name);
        let owner = &request.owner;
        let now = epoch_millis(SystemTime::now());
        let since = *self.since.get_or_insert(now);
        let holder = json(&HolderRecord {
            name: request.name.to_string(),
            owner: owner.clone(),
            acquired_at: now,
            fence: 0,
            kept_until: None,
        })?;
        let waiter = json(&WaiterRecord {
            name: request.name.to_string(),
            owner: owner.clone(),
            since,
        })?;
        let mut invocation = self.scripts.acquire.key(keys.fence());
        invocation.key(keys.line()).key(keys.ticket());
        for slot in keys.slots(request.parallelism) {
            invocation.key(slot);
        }
        invocation
            .arg(&owner.token)
            .arg(holder)
            .arg(waiter)
            .arg(request.plan.ttl().as_millis() as u64)
            .arg(u8::from(request.queue))
            .arg(keys.base())
            .arg(&owner.process.boot_id)
            .arg(WAKE_TTL.as_millis() as u64)
            .arg(request.parallelism);
        let sent = Moment::now();
        // Safe to repeat after a lost reply: a second run finds our slot taken, or our place kept.
        let (taken, first, second, holders, before): Reply = self
            .link
            .borrow_mut()
            .call_idempotent("acquiring a slot", FREE_CALL, |c| invocation.invoke(c))?;
        if taken == 1 {
            return Ok(Attempt::Taken(Box::new(RedisSlot {
                link: Rc::clone(&self.link),
                scripts: Rc::clone(&self.scripts),
                keys,
                slot: first as u32,
                fence: second as u64,
                token: owner.token.clone(),
                plan: request.plan,
                taken_at: sent,
            })));
        }
        if taken == 2 {
            return Ok(Attempt::Waiting(Line::refused(first as u32)));
        }
        let owners = |records: Vec<String>| -> Vec<Owner> {
            records
                .iter()
                .filter_map(|record| serde_json::from_str(record).ok())
                .collect()
        };
        let (holders, before) = (owners(holders), owners(before));
        let position = first as u32;
        Ok(Attempt::Waiting(Line {
            position,
            local_ahead: local_ahead(&owner.process, position, holders.iter(), before.first()),
            // PTTL rounds down: one more millisecond and the key has certainly expired.
            moves_by: u64::try_from(second)
                .ok()
                .map(|pttl| sent + Duration::from_millis(pttl + 1)),
            other_parallelism: None,
        }))
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let keys = self.keys(&request.name);
        let mut invocation = self.scripts.evict.key(keys.line());
        for slot in keys.slots(request.parallelism) {
            invocation.key(slot);
        }
        invocation.arg(keys.base()).arg(WAKE_TTL.as_millis() as u64);
        for owner in owners {
            invocation.arg(&owner.token);
        }
        let _: i64 =
            self.link
                .borrow_mut()
                .call_idempotent("dropping dead entries", FREE_CALL, |c| invocation.invoke(c))?;
        Ok(())
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        let block = until.remaining();
        if block < Duration::from_millis(1) {
            return Ok(Waited::Quiet);
        }
        let wake = self.keys(&request.name).wake(&request.owner.token);
        // BLPOP's own timeout ends the wait; the socket's only catches a server that went silent.
        let socket_timeout = block + FREE_CALL;
        let woken: Option<Option<(String, String)>> =
            self.link
                .borrow_mut()
                .wait_for("waiting for a release", socket_timeout, |c| {
                    redis::cmd("BLPOP")
                        .arg(&wake)
                        .arg(format!("{:.3}", block.as_secs_f64()))
                        .query(c)
                })?;
        // Cut short (None) or woken (Some(Some(_))): look again; Some(None): BLPOP timed out.
        Ok(match woken {
            Some(None) => Waited::Quiet,
            _ => Waited::Moved,
        })
    }

    fn leave(&mut self, request: &Request) -> Result<()> {
        // Dropping our place is what a dead waiter's eviction does; the slot we do not take is nobody's to free.
        self.evict(request, std::slice::from_ref(&request.owner))
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let mut entries = if let Some(name) = name {
            let keys = self.keys(name);
            let mut entries = self.read_holders(&self.scan(&keys.slot_pattern())?)?;
            entries.extend(self.read_line(&keys)?);
            entries
        } else {
            let mut entries =
                self.read_holders(&self.scan(&scripts::every_name(&self.prefix, "slot:*"))?)?;
            for line in self.scan(&scripts::every_name(&self.prefix, "line"))? {
                let base = line.strip_suffix("line").unwrap_or(&line);
                entries.extend(self.read_line(&Keys::from_base(base))?);
            }
            entries
        };
        sort(&mut entries);
        Ok(entries)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let keys = self.keys(name);
        let wanted: Vec<String> = match slot {
            Some(slot) => vec![keys.slot(slot)],
            None => self.scan(&keys.slot_pattern())?,
        };
        let mut broken = Vec::new();
        for key in wanted {
            let value: Option<String> =
                self.link
                    .borrow_mut()
                    .call_idempotent("reading a holder", FREE_CALL, |c| {
                        redis::cmd("GET").arg(&key).query(c)
                    })?;
            let Some(record) = value.and_then(|v| serde_json::from_str::<HolderRecord>(&v).ok())
            else {
                continue;
            };
            let Some((_, slot)) = scripts::parse_slot_key(&self.prefix, &key) else {
                continue;
            };
            if release(
                &self.link,
                &self.scripts,
                &keys,
                &key,
                &record.owner.token,
                Duration::ZERO,
                FREE_CALL,
            )? {
                broken.push(record.entry(slot));
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

/// A slot of the Redis backend: a key with a PX TTL.
struct RedisSlot {
    link: Rc<RefCell<Link>>,
    scripts: Rc<Scripts>,
    keys: Keys,
    slot: u32,
    fence: u64,
    token: String,
    plan: Plan,
    taken_at: Moment,
}

impl Slot for RedisSlot {
    fn number(&self) -> u32 {
        self.slot
    }

    fn fence(&self) -> u64 {
        self.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let mut invocation = self.scripts.renew.key(self.keys.slot(self.slot));
        invocation
            .arg(&self.token)
            .arg(self.plan.ttl().as_millis() as u64);
        let timeout = self.plan.holder_call().min(within);
        let renewed: i64 =
            self.link
                .borrow_mut()
                .call_idempotent("renewing the lease", timeout, |c| invocation.invoke(c))?;
        Ok(Renewal::confirmed(renewed == 1))
    }

    fn release(self: Box<Self>, keep_until: Option<SystemTime>) -> Result<Released> {
        // A duration from now, not a time: only the server's clock decides expiry.
        let keep = keep_until
            .and_then(|until| until.duration_since(SystemTime::now()).ok())
            .filter(|keep| keep.as_millis() > 0)
            .unwrap_or_default();
        let ours = release(
            &self.link,
            &self.scripts,
            &self.keys,
            &self.keys.slot(self.slot),
            &self.token,
            keep,
            self.plan.holder_call(),
        )?;
        Ok(Released::ours(ours))
    }
}

/// Frees the slot at `key` if it is held with `token` (or keeps it taken for
/// `keep`), waking the head of the line. False when the slot was not (any
/// longer) held with it.
fn release(
    link: &RefCell<Link>,
    scripts: &Scripts,
    keys: &Keys,
    key: &str,
    token: &str,
    keep: Duration,
    timeout: Duration,
) -> Result<bool> {
    let mut invocation = scripts.release.key(key);
    invocation.key(keys.line());
    invocation
        .arg(token)
        .arg(keep.as_millis() as u64)
        .arg(epoch_millis(SystemTime::now() + keep))
        .arg(keys.base())
        .arg(WAKE_TTL.as_millis() as u64);
    let released: i64 = link
        .borrow_mut()
        .call_idempotent("releasing the lock", timeout, |c| invocation.invoke(c))?;
    Ok(released == 1)
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}

/// When a key with `pttl` milliseconds left expires; `None` for a key without a TTL.
fn expiry(now: u64, pttl: i64) -> Option<u64> {
    u64::try_from(pttl).ok().map(|left| now + left)
}
