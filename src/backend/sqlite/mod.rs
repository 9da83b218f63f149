//! The SQLite backend (README: "SQLite backend"): one row per taken slot,
//! holding a lease its lockrun renews, and one row per waiter, in ticket order;
//! changed only in short `BEGIN IMMEDIATE` transactions. Expiry compares the
//! clients' wall clocks, so the database belongs on one host's local disk.

mod database;
mod slot;

use std::collections::HashSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::thread;
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, params};

use super::record::{Ahead, line, sort, waiting};
use super::{
    Abilities, Attempt, Common, Entry, Line, Mode, Owner, Request, Store, Waited, refuses,
};
use crate::error::Result;
use crate::identity::{Process, epoch_millis};
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::platform::doorbell::{self, Doorbell};
use database::{BUSY_TIMEOUT, Database, MODES_SINCE, PARALLELISM_SINCE, SCHEMA_VERSION};
use slot::SqliteSlot;

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    #[arg(
        long,
        env = "LOCKRUN_DB",
        value_name = "PATH",
        help = "SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]"
    )]
    pub db: Option<PathBuf>,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        Ok(Box::new(SqliteStore {
            db: Rc::new(database::open(self.db.as_deref(), common.create)?),
            in_line: false,
            refresh_due: None,
            seen: 0,
            doorbell: None,
        }))
    }
}

/// How often a waiter looks for a change when the write-ahead log cannot be
/// rung: `PRAGMA data_version` is answered from shared memory, with no disk access.
const CHANGE_POLL: Duration = Duration::from_millis(5);
/// The longest one renewal waits for the write lock (less when the supervisor needs an answer sooner).
const RENEWAL_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

struct SqliteStore {
    db: Rc<Database>,
    /// Whether we joined the line.
    in_line: bool,
    /// When our place must be refreshed, lest it lapse with the TTL.
    refresh_due: Option<Moment>,
    /// `PRAGMA data_version` at our last look.
    seen: i64,
    /// Rung by whoever moves the line in a way that concerns us (README: "SQLite backend").
    doorbell: Option<Doorbell>,
}

/// A holder's row.
struct HolderRow {
    name: String,
    slot: u32,
    owner: Owner,
    fence: u64,
    acquired_at: u64,
    expires_at: u64,
    /// Its lockrun has finished; the slot stays taken until expiry (`--min-hold`).
    released: bool,
}

/// A waiter's row.
struct WaiterRow {
    name: String,
    owner: Owner,
    since: u64,
    expires_at: u64,
}

/// One look at the line of a name, in one transaction.
struct LineRows {
    holders: Vec<HolderRow>,
    /// Our ticket, if our row is there.
    ticket: Option<i64>,
    /// Waiters ahead of us (all of them when we are not in line).
    ahead: Vec<WaiterRow>,
    data_version: i64,
}

impl LineRows {
    fn take(tx: &Connection, name: &str, token: &str, now: u64) -> rusqlite::Result<Self> {
        let ticket: Option<i64> = tx
            .query_row(
                "SELECT ticket FROM waiters WHERE token = ?1 AND expires_at > ?2",
                params![token, now],
                |row| row.get(0),
            )
            .optional()?;
        Ok(Self {
            holders: live_holders(tx, Some(name), now, SCHEMA_VERSION)?,
            ahead: live_waiters(tx, Some(name), ticket, now, SCHEMA_VERSION)?,
            ticket,
            data_version: tx.query_row("PRAGMA data_version", [], |row| row.get(0))?,
        })
    }

    /// The lowest free slot, if the line lets us have one (README: "Shared locks").
    fn free_slot(&self, request: &Request) -> Option<u32> {
        let holders = self.holders.iter().map(|row| row.owner.mode);
        let ahead = self.ahead.iter().map(|row| row.owner.mode);
        if !request.admitted(holders, ahead) {
            return None;
        }
        let taken: HashSet<u32> = self.holders.iter().map(|row| row.slot).collect();
        (0..request.capacity()).find(|slot| !taken.contains(slot))
    }

    /// The `-p` of a holder or a waiter ahead of us, when it is not ours.
    fn other_parallelism(&self, ours: u32) -> Option<u32> {
        let holders = self.holders.iter().map(|row| row.owner.parallelism);
        let waiters = self.ahead.iter().map(|row| row.owner.parallelism);
        holders
            .chain(waiters)
            .find(|&theirs| refuses(theirs, ours))
            .flatten()
    }

