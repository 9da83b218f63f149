//! The Redis backend (docs/backends/redis.md: "Redis backend"): leases as slot keys with a PX
//! TTL kept by the server, a waiting line as a sorted set by ticket, changed
//! only by atomic Lua scripts that check tokens and modes; a release wakes
//! the waiters the freed slot is for (the head of the line, or every sharer
//! at its head at once), through lists they BLPOP. Where the server is (one
//! node, Sentinel's primary, a Cluster's node) is the link's business.

mod cluster;
mod failover;
mod link;
mod node;
mod replicas;
mod scripts;
mod sentinel;
mod slot;
mod url;

/// The format of a name's keys (`PREFIX:{STEM}:format`); a newer one is refused.
pub const FORMAT: super::Format = super::Format {
    backend: "redis",
    kind: "key format",
    writes: scripts::FORMAT,
    reads_from: 1,
};

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use super::record::{HolderRecord, WaiterRecord, sort, waiting};
use super::{Abilities, Attempt, Common, Entry, Line, Owner, Request, Store, Waited, newer_format};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::timing::FREE_CALL;
use link::{RedisLink, Route};
use replicas::Replicas;
use scripts::{RedisKeys, Scripts};
use slot::RedisSlot;

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    #[arg(
        long,
        help = "Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]",
        env = "LOCKRUN_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        value_name = "URL",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]
    #[arg(long, env = "LOCKRUN_REDIS_REPLICAS", value_name = "N")]
    pub redis_replicas: Option<u32>,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        // A brace would move the `{STEM}` hash tag (docs/backends/redis.md: "Redis backend", Keys): on a
        // Cluster every name's keys would share one hash slot, or split across slots.
        if common.prefix.contains(['{', '}']) {
            return Err(Error::Usage(format!(
                "--prefix {:?} holds a brace, which would move the names' Redis Cluster hash tag: use a prefix without {{ or }}",
                common.prefix
            )));
        }
        let link = RedisLink::new(&self.redis_url)?;
        // A Sentinel deployment fails over to a replica: a grant it lacks would be granted twice.
        let replicas = self.redis_replicas.unwrap_or(u32::from(link.is_sentinel()));
        Ok(Box::new(RedisStore {
            location: format!("Redis at {}", link.shown()),
            link: Rc::new(RefCell::new(link)),
            prefix: common.prefix.to_owned(),
            scripts: Rc::new(Scripts::new()),
            replicas: Replicas::new(replicas),
            since: None,
        }))
    }
}

/// The acquire script's answer: taken (1) with slot and fence, or not (0) with
/// place, when what we watch lapses first (PTTL), and the records of what we
/// watch (holders, or the waiters right ahead) on our host.
type Reply = (i64, i64, i64, Vec<String>);

/// What an acquisition is called in messages.
const ACQUIRING: &str = "acquiring a slot";
/// How long a wake-up waits in its list for its waiter: long enough to cover
/// a waiter between its look at the line and its BLPOP.
const WAKE_TTL: Duration = Duration::from_secs(2);
/// Keys asked for per SCAN step.
const SCAN_COUNT: usize = 1000;

struct RedisStore {
    link: Rc<RefCell<RedisLink>>,
    /// The server, its password redacted.
    location: String,
    prefix: String,
    scripts: Rc<Scripts>,
    replicas: Replicas,
    /// When our first look at the line was: a waiter's record says it began waiting then.
    since: Option<u64>,
}

fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::internal("encoding a record", err))
}

impl RedisStore {
    /// The refusal of keys a newer lockrun wrote, in format `found` (`None`: not a number).
    fn newer_format(&self, found: Option<u64>) -> Error {
        let found = found.map_or_else(|| "unknown".to_owned(), |found| found.to_string());
        Error::Unavailable(newer_format(
            &self.location,
            "key format",
            found,
            scripts::FORMAT,
        ))
    }

    fn keys(&self, name: &Name) -> RedisKeys {
        RedisKeys::new(&self.prefix, name)
    }

