//! The SQLite backend (docs/backends/sqlite.md: "SQLite backend"): one row per taken slot,
//! holding a lease its lockrun renews, and one row per waiter, in ticket order;
//! changed only in short `BEGIN IMMEDIATE` transactions. Whoever frees a slot
//! grants it to the waiters at the head of the line that the line lets in
//! (all the sharers there at once) in the same transaction, and rings them:
//! they find their slots with a read, not one write after another. No wall
//! clock decides an expiry: each row's end is dated on the boot clock of the
//! kernel that wrote it (see `judge`).

mod database;
mod judge;
mod line;
mod look;
mod rows;
mod slot;

use std::path::PathBuf;
use std::rc::Rc;
use std::thread;
use std::time::Duration;

use rusqlite::params;

use super::record::{sort, waiting};
use super::{Abilities, Attempt, Common, Entry, Line, Owner, Request, Store, Waited};
use crate::duration::millis;
use crate::error::Result;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::platform::doorbell::Doorbell;
use database::{BUSY_TIMEOUT, Database, SCHEMA_VERSION};
use judge::Judge;
use line::{drop_entries, join, moved, purge_ended, redate, refresh_waiter, ring, take_slot};
use look::LineRows;
use rows::{HolderRow, live_holders, live_waiters};
use slot::SqliteSlot;

/// The database's schema version (`PRAGMA user_version`); every older one is upgraded.
pub const FORMAT: super::Format = super::Format {
    backend: "sqlite",
    kind: "schema",
    writes: SCHEMA_VERSION,
    reads_from: 1,
};

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
            judge: Rc::new(Judge::new()),
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

struct SqliteStore {
    db: Rc<Database>,
    judge: Rc<Judge>,
    /// Whether we joined the line.
    in_line: bool,
    /// When our place must be refreshed, lest it lapse with the TTL.
    refresh_due: Option<Moment>,
    /// `PRAGMA data_version` at our last look.
    seen: i64,
    /// Rung by whoever moves the line in a way that concerns us (docs/backends/sqlite.md: "SQLite backend").
    doorbell: Option<Doorbell>,
}

impl SqliteStore {
    /// The write transaction that takes a slot or keeps our place.
    fn act(&mut self, request: &Request) -> Result<Attempt> {
        let name = request.name.as_str();
        let owner = &request.owner;
        let ttl = millis(request.plan.ttl());
        let sent = Moment::now();
        let (look, taken, tell) = self.db.write("acquire a slot", BUSY_TIMEOUT, |tx| {
            let now = self.judge.now();
            purge_ended(tx, name, &now)?;
            let look = LineRows::take(tx, name, &owner.token, &now)?;
            if let Some(granted) = &look.granted {
                let (slot, fence) = (granted.slot, granted.fence);
                let taken_at = if let Some(at) = granted.at {
                    at
                } else {
                    // Granted by a lockrun of another boot, on its clock:
                    // dated anew, the lease runs from this request on ours.
                    redate(tx, name, slot, &owner.token, &now, ttl, false)?;
                    sent
                };
                return Ok((look, Some((slot, fence, taken_at)), Vec::new()));
            }
            if look.other_parallelism(request.parallelism).is_some() {
                return Ok((look, None, Vec::new()));
            }
            let Some(slot) = look.free_slot(request) else {
                match look.ticket {
                    Some(_) => refresh_waiter(tx, &owner.token, &now, ttl)?,
                    None if request.queue => join(tx, name, owner, &now, ttl)?,
                    None => {}
                }
                return Ok((look, None, Vec::new()));
            };
            let fence = take_slot(tx, name, owner, slot, &now, ttl)?;
            Ok((look, Some((slot, fence, sent)), moved(tx, name, &now)?))
        })?;
        ring(&tell);
        if let Some((slot, fence, taken_at)) = taken {
            return Ok(self.slot(request, slot, fence, taken_at));
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
            judge: Rc::clone(&self.judge),
            name: request.name.to_string(),
            slot,
            fence,
            token: request.owner.token.clone(),
            ttl: request.plan.ttl(),
            taken_at,
        }))
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
                let now = self.judge.now();
                LineRows::take(tx, request.name.as_str(), &request.owner.token, &now)
            })?;
            if let Some(granted) = &look.granted
                && let Some(at) = granted.at
            {
                return Ok(self.slot(request, granted.slot, granted.fence, at));
            }
            // A slot granted to us on another boot's clock is dated anew by the write below.
            if look.granted.is_none() && look.ticket.is_some() && look.free_slot(request).is_none()
            {
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
            moved(tx, name, &self.judge.now())
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
                moved(tx, name, &self.judge.now())
            })?;
            ring(&tell);
        }
        Ok(())
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let name = name.map(Name::as_str);
        let (holders, waiters) = self.db.read("list the holders", |tx| {
            let version: u32 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
            let now = self.judge.now();
            // A database from before the waiting line has no waiters.
            let waiters = if version >= 2 {
                live_waiters(tx, name, &now, version)?
            } else {
                Vec::new()
            };
            Ok((live_holders(tx, name, &now, version)?, waiters))
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
            let now = self.judge.now();
            let mut broken = live_holders(tx, Some(name.as_str()), &now, SCHEMA_VERSION)?;
            broken.retain(|row| slot.is_none_or(|slot| slot == row.slot));
            for row in &broken {
                tx.execute(
                    "DELETE FROM holders WHERE name = ?1 AND slot = ?2",
                    params![name.as_str(), row.slot],
                )?;
            }
            let tell = moved(tx, name.as_str(), &now)?;
            Ok((broken.iter().map(HolderRow::entry).collect(), tell))
        })?;
        ring(&tell);
        Ok(broken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Mode;
    use database::tests::{VERSION_3_ROWS, database_of_version};

    #[test]
    fn status_reads_an_older_database_as_it_is_its_rows_exclusive() {
        let (_dir, path) = database_of_version(3, VERSION_3_ROWS);
        let common = Common {
            prefix: "lockrun",
            create: false,
            from_variables: &[],
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
