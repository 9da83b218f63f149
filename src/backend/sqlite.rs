//! The SQLite backend (SPEC §4): one row per taken slot, holding a lease its
//! lockrun renews, changed only in short `BEGIN IMMEDIATE` transactions.
//! Expiry compares the clients' wall clocks, so the database belongs on one
//! host's local disk.

mod database;

use std::collections::HashSet;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, SystemTime};

use rand::RngExt;
use rusqlite::{Connection, TransactionBehavior, params};

use super::{Acquired, Backend, Holder, Renewal, Request, Wait};
use crate::error::Result;
use crate::identity::{Process, epoch_millis};
use crate::name::Name;
use crate::platform::clock::Moment;
use database::BUSY_TIMEOUT;

/// How often a waiter asks whether the database changed: `PRAGMA data_version`
/// is answered from the WAL index in shared memory, with no disk access and no
/// wait for writers.
const CHANGE_POLL: Duration = Duration::from_millis(5);
/// The longest one renewal waits for the write lock (less when the supervisor needs an answer sooner).
const RENEWAL_BUSY_TIMEOUT: Duration = Duration::from_millis(250);
/// How often a waiter looks whether a holder on this host has died.
const LIVENESS_POLL: Duration = Duration::from_millis(50);

pub struct SqliteBackend {
    path: PathBuf,
    conn: Connection,
    held: Option<Held>,
    /// What the last attempt that found no free slot saw; `wait` tries again once it changes.
    seen: Option<Seen>,
}

/// The slot this lockrun holds.
#[derive(Clone)]
struct Held {
    name: String,
    slot: u32,
    token: String,
    ttl: Duration,
}

struct Seen {
    data_version: i64,
    /// The earliest lease expiry among the holders, in epoch milliseconds.
    next_expiry: Option<u64>,
    /// Holders on this host: when one dies its slot is free at once.
    local: Vec<Process>,
}

/// A row of the holders table.
struct Row {
    holder: Holder,
    process: Process,
    /// Its lockrun has finished; the slot stays taken until expiry (`--min-hold`).
    released: bool,
}

enum Attempt {
    Took(Acquired),
    Busy(Seen),
}

impl SqliteBackend {
    /// Opens the database at `db`, or at the default path.
    pub fn open(db: Option<PathBuf>) -> Result<Self> {
        let (path, conn) = database::open(db)?;
        Ok(Self {
            path,
            conn,
            held: None,
            seen: None,
        })
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction, waiting at most `busy` for the write lock.
    fn transaction<T>(
        &mut self,
        what: &str,
        busy: Duration,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let fail = |err| database::failure(&self.path, what, &err);
        self.conn.busy_timeout(busy).map_err(fail)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let value = body(&tx).map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(value)
    }

    /// Whether something happened since the last attempt that may have freed a slot.
    fn worth_trying(&self, check_liveness: bool) -> Result<bool> {
        let Some(seen) = &self.seen else {
            return Ok(true);
        };
        let data_version: i64 = self
            .conn
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .map_err(|err| database::failure(&self.path, "watch for changes", &err))?;
        Ok(data_version != seen.data_version
            || seen.next_expiry.is_some_and(|at| now_millis() >= at)
            || (check_liveness && seen.local.iter().any(Process::is_gone)))
    }
}

impl Backend for SqliteBackend {
    fn try_acquire(&mut self, request: &Request) -> Result<Option<Acquired>> {
        let name = request.name.as_str();
        let slots = request.parallelism;
        let start = rand::rng().random_range(0..slots);
        let owner = &request.owner;
        let sent = Moment::now();
        let attempt = self.transaction("acquire a slot", BUSY_TIMEOUT, |tx| {
            let now = now_millis();
            let live = live_holders(tx, Some(name), now)?;
            let taken: HashSet<u32> = live.iter().map(|row| row.holder.slot).collect();
            let free = (0..slots)
                .map(|i| (start + i) % slots)
                .find(|slot| !taken.contains(slot));
            let Some(slot) = free else {
                // Read under the write lock: no commit can slip between what we saw and this.
                let data_version = tx.query_row("PRAGMA data_version", [], |row| row.get(0))?;
                return Ok(Attempt::Busy(Seen::new(
                    data_version,
                    &live,
                    &owner.process,
                )));
            };
            let fence: u64 = tx.query_row(
                "INSERT INTO fences (name, fence) VALUES (?1, 1)
                 ON CONFLICT (name) DO UPDATE SET fence = fence + 1
                 RETURNING fence",
                params![name],
                |row| row.get(0),
            )?;
            let process = &owner.process;
            tx.execute(
                "INSERT INTO holders (name, slot, token, fence, pid, start_time, boot_id, host,
                                      command, acquired_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    name,
                    slot,
                    owner.token,
                    fence,
                    process.pid,
                    process.start_time,
                    process.boot_id,
                    process.host,
                    owner.command,
                    now,
                    now + millis(request.ttl),
                ],
            )?;
            Ok(Attempt::Took(Acquired { slot, fence, sent }))
        })?;
        match attempt {
            Attempt::Took(acquired) => {
                self.held = Some(Held {
                    name: name.to_owned(),
                    slot: acquired.slot,
                    token: owner.token.clone(),
                    ttl: request.ttl,
                });
                self.seen = None;
                Ok(Some(acquired))
            }
            Attempt::Busy(seen) => {
                self.seen = Some(seen);
                Ok(None)
            }
        }
    }