    fn line(&self, request: &Request, in_line: bool) -> Line {
        let mut places = Places::default();
        let places_ahead: Vec<u32> = self
            .ahead
            .iter()
            .map(|row| places.next(row.owner.mode))
            .collect();
        let (position, place) = if in_line {
            (self.ahead.len() as u32 + 1, places.next(request.mode()))
        } else {
            (0, 0)
        };
        let holders: Vec<Ahead> = self
            .holders
            .iter()
            .map(|row| Ahead {
                owner: &row.owner,
                kept: row.released,
                ends: moment_at(row.expires_at),
            })
            .collect();
        let just_ahead: Vec<Ahead> = self
            .ahead
            .iter()
            .zip(places_ahead)
            .filter(|&(_, theirs)| theirs + 1 == place)
            .map(|(row, _)| Ahead {
                owner: &row.owner,
                kept: false,
                ends: moment_at(row.expires_at),
            })
            .collect();
        line(
            &request.owner.process,
            position,
            place,
            &holders,
            &just_ahead,
        )
    }
}

impl SqliteStore {
    /// The write transaction that takes a slot or keeps our place.
    fn act(&mut self, request: &Request) -> Result<Attempt> {
        let name = request.name.as_str();
        let owner = &request.owner;
        let ttl = millis(request.plan.ttl());
        let sent = Moment::now();
        let (look, taken, front) = self.db.write("acquire a slot", BUSY_TIMEOUT, |tx| {
            let now = now_millis();
            purge_expired(tx, name, now)?;
            let look = LineRows::take(tx, name, &owner.token, now)?;
            if look.other_parallelism(request.parallelism).is_some() {
                return Ok((look, None, Vec::new()));
            }
            let Some(slot) = look.free_slot(request) else {
                match look.ticket {
                    Some(_) => refresh_waiter(tx, &owner.token, now + ttl)?,
                    None if request.queue => join(tx, name, owner, now, now + ttl)?,
                    None => {}
                }
                return Ok((look, None, Vec::new()));
            };
            tx.execute("DELETE FROM waiters WHERE token = ?1", params![owner.token])?;
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
                                      command, acquired_at, expires_at, parallelism, mode)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
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
                    now + ttl,
                    owner.parallelism,
                    owner.mode.as_str(),
                ],
            )?;
            Ok((look, Some((slot, fence)), front(tx, name, now)?))
        })?;
        ring(&front);
        if let Some((slot, fence)) = taken {
            return Ok(Attempt::Taken(Box::new(SqliteSlot {
                db: Rc::clone(&self.db),
                name: name.to_owned(),
                slot,
                fence,
                token: owner.token.clone(),
                ttl: request.plan.ttl(),
                taken_at: sent,
            })));
        }
        if let Some(theirs) = look.other_parallelism(request.parallelism) {
            self.in_line = look.ticket.is_some();
            return Ok(Attempt::Waiting(Line::refused(theirs)));
        }
        let in_line = look.ticket.is_some() || request.queue;
        self.in_line = in_line;
        self.refresh_due = Some(Moment::now() + request.plan.keep_place_every());
        // Our own commit changed the data version: what we saw is what we wrote.
        self.seen = self.db.data_version()?;
        Ok(Attempt::Waiting(look.line(request, in_line)))
    }
}

impl Store for SqliteStore {
    fn location(&self) -> String {
        format!("SQLite database {}", self.db.path.display())
    }

    fn abilities(&self) -> Abilities {
        Abilities::LEASES_THAT_TELL
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        if self.in_line && !self.refresh_due.is_some_and(Moment::has_passed) {
            // A look that changes nothing takes no write lock and wakes nobody.
            let look = self.db.read("look at the line", |tx| {
                LineRows::take(
                    tx,
                    request.name.as_str(),
                    &request.owner.token,
                    now_millis(),
                )
            })?;
            if look.ticket.is_some() && look.free_slot(request).is_none() {
                self.seen = look.data_version;
                return Ok(Attempt::Waiting(look.line(request, true)));
            }
        }
        self.act(request)
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let name = request.name.as_str();
        let front = self.db.write("drop dead entries", BUSY_TIMEOUT, |tx| {
            for owner in owners {
                tx.execute(
                    "DELETE FROM holders WHERE name = ?1 AND token = ?2 AND released = 0",
                    params![name, owner.token],
                )?;
                tx.execute(
                    "DELETE FROM waiters WHERE name = ?1 AND token = ?2",
                    params![name, owner.token],
                )?;
            }
            front(tx, name, now_millis())
        })?;
        ring(&front);
        Ok(())
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        if self.doorbell.is_none() {
            // Without a doorbell, looking for any change every few milliseconds is the fallback.
            self.doorbell = Doorbell::new(&request.owner.token).ok();
        }
        // A ring before the doorbell was there is lost: a change since our look counts too.
        if self.db.data_version()? != self.seen {
            return Ok(Waited::Moved);
        }
        let rung = if let Some(doorbell) = &self.doorbell {
            // A doorbell that fails to wait is taken for a ring: the loop looks again.
            doorbell.wait(until.remaining()).unwrap_or(true)
        } else {
            while self.db.data_version()? == self.seen && !until.has_passed() {
                thread::sleep(CHANGE_POLL.min(until.remaining()));
            }
            self.db.data_version()? != self.seen
        };
        Ok(Waited::told(rung))
    }

