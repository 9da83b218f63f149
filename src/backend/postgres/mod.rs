//! The PostgreSQL backend (docs/backends/postgres.md: "PostgreSQL backend"): leases as rows in
//! lockrun's schema, dated by the server's clock; the waiting line as rows by
//! ticket; every look and change one short transaction in one round trip.
//! A release grants the slot to the waiters at the head of the line (one, or
//! the sharers that stand there together) and wakes them with NOTIFY, each
//! on its own channel. Only the first waiters of a line keep a connection (and LISTEN);
//! the ones behind them connect for each look and poll with the backoff.
//!
//! Groundwork, public for its integration tests: which server
//! (`target`), sessions whose every call has a deadline (`connect`), failures
//! sorted (`failure`), the schema (`schema`).

pub mod connect;
pub mod failure;
mod link;
mod look;
mod prepared;
mod resolve;
pub mod schema;
mod slot;
mod sql;
pub mod target;
mod tls;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::record::{sort, waiting};
use super::{Abilities, Attempt, Common, Entry, Line, Mode, Owner, Request, Store, Waited};
use crate::error::Result;
use crate::identity::Process;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::platform::pidfd::ProcessEnd;
use crate::timing::FREE_CALL;
use connect::{Connector, Statement};
use link::PostgresLink;
use look::{LookReport, Reach, wake_params};
use schema::{MODES_SINCE, SCHEMA_VERSION, Schema};

use slot::PostgresSlot;
use sql::{Grant, Sql};
use target::Target;

/// The schema's version (the comment on `holders`); every older one is upgraded.
pub const FORMAT: super::Format = super::Format {
    backend: "postgres",
    kind: "schema",
    writes: SCHEMA_VERSION as u32,
    reads_from: 1,
};

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    /// PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq's: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]
    #[arg(
        long,
        env = "LOCKRUN_POSTGRES_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub postgres_url: Option<String>,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        let option = common.option_name("postgres_url", "--postgres-url", "LOCKRUN_POSTGRES_URL");
        let target = Target::parse(self.postgres_url.as_deref(), option)?;
        let schema = Schema::new(common.prefix)?;
        let location = format!("PostgreSQL at {target}, schema {}", common.prefix);
        let connector = Connector::new(target)?;
        Ok(Box::new(PostgresStore {
            sql: Rc::new(Sql::new(&schema, SCHEMA_VERSION)),
            link: Rc::new(RefCell::new(PostgresLink::new(
                connector,
                schema.clone(),
                common.create,
            ))),
            schema,
            in_line: false,
            granted: None,
            place_kept_at: None,
            refresh_due: None,
            seen: None,
            far: None,
            location,
        }))
    }
}

/// Waiters this many places back in line beyond the slots keep their
/// connection and are woken by NOTIFY (sharers that stand together take one
/// place); this many waiters in all at most. The ones behind them connect
/// only to look, so a line of thousands needs a few connections.
const SPARE_LISTENERS: u32 = 16;
const MAX_LISTENERS: u32 = 64;

/// The places in line, from the head, whose waiters listen with `-p parallelism`.
fn listener_places(parallelism: u32) -> u32 {
    (parallelism + SPARE_LISTENERS).min(MAX_LISTENERS)
}

/// How long a waiter beyond those places, with no waiter of its host among
/// them to wait for, waits between looks per place it is beyond them: a line
/// of short jobs drains the places ahead of it no faster than about one per
/// 10 ms, so it comes in well before they have gone, and a line of a
/// thousand that stands still costs a few dozen more looks a second than the
/// looks every TTL/3 that keep the places.
const PACE_FROM_AFAR: Duration = Duration::from_millis(100);
/// How long the holders a look saw stand for the name's holders: a busy
/// run's message, right after its look, then costs no transaction of its own.
const SEEN_HOLDERS_FOR: Duration = Duration::from_millis(200);

/// Far back in line: the waiter of our host among the listening places whose
/// end brings us among them (its process's end, and its token), and the line
/// as the look that found it saw it, which stands for the line while that
/// waiter stands in it (see [`PostgresStore::keep_place_afar`]).
struct FarBack {
    end: ProcessEnd,
    token: String,
    line: Line,
}

/// The holders of `name` a look saw, and until when they stand for them.
struct SeenHolders {
    name: String,
    until: Moment,
    holders: Vec<Entry>,
}