    fn wait(&mut self, request: &Request, wait: Wait) -> Result<Option<Acquired>> {
        let until = wait
            .deadline
            .map_or(wait.step_until, |deadline| deadline.min(wait.step_until));
        let mut liveness_due = Moment::now() + LIVENESS_POLL;
        while !until.has_passed() {
            thread::sleep(CHANGE_POLL.min(until.remaining()));
            let check_liveness = liveness_due.has_passed();
            if check_liveness {
                liveness_due = Moment::now() + LIVENESS_POLL;
            }
            if self.worth_trying(check_liveness)?
                && let Some(acquired) = self.try_acquire(request)?
            {
                return Ok(Some(acquired));
            }
        }
        Ok(None)
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let Some(held) = self.held.clone() else {
            return Ok(Renewal::Lost);
        };
        // Short waits for the lock: the supervisor retries soon, and forwards signals in between.
        let busy = within.min(RENEWAL_BUSY_TIMEOUT);
        let renewed = self.transaction("renew the lease", busy, |tx| {
            let now = now_millis();
            // Only a lease that has not lapsed: a renewal never brings one back.
            tx.execute(
                "UPDATE holders SET expires_at = ?1
                 WHERE name = ?2 AND slot = ?3 AND token = ?4 AND released = 0 AND expires_at > ?5",
                params![
                    now + millis(held.ttl),
                    held.name,
                    held.slot,
                    held.token,
                    now
                ],
            )
        })?;
        Ok(Renewal::confirmed(renewed == 1))
    }

    fn release(&mut self, keep_until: Option<SystemTime>) -> Result<()> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let keep_until = keep_until.map(epoch_millis);
        self.transaction("release the slot", BUSY_TIMEOUT, |tx| {
            let now = now_millis();
            match keep_until.filter(|&until| until > now) {
                // The row outlives us until then (--min-hold); a lapsed lease is not revived.
                Some(until) => tx.execute(
                    "UPDATE holders SET expires_at = ?1, released = 1
                     WHERE name = ?2 AND slot = ?3 AND token = ?4 AND expires_at > ?5",
                    params![until, held.name, held.slot, held.token, now],
                ),
                None => tx.execute(
                    "DELETE FROM holders WHERE name = ?1 AND slot = ?2 AND token = ?3",
                    params![held.name, held.slot, held.token],
                ),
            }
        })?;
        Ok(())
    }

    fn holders(&mut self, name: Option<&Name>) -> Result<Vec<Holder>> {
        let name = name.map(Name::as_str);
        let rows = self.transaction("list the holders", BUSY_TIMEOUT, |tx| {
            live_holders(tx, name, now_millis())
        })?;
        Ok(rows.into_iter().map(|row| row.holder).collect())
    }

    fn break_leases(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Holder>> {
        self.transaction("break the leases", BUSY_TIMEOUT, |tx| {
            let mut broken = live_holders(tx, Some(name.as_str()), now_millis())?;
            broken.retain(|row| slot.is_none_or(|slot| slot == row.holder.slot));
            for row in &broken {
                delete_row(tx, &row.holder)?;
            }
            Ok(broken.into_iter().map(|row| row.holder).collect())
        })
    }
}