    /// The holders in `keys` (slot keys, all on the server of `route`) and
    /// their leases' ends, read in one round trip.
    fn read_holders(&self, route: Route<'_>, keys: &[String]) -> Result<Vec<Entry>> {
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
                .call(route, "reading holders", FREE_CALL, |c| pipe.query(c))?;
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
    fn read_line(&self, keys: &RedisKeys) -> Result<Vec<Entry>> {
        let line = keys.line();
        let route = Route::Key(&line);
        let tokens: Vec<String> =
            self.link
                .borrow_mut()
                .call(route, "reading the line", FREE_CALL, |c| {
                    redis::cmd("ZRANGE").arg(&line).arg(0).arg(-1).query(c)
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
                .call(route, "reading waiters", FREE_CALL, |c| pipe.query(c))?;
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

    /// Drops the entries of `owners` from the line of `request.name` and from
    /// any slot they hold; with `replicas`, made good through a failover.
    fn drop_entries(
        &self,
        request: &Request,
        owners: &[Owner],
        replicas: Option<Replicas>,
    ) -> Result<()> {
        const DROPPING: &str = "dropping entries from the line";
        let keys = self.keys(&request.name);
        let line = keys.line();
        let mut invocation = self.scripts.evict.key(&line);
        invocation.key(keys.sharers()).key(keys.widest());
        invocation.arg(keys.base()).arg(WAKE_TTL.as_millis() as u64);
        for owner in owners {
            invocation.arg(&owner.token);
        }
        let _: i64 = failover::write(
            &self.link,
            replicas,
            Route::Key(&line),
            DROPPING,
            FREE_CALL,
            &invocation,
        )?;
        Ok(())
    }

    /// Every key matching `pattern` on the server of `route`, by SCAN (never
    /// KEYS, which blocks the server).
    fn scan(&self, route: Route<'_>, pattern: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) =
                self.link
                    .borrow_mut()
                    .call(route, "listing lock keys", FREE_CALL, |c| {
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

    /// Every primary (one, outside a Cluster).
    fn primaries(&self, what: &str) -> Result<Vec<String>> {
        Ok(self.link.borrow_mut().primaries(what)?)
    }

    /// Warnings about the servers' setup that can break locks (shown with `-v`).
    fn eviction_warning(&self) -> Result<Option<String>> {
        for at in self.primaries("reading the server's settings")? {
            let mut link = self.link.borrow_mut();
            let info: String = link.call(
                Route::Primary(&at),
                "reading the server's settings",
                FREE_CALL,
                |c| redis::cmd("INFO").arg("memory").query(c),
            )?;
            let policy = info
                .lines()
                .find_map(|line| line.strip_prefix("maxmemory_policy:"))
                .map(str::trim);
            if let Some(policy) = policy.filter(|policy| *policy != "noeviction") {
                return Ok(Some(format!(
                    "Redis at {} has maxmemory-policy {policy}: when it runs out of memory it may evict lock keys, letting a second holder in; use noeviction",
                    link.shown()
                )));
            }
        }
        Ok(None)
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
            kept_on: None,
        })?;
        let waiter = json(&WaiterRecord {
            name: request.name.to_string(),
            owner: owner.clone(),
            since,
        })?;
        let fence = keys.fence();
        let mut invocation = self.scripts.acquire.key(&fence);
        invocation
            .key(keys.line())
            .key(keys.ticket())
            .key(keys.sharers())
            .key(keys.widest());
        invocation
            .arg(&owner.token)
            .arg(holder)
            .arg(waiter)
            .arg(request.plan.ttl().as_millis() as u64)
            .arg(u8::from(request.queue))
            .arg(keys.base())
            .arg(&owner.process.boot_id)
            .arg(WAKE_TTL.as_millis() as u64)
            .arg(request.parallelism)
            .arg(request.mode().as_str());
        let sent = Moment::now();
        // Safe to repeat after a lost reply: a second run finds our slot ours, or our place kept.
        let replicas = self.replicas;
        let ((taken, first, second, watched), acknowledged): (Reply, u32) = self
            .link
            .borrow_mut()
            .call(Route::Key(&fence), ACQUIRING, FREE_CALL, |c| {
                replicas.invoke(c, &invocation, FREE_CALL)
            })?;
        if taken == 1 {
            let slot = RedisSlot {
                link: Rc::clone(&self.link),
                scripts: Rc::clone(&self.scripts),
                replicas,
                keys,
                slot: first as u32,
                fence: second as u64,
                token: owner.token.clone(),
                plan: request.plan,
                taken_at: sent,
            };
            if let Some(short) = replicas.short(acknowledged) {
                // A grant the replicas may lack is given back, and asked for
                // again, where the Sentinels name the primary then.
                let _ = slot.give_back();
                self.link.borrow_mut().forget_primary();
                return Err(self.link.borrow().failure(ACQUIRING, &short).into());
            }
            return Ok(Attempt::Taken(Box::new(slot)));
        }
        if taken == 2 {
            return Ok(Attempt::Waiting(Line::refused(first as u32)));
        }
        if taken == 3 {
            return Err(self.newer_format(u64::try_from(first).ok()));
        }
        // The script chose what we watch (docs/guide.md: "The waiting line"); of it, what runs here.
        let local_ahead = watched
            .iter()
            .filter_map(|record| serde_json::from_str::<Owner>(record).ok())
            .filter(|ahead| ahead.process.shares_host_with(&owner.process))
            .collect();
        Ok(Attempt::Waiting(Line {
            position: first as u32,
            local_ahead,
            // PTTL rounds down: one more millisecond and the key has certainly expired.
            moves_by: u64::try_from(second)
                .ok()
                .map(|pttl| sent + Duration::from_millis(pttl + 1)),
            watched: false,
            other_parallelism: None,
        }))
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        self.drop_entries(request, owners, None)
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        let block = until.remaining();
        if block < Duration::from_millis(1) {
            return Ok(Waited::Quiet);
        }
        let wake = self.keys(&request.name).wake(&request.owner.token);
        // BLPOP's own timeout ends the wait; the socket's only catches a server that went silent.
        let socket_timeout = block + FREE_CALL;
        let woken: Option<Option<(String, String)>> = self.link.borrow_mut().wait_for(
            Route::Key(&wake),
            "waiting for a release",
            socket_timeout,
            |c| {
                redis::cmd("BLPOP")
                    .arg(&wake)
                    .arg(format!("{:.3}", block.as_secs_f64()))
                    .query(c)
            },
        )?;
        // Cut short (None) or woken (Some(Some(_))): look again; Some(None): BLPOP timed out.
        Ok(match woken {
            Some(None) => Waited::Quiet,
            _ => Waited::Moved,
        })
    }

    fn leave(&mut self, request: &Request) -> Result<()> {
        // Dropping our place is what a dead waiter's eviction does; the slot we
        // do not take is nobody's to free. A failover must not lose it.
        let replicas = self.replicas;
        self.drop_entries(
            request,
            std::slice::from_ref(&request.owner),
            Some(replicas),
        )
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let mut entries = Vec::new();
        if let Some(name) = name {
            let keys = self.keys(name);
            let line = keys.line();
            let route = Route::Key(&line);
            entries.extend(self.read_holders(route, &self.scan(route, &keys.slot_pattern())?)?);
            entries.extend(self.read_line(&keys)?);
        } else {
            // A Cluster spreads the names over its primaries: each is read.
            for at in self.primaries("listing lock keys")? {
                let route = Route::Primary(&at);
                let slots = self.scan(route, &scripts::every_name(&self.prefix, "slot:*"))?;
                entries.extend(self.read_holders(route, &slots)?);
                for line in self.scan(route, &scripts::every_name(&self.prefix, "line"))? {
                    let base = line.strip_suffix("line").unwrap_or(&line);
                    entries.extend(self.read_line(&RedisKeys::from_base(base))?);
                }
            }
        }
        sort(&mut entries);
        Ok(entries)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let keys = self.keys(name);
        let line = keys.line();
        // Keys of a newer lockrun are left alone (docs/operating.md: "Upgrading").
        let format_key = keys.format();
        let format: Option<String> = self.link.borrow_mut().call(
            Route::Key(&format_key),
            "reading the format",
            FREE_CALL,
            |c| redis::cmd("GET").arg(&format_key).query(c),
        )?;
        if let Some(format) = format {
            let found = format.parse::<u64>().ok();
            if found.is_none_or(|found| found > u64::from(scripts::FORMAT)) {
                return Err(self.newer_format(found));
            }
        }
        let wanted: Vec<String> = match slot {
            Some(slot) => vec![keys.slot(slot)],
            None => self.scan(Route::Key(&line), &keys.slot_pattern())?,
        };
        let mut broken = Vec::new();
        for key in wanted {
            let value: Option<String> = self.link.borrow_mut().call(
                Route::Key(&key),
                "reading a holder",
                FREE_CALL,
                |c| redis::cmd("GET").arg(&key).query(c),
            )?;
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
                Release::Break,
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

/// What a release does with a slot. Its holder's release is remembered for
/// as long as the call may be made again, so that one whose answer was lost
/// is not found lost when made again; and made good through a failover with
/// the replicas given (see `failover::made_good`).
#[derive(Clone, Copy)]
pub(super) enum Release {
    /// Its holder frees it.
    Free(Replicas),
    /// Its holder keeps it taken this long (`--min-hold`).
    Keep(Duration, Replicas),
    /// A grant that too few replicas acknowledged is given back: it does not
    /// count, and where the replicas lack it there is nothing to free.
    GiveBack,
    /// An operator takes it away from its holder (`release --force`), whose
    /// own release must then find it lost: nothing is remembered.
    Break,
}

/// Releases the slot at `key` if it is held with `token`, waking the waiters
/// it is for. False when the slot was not (any longer) held with it.
pub(super) fn release(
    link: &RefCell<RedisLink>,
    scripts: &Scripts,
    keys: &RedisKeys,
    key: &str,
    token: &str,
    how: Release,
    timeout: Duration,
) -> Result<bool> {
    const RELEASING: &str = "releasing the lock";
    let (keep, remember, replicas) = match how {
        Release::Free(replicas) => (Duration::ZERO, timeout, Some(replicas)),
        Release::Keep(keep, replicas) => (keep, timeout, Some(replicas)),
        Release::GiveBack => (Duration::ZERO, timeout, None),
        Release::Break => (Duration::ZERO, Duration::ZERO, None),
    };
    let mut invocation = scripts.release.key(key);
    invocation
        .key(keys.line())
        .key(keys.sharers())
        .key(keys.widest());
    invocation
        .arg(token)
        .arg(keep.as_millis() as u64)
        .arg(epoch_millis(SystemTime::now() + keep))
        .arg(keys.base())
        .arg(WAKE_TTL.as_millis() as u64)
        .arg(remember.as_millis() as u64);
    let released: i64 = failover::write(
        link,
        replicas,
        Route::Key(key),
        RELEASING,
        timeout,
        &invocation,
    )?;
    Ok(released == 1)
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}

/// When a key with `pttl` milliseconds left expires; `None` for a key without a TTL.
fn expiry(now: u64, pttl: i64) -> Option<u64> {
    u64::try_from(pttl).ok().map(|left| now + left)
}