struct PostgresStore {
    link: Rc<RefCell<PostgresLink>>,
    /// The statements for this lockrun's tables.
    sql: Rc<Sql>,
    schema: Schema,
    /// Whether we joined the line.
    in_line: bool,
    /// The last wait ended with a wake-up for a slot granted to us.
    granted: Option<Grant>,
    /// When the look that last set our place's lease went out: a slot
    /// granted to us has a lease that ends where our place would have, so no
    /// earlier than a TTL after this.
    place_kept_at: Option<Moment>,
    /// When our place in line must be kept for another TTL, lest it lapse.
    refresh_due: Option<Moment>,
    /// The holders the last look saw, for a message that follows it.
    seen: Option<SeenHolders>,
    /// Far back in line, watching the waiter of our host whose end brings us among the listeners.
    far: Option<FarBack>,
    /// The server, its password redacted, and the schema.
    location: String,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// One look at the line (see [`LookReport::take`]). A waiter far back in line
    /// then lets its connection go until its next look.
    fn look(&mut self, request: &Request, join: bool) -> Result<LookReport> {
        let refresh = join || self.refresh_due.is_none_or(Moment::has_passed);
        let mut link = self.link.borrow_mut();
        let sent = Moment::now();
        let mut look = LookReport::take(&mut link, &self.sql, request, join, refresh)?;
        let name = request.name.as_str();
        self.seen = Some(SeenHolders {
            name: name.to_owned(),
            until: Moment::now() + SEEN_HOLDERS_FOR,
            holders: look.holders(name),
        });
        if refresh {
            self.refresh_due = Some(Moment::now() + request.plan.keep_place_every());
            if look.position > 0 {
                // Only a look that found our place kept it: one after a grant
                // to us finds a slot instead, whose lease ends where the place
                // we kept before would have.
                self.place_kept_at = Some(sent);
            }
        }
        let distance = (look
            .place
            .saturating_sub(listener_places(request.parallelism)))
        .max(look.position.saturating_sub(MAX_LISTENERS));
        self.far = None;
        if distance > 0 {
            link.disconnect();
            // Not told when the line moves: look again when a waiter of our host
            // among the listening places ends, which brings us among them...
            let watched = look.local_at_listening().and_then(|waiter| {
                let end = waiter.process.watch_end()?;
                Some((end, waiter.token.clone()))
            });
            if let Some((end, token)) = watched {
                look.reach = Reach::Watching;
                let as_seen = look.line(&request.owner.process);
                self.far = Some(FarBack {
                    end,
                    token,
                    line: as_seen,
                });
            } else {
                // ... or else in time to come in and listen before the places ahead
                // have gone, however fast the line moves then.
                look.moves_by = Some(Moment::now() + PACE_FROM_AFAR * distance);
                look.reach = Reach::Afar;
            }
        }
        if look.position > 0
            && link.listening(&request.owner.token)
            && let Some(prepared) = &self.sql.prepared_wake
        {
            // Told when a slot is ours, we may take it over from a holder with
            // waiters behind it: our release is then on the next handoff's path.
            link.ready_wake(prepared);
        }
        Ok(look)
    }

    /// Far back, a look due only to keep our place keeps it and reads
    /// nothing more while the waiter we watch stands in line ahead of us:
    /// only once it has left the line (for a slot, or gone) can we be among
    /// the listeners, and a line of a thousand keeps its places without the
    /// server reading it a hundred times a second. `None` when a look is
    /// due: that waiter left the line, or our place is gone (lapsed, or a
    /// slot granted to us).
    fn keep_place_afar(&mut self, request: &Request) -> Result<Option<Line>> {
        let due = self.refresh_due.is_some_and(Moment::has_passed);
        let Some(far) = (self.far.as_ref()).filter(|far| due && !far.end.wait(Duration::ZERO))
        else {
            return Ok(None);
        };
        let mut link = self.link.borrow_mut();
        let sent = Moment::now();
        let kept = look::keep_place_behind(&mut link, &self.sql, request, &far.token);
        if matches!(kept, Ok(Some(true)) | Err(_)) {
            // Otherwise we look at once, over the same session.
            link.disconnect();
        }
        let Some(ahead_waits) = kept? else {
            return Ok(None);
        };
        self.refresh_due = Some(Moment::now() + request.plan.keep_place_every());
        self.place_kept_at = Some(sent);
        Ok(ahead_waits.then(|| far.line.clone()))
    }

    /// The statements for tables of `version`: the operators' views read an
    /// older schema as it is.
    fn sql_for(&self, version: i64) -> Rc<Sql> {
        if version >= MODES_SINCE {
            Rc::clone(&self.sql)
        } else {
            Rc::new(Sql::new(&self.schema, version))
        }
    }