impl Seen {
    fn new(data_version: i64, live: &[Row], me: &Process) -> Self {
        Self {
            data_version,
            next_expiry: live.iter().filter_map(|row| row.holder.expires_at).min(),
            local: live
                .iter()
                .filter(|row| {
                    !row.released
                        && row.process.boot_id == me.boot_id
                        && row.process.host == me.host
                })
                .map(|row| row.process.clone())
                .collect(),
        }
    }
}

/// Purges the holders of `name` (or of all names) whose lease expired or, on
/// this host, whose lockrun is gone; returns the rest, by name and slot.
fn live_holders(tx: &Connection, name: Option<&str>, now: u64) -> rusqlite::Result<Vec<Row>> {
    tx.execute(
        "DELETE FROM holders WHERE (?1 IS NULL OR name = ?1) AND expires_at <= ?2",
        params![name, now],
    )?;
    let rows = tx
        .prepare(
            "SELECT name, slot, fence, pid, start_time, boot_id, host, command,
                    acquired_at, expires_at, released
             FROM holders WHERE ?1 IS NULL OR name = ?1 ORDER BY name, slot",
        )?
        .query_map(params![name], read_row)?
        .collect::<rusqlite::Result<Vec<Row>>>()?;
    let (gone, live): (Vec<Row>, Vec<Row>) = rows
        .into_iter()
        .partition(|row| !row.released && row.process.is_gone());
    for row in &gone {
        delete_row(tx, &row.holder)?;
    }
    Ok(live)
}

fn read_row(row: &rusqlite::Row) -> rusqlite::Result<Row> {
    let pid = row.get("pid")?;
    let host: String = row.get("host")?;
    Ok(Row {
        process: Process {
            pid,
            start_time: row.get("start_time")?,
            boot_id: row.get("boot_id")?,
            host: host.clone(),
        },
        holder: Holder {
            name: row.get("name")?,
            slot: row.get("slot")?,
            pid,
            host,
            command: row.get("command")?,
            acquired_at: row.get("acquired_at")?,
            expires_at: Some(row.get("expires_at")?),
            fence: row.get("fence")?,
        },
        released: row.get("released")?,
    })
}

fn delete_row(tx: &Connection, holder: &Holder) -> rusqlite::Result<usize> {
    tx.execute(
        "DELETE FROM holders WHERE name = ?1 AND slot = ?2",
        params![holder.name, holder.slot],
    )
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Owner;
    use crate::identity::new_token;

    fn request(name: &str, ttl: Duration) -> Request {
        Request {
            name: Name::parse(name).unwrap(),
            parallelism: 1,
            ttl,
            owner: Owner {
                token: new_token(),
                process: Process::current(),
                command: "test".into(),
            },
        }
    }

    fn backend(dir: &tempfile::TempDir) -> SqliteBackend {
        SqliteBackend::open(Some(dir.path().join("locks.sqlite3"))).unwrap()
    }

    #[test]
    fn a_lapsed_lease_is_never_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let mut holder = backend(&dir);
        let short = request("lapse", Duration::from_millis(50));
        assert!(holder.try_acquire(&short).unwrap().is_some());
        assert_eq!(
            holder.renew(Duration::from_secs(1)).unwrap(),
            Renewal::Renewed
        );
        thread::sleep(Duration::from_millis(120));
        // Nobody purged the expired row, yet the renewal must not revive it.
        assert_eq!(holder.renew(Duration::from_secs(1)).unwrap(), Renewal::Lost);
        let mut other = backend(&dir);
        let next = other.try_acquire(&request("lapse", Duration::from_secs(30)));
        assert_eq!(next.unwrap().map(|a| a.fence), Some(2));
    }

    #[test]
    fn release_touches_only_our_own_row() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = backend(&dir);
        let short = request("mine", Duration::from_millis(50));
        assert!(first.try_acquire(&short).unwrap().is_some());
        thread::sleep(Duration::from_millis(120));
        let mut second = backend(&dir);
        assert!(
            second
                .try_acquire(&request("mine", Duration::from_secs(30)))
                .unwrap()
                .is_some()
        );
        // The first holder's lease lapsed and the slot moved on: its release (even with
        // --min-hold) leaves the new holder alone.
        first
            .release(Some(SystemTime::now() + Duration::from_secs(60)))
            .unwrap();
        let holders = second.holders(None).unwrap();
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].fence, 2);
        assert_eq!(
            second.renew(Duration::from_secs(1)).unwrap(),
            Renewal::Renewed
        );
    }
}
