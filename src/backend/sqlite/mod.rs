//! The SQLite backend (README: "SQLite backend"): one row per taken slot,
//! holding a lease its lockrun renews, and one row per waiter, in ticket order;
//! changed only in short `BEGIN IMMEDIATE` transactions. Whoever frees a slot
//! grants it to the waiters at the head of the line that the line lets in
//! (all the sharers there at once) in the same transaction, and rings them:
//! they find their slots with a read, not one write after another. Expiry
//! compares the clients' wall clocks, so the database belongs on one host's local disk.

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
    Abilities, Attempt, Common, Entry, Line, Mode, Owner, Request, Store, Waited, admitted,
    capacity, refuses,
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
    /// The lease of a slot granted to it, in milliseconds; unknown in rows of older lockruns.
    ttl: Option<u64>,
}

/// A slot granted to us while we waited: its number, fence, and when it was granted.
struct Granted {
    slot: u32,
    fence: u64,
    acquired_at: u64,
}

/// One look at the line of a name, in one transaction.
struct LineRows {
    holders: Vec<HolderRow>,
    /// Our ticket, if our row is there.
    ticket: Option<i64>,
    /// The slot granted to us, if one was.
    granted: Option<Granted>,
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
        let granted = tx
            .query_row(
                "SELECT slot, fence, acquired_at FROM holders
                 WHERE name = ?1 AND token = ?2 AND released = 0 AND expires_at > ?3",
                params![name, token, now],
                |row| {
                    Ok(Granted {
                        slot: row.get(0)?,
                        fence: row.get(1)?,
                        acquired_at: row.get(2)?,
                    })
                },
            )
            .optional()?;
        Ok(Self {
            holders: live_holders(tx, Some(name), now, SCHEMA_VERSION)?,
            ahead: live_waiters(tx, Some(name), ticket, now, SCHEMA_VERSION)?,
            ticket,
            granted,
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
        lowest_free(&self.holders, request.capacity())
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
        let (look, taken, tell) = self.db.write("acquire a slot", BUSY_TIMEOUT, |tx| {
            let now = now_millis();
            purge_expired(tx, name, now)?;
            let look = LineRows::take(tx, name, &owner.token, now)?;
            if look.granted.is_some() || look.other_parallelism(request.parallelism).is_some() {
                return Ok((look, None, Vec::new()));
            }
            let Some(slot) = look.free_slot(request) else {
                match look.ticket {
                    Some(_) => refresh_waiter(tx, &owner.token, now + ttl)?,
                    None if request.queue => join(tx, name, owner, now, ttl)?,
                    None => {}
                }
                return Ok((look, None, Vec::new()));
            };
            let fence = take_slot(tx, name, owner, slot, now, now + ttl)?;
            Ok((look, Some((slot, fence)), moved(tx, name, now)?))
        })?;
        ring(&tell);
        if let Some((slot, fence)) = taken {
            return Ok(self.slot(request, slot, fence, sent));
        }
        if let Some(granted) = look.granted {
            return Ok(self.granted(request, &granted));
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

    /// Slot `slot` with `fence`, whose lease runs from `taken_at`.
    fn slot(&mut self, request: &Request, slot: u32, fence: u64, taken_at: Moment) -> Attempt {
        self.in_line = false;
        Attempt::Taken(Box::new(SqliteSlot {
            db: Rc::clone(&self.db),
            name: request.name.to_string(),
            slot,
            fence,
            token: request.owner.token.clone(),
            ttl: request.plan.ttl(),
            taken_at,
        }))
    }

    /// The slot granted to us, whose lease runs from its grant (a millisecond
    /// earlier, for the rounding of the wall clock's milliseconds).
    fn granted(&mut self, request: &Request, granted: &Granted) -> Attempt {
        let taken_at = moment_at(granted.acquired_at) - Duration::from_millis(1);
        self.slot(request, granted.slot, granted.fence, taken_at)
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
            if let Some(granted) = &look.granted {
                return Ok(self.granted(request, granted));
            }
            if look.ticket.is_some() && look.free_slot(request).is_none() {
                self.seen = look.data_version;
                return Ok(Attempt::Waiting(look.line(request, true)));
            }
        }
        self.act(request)
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let name = request.name.as_str();
        let tell = self.db.write("drop dead entries", BUSY_TIMEOUT, |tx| {
            for owner in owners {
                drop_entries(tx, name, &owner.token)?;
            }
            moved(tx, name, now_millis())
        })?;
        ring(&tell);
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
            let name = request.name.as_str();
            // A slot granted to us meanwhile goes back to the line too.
            let tell = self.db.write("leave the line", BUSY_TIMEOUT, |tx| {
                drop_entries(tx, name, &request.owner.token)?;
                moved(tx, name, now_millis())
            })?;
            ring(&tell);
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
        let (broken, tell) = self.db.write("break the leases", BUSY_TIMEOUT, |tx| {
            let mut broken = live_holders(tx, Some(name.as_str()), now_millis(), SCHEMA_VERSION)?;
            broken.retain(|row| slot.is_none_or(|slot| slot == row.slot));
            for row in &broken {
                tx.execute(
                    "DELETE FROM holders WHERE name = ?1 AND slot = ?2",
                    params![name.as_str(), row.slot],
                )?;
            }
            let tell = moved(tx, name.as_str(), now_millis())?;
            Ok((broken.iter().map(HolderRow::entry).collect(), tell))
        })?;
        ring(&tell);
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

/// Puts `owner` at the end of the line of `name`, its place kept for `ttl` ms.
fn join(tx: &Connection, name: &str, owner: &Owner, now: u64, ttl: u64) -> rusqlite::Result<()> {
    let process = &owner.process;
    tx.execute(
        "INSERT INTO waiters (name, token, pid, start_time, boot_id, host, command, since, expires_at,
                              parallelism, mode, ttl)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            name,
            owner.token,
            process.pid,
            process.start_time,
            process.boot_id,
            process.host,
            owner.command,
            now,
            now + ttl,
            owner.parallelism,
            owner.mode.as_str(),
            ttl,
        ],
    )?;
    Ok(())
}

/// Gives `owner` slot `slot` of `name` until `expires_at`, taking it out of
/// the line: the acquisition's fence.
fn take_slot(
    tx: &Connection,
    name: &str,
    owner: &Owner,
    slot: u32,
    now: u64,
    expires_at: u64,
) -> rusqlite::Result<u64> {
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
            expires_at,
            owner.parallelism,
            owner.mode.as_str(),
        ],
    )?;
    Ok(fence)
}