    /// The slot `taken` (slot, fence) by a request sent at `sent`.
    fn slot(&self, request: &Request, (slot, fence): (u32, u64), sent: Moment) -> Attempt {
        Attempt::Taken(Box::new(PostgresSlot {
            link: Rc::clone(&self.link),
            sql: Rc::clone(&self.sql),
            name: request.name.to_string(),
            slot,
            fence,
            token: request.owner.token.clone(),
            plan: request.plan,
            taken_at: sent,
        }))
    }
}

/// Runs `statements` under the lock of `name`'s row, then grants free slots
/// to the head of its line, and tells the next two places if the line
/// `moved` (see [`Sql::wake`]); the statements' rows.
fn change(
    link: &RefCell<PostgresLink>,
    sql: &Sql,
    what: &str,
    within: Duration,
    name: &str,
    moved: bool,
    statements: &[Statement],
) -> Result<Vec<Vec<Row>>> {
    let locked: [(&(dyn ToSql + Sync), Type); 1] = [(&name, Type::TEXT)];
    let wake = wake_params(&name, &moved);
    let mut all: Vec<Statement> = vec![(&sql.lock, &locked)];
    all.extend_from_slice(statements);
    all.push((&sql.wake, &wake));
    let mut results = link.borrow_mut().transact(what, within, &all)?;
    results.pop();
    results.remove(0);
    Ok(results)
}

impl Store for PostgresStore {
    fn abilities(&self) -> Abilities {
        Abilities::LEASES_THAT_TELL
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let me = &request.owner.process;
        let mut granted = self.granted.take();
        let ours = &request.owner.token;
        if granted.is_none() && self.in_line && self.link.borrow().listening(ours) {
            // The wait may have ended before a wake-up was read (to look at a
            // process ahead, just gone: the holder that granted us its slot).
            // A session found broken here is made anew by the look below.
            let woken = self.link.borrow_mut().woken(ours, Duration::ZERO);
            granted = woken.ok().flatten().as_deref().and_then(sql::granted);
        }
        if let (Some(Grant::Said(slot, fence)), Some(kept), true) =
            (granted, self.place_kept_at, self.in_line)
        {
            // Ours since the grant, which said which slot: nothing to ask before the command
            // starts. Its lease runs from no earlier than our place's last keeping.
            self.in_line = false;
            return Ok(self.slot(request, (slot, fence), kept));
        }
        if granted.is_some() {
            // A lease runs from no earlier than its request: connecting comes first.
            self.link.borrow_mut().tables()?;
            let sent = Moment::now();
            if let Some(taken) = look::claim(&mut self.link.borrow_mut(), &self.sql, request)? {
                self.in_line = false;
                return Ok(self.slot(request, taken, sent));
            }
        }
        if self.in_line {
            if let Some(line) = self.keep_place_afar(request)? {
                return Ok(Attempt::Waiting(line));
            }
            // Keeping our place takes no lock; only a slot that is likely ours needs it.
            let look = self.look(request, false)?;
            if look.position > 0 && !look.admitted {
                return Ok(Attempt::Waiting(look.line(me)));
            }
            if look.position > 0 {
                self.link.borrow_mut().tables()?;
                let sent = Moment::now();
                if let Some(taken) = look::take(&mut self.link.borrow_mut(), &self.sql, request)? {
                    self.in_line = false;
                    return Ok(self.slot(request, taken, sent));
                }
                let look = self.look(request, false)?;
                if look.position > 0 {
                    return Ok(Attempt::Waiting(look.line(me)));
                }
            }
        }
        // Not in line (the first look, or our place lapsed): join it; --no-wait: take a slot.
        self.link.borrow_mut().tables()?;
        if !request.queue {
            // A --no-wait run that finds no slot free goes on a look alone, which
            // reads and locks nothing: a herd of them is mostly busy, and would
            // otherwise queue up on the name's lock and have the server plan a
            // take for each. One that finds a slot free takes it below.
            let look = self.look(request, false)?;
            if !look.admitted {
                return Ok(Attempt::Waiting(look.line(me)));
            }
        }
        let sent = Moment::now();
        if !self.in_line && request.queue {
            // Most runs find a slot free: taking it alone spares the server reading and
            // waking the line (a name's first run, or a busy one, then joins it in a second).
            if let Some(taken) = look::take(&mut self.link.borrow_mut(), &self.sql, request)? {
                return Ok(self.slot(request, taken, sent));
            }
        }
        let look = self.look(request, true)?;
        self.in_line = look.position > 0;
        Ok(match look.taken {
            Some(taken) => self.slot(request, taken, sent),
            None => Attempt::Waiting(look.line(me)),
        })
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let name = request.name.as_str();
        let tokens: Vec<&str> = owners.iter().map(|owner| owner.token.as_str()).collect();
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&name, Type::TEXT), (&tokens, Type::TEXT_ARRAY)];
        let evict: Statement = (&self.sql.evict, &params);
        change(
            &self.link,
            &self.sql,
            "drop dead entries",
            FREE_CALL,
            name,
            true,
            &[evict],
        )?;
        Ok(())
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        if let Some(far) = &self.far {
            // Far back, with no session: only the end of the waiter we watch moves us.
            return Ok(Waited::told(far.end.wait(until.remaining())));
        }
        let woken = self
            .link
            .borrow_mut()
            .woken(&request.owner.token, until.remaining())?;
        // Told only that the line moved, we look; a slot granted to us is ours.
        self.granted = woken.as_deref().and_then(sql::granted);
        Ok(Waited::told(woken.is_some()))
    }

    fn leave(&mut self, request: &Request) -> Result<()> {
        if std::mem::take(&mut self.in_line) {
            self.evict(request, std::slice::from_ref(&request.owner))?;
        }
        Ok(())
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let Some(version) = self.link.borrow_mut().tables()? else {
            return Ok(Vec::new());
        };
        let sql = self.sql_for(version);
        let name = name.map(Name::as_str);
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&name, Type::TEXT)];
        let mut link = self.link.borrow_mut();
        let within = link.patience();
        let rows = link
            .transact("list the holders", within, &[(&sql.list, &params)])?
            .pop()
            .unwrap_or_default();
        Ok(entries(&rows))
    }

    fn holders(&mut self, name: &Name) -> Result<Vec<Entry>> {
        let seen = self
            .seen
            .take()
            .filter(|seen| seen.name == name.as_str() && !seen.until.has_passed());
        if let Some(seen) = seen {
            return Ok(seen.holders);
        }
        let mut entries = self.list(Some(name))?;
        entries.retain(Entry::is_holder);
        Ok(entries)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let Some(version) = self.link.borrow_mut().tables()? else {
            return Ok(Vec::new());
        };
        let sql = self.sql_for(version);
        let name = name.as_str();
        let slot = slot.map(u32::cast_signed);
        let params: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&slot, Type::INT4)];
        let broken: Statement = (&sql.break_slots, &params);
        let rows = change(
            &self.link,
            &sql,
            "break the leases",
            FREE_CALL,
            name,
            false,
            &[broken],
        )?
        .pop()
        .unwrap_or_default();
        Ok(entries(&rows))
    }
}