    fn leave(&mut self, request: &Request) -> Result<()> {
        if std::mem::take(&mut self.in_line) {
            let front = self.db.write("leave the line", BUSY_TIMEOUT, |tx| {
                tx.execute(
                    "DELETE FROM waiters WHERE token = ?1",
                    params![request.owner.token],
                )?;
                front(tx, request.name.as_str(), now_millis())
            })?;
            ring(&front);
        }
        Ok(())
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let name = name.map(Name::as_str);
        let now = now_millis();
        let (holders, waiters) = self.db.read("list the holders", |tx| {
            let version: u32 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
            // A database from before the waiting line has no waiters.
            let waiters = if version >= 2 {
                live_waiters(tx, name, None, now, version)?
            } else {
                Vec::new()
            };
            Ok((live_holders(tx, name, now, version)?, waiters))
        })?;
        let mut entries: Vec<Entry> = holders
            .iter()
            .filter(|row| row.released || !row.owner.process.is_gone())
            .map(HolderRow::entry)
            .collect();
        entries.extend(waiting(waiters.iter().map(|row| {
            (
                row.name.as_str(),
                &row.owner,
                row.since,
                Some(row.expires_at),
            )
        })));
        sort(&mut entries);
        Ok(entries)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let (broken, front) = self.db.write("break the leases", BUSY_TIMEOUT, |tx| {
            let mut broken = live_holders(tx, Some(name.as_str()), now_millis(), SCHEMA_VERSION)?;
            broken.retain(|row| slot.is_none_or(|slot| slot == row.slot));
            for row in &broken {
                tx.execute(
                    "DELETE FROM holders WHERE name = ?1 AND slot = ?2",
                    params![name.as_str(), row.slot],
                )?;
            }
            let front = front(tx, name.as_str(), now_millis())?;
            Ok((broken.iter().map(HolderRow::entry).collect(), front))
        })?;
        ring(&front);
        Ok(broken)
    }
}

impl HolderRow {
    fn entry(&self) -> Entry {
        Entry::holder(&self.name, self.slot, &self.owner, Some(self.acquired_at))
            .fenced(self.fence)
            .expiring(Some(self.expires_at))
    }
}

fn join(
    tx: &Connection,
    name: &str,
    owner: &Owner,
    now: u64,
    expires_at: u64,
) -> rusqlite::Result<()> {
    let process = &owner.process;
    tx.execute(
        "INSERT INTO waiters (name, token, pid, start_time, boot_id, host, command, since, expires_at,
                              parallelism, mode)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            name,
            owner.token,
            process.pid,
            process.start_time,
            process.boot_id,
            process.host,
            owner.command,
            now,
            expires_at,
            owner.parallelism,
            owner.mode.as_str(),
        ],
    )?;
    Ok(())
}

/// The tokens of the waiters in the first two places of the line of `name`:
/// when the line moves, those at the head may take a slot (every sharer there
/// at once) and those second must watch the head (README: "The waiting line").
fn front(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<Vec<String>> {
    let mut statement = tx.prepare(
        "SELECT token, mode FROM waiters WHERE name = ?1 AND expires_at > ?2 ORDER BY ticket",
    )?;
    let waiters = statement.query_map(params![name, now], |row| {
        Ok((
            row.get::<_, String>(0)?,
            Mode::parse(&row.get::<_, String>(1)?),
        ))
    })?;
    let mut places = Places::default();
    let mut front = Vec::new();
    for waiter in waiters {
        let (token, mode) = waiter?;
        if places.next(mode) > 2 {
            break;
        }
        front.push(token);
    }
    Ok(front)
}

/// Counts the places of a line, waiter by waiter in line order: consecutive
/// sharers stand in one place, as they go together (README: "Shared locks");
/// an exclusive waiter stands alone.
#[derive(Default)]
struct Places {
    place: u32,
    last: Option<Mode>,
}

impl Places {
    /// The place, from 1, of the next waiter, who waits in `mode`.
    fn next(&mut self, mode: Mode) -> u32 {
        if mode == Mode::Exclusive || self.last != Some(Mode::Shared) {
            self.place += 1;
        }
        self.last = Some(mode);
        self.place
    }
}

/// Wakes the waiters of `tokens`, once what they must see is committed.
fn ring(tokens: &[String]) {
    for token in tokens {
        doorbell::ring(token);
    }
}

/// Drops the rows of `name` whose leases or places in line have lapsed.
fn purge_expired(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<()> {
    tx.execute(
        "DELETE FROM holders WHERE name = ?1 AND expires_at <= ?2",
        params![name, now],
    )?;
    tx.execute(
        "DELETE FROM waiters WHERE name = ?1 AND expires_at <= ?2",
        params![name, now],
    )?;
    Ok(())
}

fn refresh_waiter(tx: &Connection, token: &str, expires_at: u64) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE waiters SET expires_at = ?1 WHERE token = ?2",
        params![expires_at, token],
    )?;
    Ok(())
}