/// Drops the holder (unless kept by `--min-hold`) and the waiter of `name` that `token` is.
fn drop_entries(tx: &Connection, name: &str, token: &str) -> rusqlite::Result<()> {
    tx.execute(
        "DELETE FROM holders WHERE name = ?1 AND token = ?2 AND released = 0",
        params![name, token],
    )?;
    tx.execute(
        "DELETE FROM waiters WHERE name = ?1 AND token = ?2",
        params![name, token],
    )?;
    Ok(())
}

/// After a change to the line of `name`: grants the slots it frees and says
/// whom to ring, those it granted slots to and the first two places.
fn moved(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<Vec<String>> {
    let mut tell = grant(tx, name, now)?;
    tell.extend(front(tx, name, now)?);
    Ok(tell)
}

/// Grants free slots of `name`, in line order, to the waiters at the head of
/// its line whom the line lets in (the rule of `Request::admitted`, for each
/// with those ahead of it let in first): every sharer there at once. Their
/// leases run for their TTL from now (to the end of their places, for rows of
/// older lockruns). Their tokens.
fn grant(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<Vec<String>> {
    let mut holders = live_holders(tx, Some(name), now, SCHEMA_VERSION)?;
    let mut granted = Vec::new();
    let mut after = None;
    while let Some((ticket, waiter)) = next_waiter(tx, name, after, now)? {
        let owner = &waiter.owner;
        let parallelism = owner.parallelism.unwrap_or(1);
        let modes = holders.iter().map(|row| row.owner.mode);
        let let_in = admitted(owner.mode, parallelism, modes, []);
        let free = lowest_free(&holders, capacity(owner.mode, parallelism));
        let Some(slot) = free.filter(|_| let_in) else {
            break;
        };
        let expires_at = waiter.ttl.map_or(waiter.expires_at, |ttl| now + ttl);
        let fence = take_slot(tx, name, owner, slot, now, expires_at)?;
        granted.push(owner.token.clone());
        holders.push(HolderRow {
            name: waiter.name,
            slot,
            owner: waiter.owner,
            fence,
            acquired_at: now,
            expires_at,
            released: false,
        });
        after = Some(ticket);
    }
    Ok(granted)
}

/// The lowest slot number below `capacity` that none of `holders` has.
fn lowest_free(holders: &[HolderRow], capacity: u32) -> Option<u32> {
    let taken: HashSet<u32> = holders.iter().map(|row| row.slot).collect();
    (0..capacity).find(|slot| !taken.contains(slot))
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
        "SELECT {} FROM waiters
         WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR ticket < ?2) AND expires_at > ?3
         ORDER BY name, ticket",
        waiter_columns(version)
    ))?
    .query_map(params![name, before, now], waiter_row)?
    .collect()
}

/// The first waiter of `name` behind ticket `after` (from the head without)
/// whose place has not lapsed, with its ticket.
fn next_waiter(
    tx: &Connection,
    name: &str,
    after: Option<i64>,
    now: u64,
) -> rusqlite::Result<Option<(i64, WaiterRow)>> {
    tx.query_row(
        &format!(
            "SELECT ticket, {} FROM waiters
             WHERE name = ?1 AND (?2 IS NULL OR ticket > ?2) AND expires_at > ?3
             ORDER BY ticket LIMIT 1",
            waiter_columns(SCHEMA_VERSION)
        ),
        params![name, after, now],
        |row| Ok((row.get("ticket")?, waiter_row(row)?)),
    )
    .optional()
}

/// The columns [`waiter_row`] reads, in a database of schema `version`.
fn waiter_columns(version: u32) -> String {
    let ttl = if version >= MODES_SINCE {
        "ttl"
    } else {
        "NULL AS ttl"
    };
    format!(
        "name, token, pid, start_time, boot_id, host, command, since, expires_at, {ttl}, {}",
        later_columns(version)
    )
}

fn waiter_row(row: &rusqlite::Row) -> rusqlite::Result<WaiterRow> {
    Ok(WaiterRow {
        name: row.get("name")?,
        owner: owner(row)?,
        since: row.get("since")?,
        expires_at: row.get("expires_at")?,
        ttl: row.get("ttl")?,
    })
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

/// The moment on the monotonic clock when the wall clock reaches (or reached)
/// `millis` since the Unix epoch.
fn moment_at(millis: u64) -> Moment {
    let now = now_millis();
    if millis >= now {
        Moment::now() + Duration::from_millis(millis - now)
    } else {
        Moment::now() - Duration::from_millis(now - millis)
    }
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