/// A holder's `status` entry, from when it took the slot to when its lease
/// ends (epoch milliseconds): none when its process is gone and its slot not kept.
fn holder_entry(
    name: &str,
    slot: u32,
    owner: &Owner,
    kept: bool,
    fence: u64,
    (since_ms, expires_ms): (u64, u64),
) -> Option<Entry> {
    (kept || !owner.process.is_gone()).then(|| {
        Entry::holder(name, slot, owner, Some(since_ms))
            .fenced(fence)
            .expiring(Some(expires_ms))
    })
}

/// `status` entries from rows of `list` (or `break_slots`): the holders
/// whose processes live or whose slots are kept, then the live waiters.
fn entries(rows: &[Row]) -> Vec<Entry> {
    let owner = |row: &Row| {
        Owner {
            token: row.get("token"),
            process: Process {
                pid: row.get::<_, i32>("pid").cast_unsigned(),
                start_time: row.get::<_, i64>("start_time").cast_unsigned(),
                boot_id: row.get("boot_id"),
                host: row.get("host"),
            },
            command: row.get("command"),
            user: String::new(),
            note: None,
            mode: Mode::parse(row.get("mode")),
            // Not shown by `status`.
            parallelism: None,
        }
        .unpacked()
    };
    let millis = |row: &Row, column: &str| row.get::<_, i64>(column) as u64;
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for row in rows {
        let name: String = row.get("name");
        match row.get::<_, Option<i32>>("slot") {
            Some(slot) => holders.extend(holder_entry(
                &name,
                slot as u32,
                &owner(row),
                row.get("kept"),
                row.get::<_, i64>("fence") as u64,
                (millis(row, "since_ms"), millis(row, "expires_ms")),
            )),
            None => waiters.push((
                name,
                owner(row),
                millis(row, "since_ms"),
                millis(row, "expires_ms"),
            )),
        }
    }
    holders.extend(waiting(waiters.iter().map(
        |(name, owner, since, expires)| (name.as_str(), owner, *since, Some(*expires)),
    )));
    sort(&mut holders);
    holders
}