/// The holders of `name` (or of every name) whose leases have not expired, by
/// name and slot, in a database of schema `version`.
fn live_holders(
    tx: &Connection,
    name: Option<&str>,
    now: u64,
    version: u32,
) -> rusqlite::Result<Vec<HolderRow>> {
    tx.prepare(&format!(
        "SELECT name, slot, token, fence, pid, start_time, boot_id, host, command,
                acquired_at, expires_at, released, {}
         FROM holders WHERE (?1 IS NULL OR name = ?1) AND expires_at > ?2 ORDER BY name, slot",
        later_columns(version)
    ))?
    .query_map(params![name, now], |row| {
        Ok(HolderRow {
            name: row.get("name")?,
            slot: row.get("slot")?,
            owner: owner(row)?,
            fence: row.get("fence")?,
            acquired_at: row.get("acquired_at")?,
            expires_at: row.get("expires_at")?,
            released: row.get("released")?,
        })
    })?
    .collect()
}

/// The waiters of `name` (or of every name) whose places have not lapsed, in
/// line order; only those ahead of `before` when given; in a database of schema `version`.
fn live_waiters(
    tx: &Connection,
    name: Option<&str>,
    before: Option<i64>,
    now: u64,
    version: u32,
) -> rusqlite::Result<Vec<WaiterRow>> {
    tx.prepare(&format!(
        "SELECT name, token, pid, start_time, boot_id, host, command, since, expires_at, {}
         FROM waiters
         WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR ticket < ?2) AND expires_at > ?3
         ORDER BY name, ticket",
        later_columns(version)
    ))?
    .query_map(params![name, before, now], |row| {
        Ok(WaiterRow {
            name: row.get("name")?,
            owner: owner(row)?,
            since: row.get("since")?,
            expires_at: row.get("expires_at")?,
        })
    })?
    .collect()
}

fn owner(row: &rusqlite::Row) -> rusqlite::Result<Owner> {
    Ok(Owner {
        token: row.get("token")?,
        process: Process {
            pid: row.get("pid")?,
            start_time: row.get("start_time")?,
            boot_id: row.get("boot_id")?,
            host: row.get("host")?,
        },
        command: row.get("command")?,
        mode: Mode::parse(&row.get::<_, String>("mode")?),
        parallelism: row.get("parallelism")?,
    })
}

/// The `parallelism` and `mode` columns, or what a database older than them
/// means by their absence (no known `-p`, exclusive): `status` reads an older
/// database without bringing it up to date (it never writes).
fn later_columns(version: u32) -> String {
    let parallelism = if version >= PARALLELISM_SINCE {
        "parallelism"
    } else {
        "NULL AS parallelism"
    };
    let mode = if version >= MODES_SINCE {
        "mode"
    } else {
        "'exclusive' AS mode"
    };
    format!("{parallelism}, {mode}")
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// The moment on the monotonic clock when the wall clock reaches `millis` since the Unix epoch.
fn moment_at(millis: u64) -> Moment {
    Moment::now() + Duration::from_millis(millis.saturating_sub(now_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use database::tests::{VERSION_3_ROWS, database_of_version};

    #[test]
    fn status_reads_an_older_database_as_it_is_its_rows_exclusive() {
        let (_dir, path) = database_of_version(3, VERSION_3_ROWS);
        let common = Common {
            prefix: "lockrun",
            create: false,
        };
        let mut store = Options { db: Some(path) }.open(&common).unwrap();
        let entries = store.list(None).unwrap();
        let modes: Vec<(Option<u32>, Mode)> = entries
            .iter()
            .map(|entry| (entry.slot, entry.mode))
            .collect();
        assert_eq!(modes, [(Some(0), Mode::Exclusive), (None, Mode::Exclusive)]);
    }
}
