//! One look at a name's line, in one transaction and one round trip: under
//! the name's lock, taking a free slot when the line lets us or else joining
//! it (an act); or, for a waiter already in line, keeping its place, which
//! takes no lock; or, for a `--no-wait` run, only reading, which takes none
//! either. Every way, the server reports where we stand.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::connect::Statement;
use super::link::PostgresLink;
use super::sql::{CHANNEL_PREFIX, Sql};
use super::{holder_entry, millis};
use crate::backend::record::{Ahead, line};
use crate::backend::{Entry, Line, Mode, Owner, Request};
use crate::error::{Error, Result};
use crate::identity::Process;
use crate::platform::clock::Moment;

/// What a look found.
pub struct LookReport {
    /// The slot and fence we hold now, after an act.
    pub taken: Option<(u32, u64)>,
    /// Our position in line, from 1; 0 when not in line.
    pub position: u32,
    /// Our place, where consecutive sharers stand in one (see [`Sql`]); 0 when not in line.
    pub place: u32,
    /// Whether the line lets us take a slot now.
    pub admitted: bool,
    /// When to look again at the latest, if sooner than the line says.
    pub moves_by: Option<Moment>,
    /// Whether we stand among the waiters the line keeps told.
    pub reach: Reach,
    /// Another `-p` that a holder or waiter has: we were let in neither as a holder nor as a waiter.
    other_parallelism: Option<u32>,
    holders: Vec<Holder>,
    /// The waiters of the place just ahead of ours.
    just_ahead: Vec<Neighbour>,
    /// The waiter nearest ahead of us on our host (boot and host name), if any.
    nearest_local: Option<Neighbour>,
    /// The waiter of our host nearest the head within the listening places
    /// ahead of us, if any: once it has ended, we are within them.
    local_at_listening: Option<Neighbour>,
    /// When the answer came: `left_ms` counts from then.
    answered: Moment,
}

/// Where a look found us against the waiters the line keeps told.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Among them: a notice says when the line moves for us.
    Told,
    /// Beyond them, waiting for the end of the waiter of our host among them
    /// nearest the head, which brings us among them, and for nothing else.
    Watching,
    /// Beyond them, with nobody to wait for: we look again in time.
    Afar,
}

/// A holder or a waiter just ahead, as the report gives it.
#[derive(Deserialize)]
struct Neighbour {
    #[serde(flatten)]
    owner: crate::backend::Owner,
    kept: bool,
    /// Milliseconds until its lease or place ends, by the server's clock.
    left_ms: i64,
}

/// A holder, as the report gives it.
#[derive(Deserialize)]
struct Holder {
    #[serde(flatten)]
    neighbour: Neighbour,
    slot: u32,
    fence: u64,
    /// When it took the slot and when its lease ends, in epoch milliseconds.
    since_ms: u64,
    expires_ms: u64,
}

impl Neighbour {
    fn ahead(&self, answered: Moment) -> Ahead<'_> {
        Ahead {
            owner: &self.owner,
            kept: self.kept,
            // The server counted from before the answer came: one more millisecond, and it has ended.
            ends: answered + Duration::from_millis(self.left_ms.max(0).cast_unsigned() + 1),
        }
    }
}

/// The parameters every look binds: $1 name, $2 token, $3 parallelism, $4
/// TTL ms, $5-$9 the owner's pid, start time, boot id, host and command, $10
/// whether to join the line, $11 the mode.
struct Params<'a> {
    name: &'a str,
    parallelism: i32,
    ttl: i64,
    pid: i32,
    start_time: i64,
    mode: &'static str,
    /// The `command` column: see [`crate::backend::Owner::packed`].
    command: String,
    request: &'a Request,
}

impl<'a> Params<'a> {
    fn new(request: &'a Request) -> Self {
        let process = &request.owner.process;
        Self {
            name: request.name.as_str(),
            parallelism: request.parallelism.cast_signed(),
            ttl: millis(request.plan.ttl()),
            pid: process.pid.cast_signed(),
            start_time: process.start_time.cast_signed(),
            mode: request.mode().as_str(),
            command: request.owner.packed(),
            request,
        }
    }

    fn all(&self) -> [(&(dyn ToSql + Sync), Type); 11] {
        let owner = &self.request.owner;
        [
            (&self.name, Type::TEXT),
            (&owner.token, Type::TEXT),
            (&self.parallelism, Type::INT4),
            (&self.ttl, Type::INT8),
            (&self.pid, Type::INT4),
            (&self.start_time, Type::INT8),
            (&owner.process.boot_id, Type::TEXT),
            (&owner.process.host, Type::TEXT),
            (&self.command, Type::TEXT),
            (&self.request.queue, Type::BOOL),
            (&self.mode, Type::TEXT),
        ]
    }
}

/// The slot and fence the take statement returned, if any.
fn taken(rows: &[Row]) -> Option<(u32, u64)> {
    rows.first().map(|row| {
        let (slot, fence): (i32, i64) = (row.get(0), row.get(1));
        (slot.cast_unsigned(), fence.cast_unsigned())
    })
}

/// Takes a free slot if the line lets us, under the name's lock, and does
/// nothing else: for a run about to join the line, or a waiter whose turn it
/// likely is (at the head with a slot free), so that the run costs as little as it can.
pub fn take(link: &mut PostgresLink, sql: &Sql, request: &Request) -> Result<Option<(u32, u64)>> {
    let params = Params::new(request);
    let all = params.all();
    let wake = wake_params(&params.name, &true);
    let mut statements: Vec<Statement> = vec![(&sql.lock, &all[..1]), (&sql.take, &all[..])];
    if request.parallelism > 1 || request.mode() == Mode::Shared {
        // Slots go out in line order: to the new head if another slot is free
        // for it (the sharers with us), and the next two places are told. With
        // one exclusive slot they find out at their next look: telling them
        // here costs the handoff a millisecond.
        statements.push((&sql.wake, &wake));
    }
    let results = link.transact("take a slot", link.patience(), &statements)?;
    Ok(taken(&results[1]))
}

/// Keeps our place in line for another TTL, reading nothing else than
/// whether the waiter `ahead` (its token) still stands in line: `None` when
/// our place was gone (lapsed, or a slot granted to us), else that.
pub fn keep_place_behind(
    link: &mut PostgresLink,
    sql: &Sql,
    request: &Request,
    ahead: &str,
) -> Result<Option<bool>> {
    let params = Params::new(request);
    let all = params.all();
    let mut with_ahead = all[..4].to_vec();
    with_ahead.push((&ahead, Type::TEXT));
    let statement: Statement = (&sql.keep_place_behind, &with_ahead);
    let results = link.transact("keep our place", link.patience(), &[statement])?;
    Ok(results[0].first().map(|row| row.get(0)))
}

/// Claims the slot granted to us (see [`Sql::claim`]): renews its lease,
/// without the name's lock, so that the sharers one release let in do not
/// wait for each other.
pub fn claim(link: &mut PostgresLink, sql: &Sql, request: &Request) -> Result<Option<(u32, u64)>> {
    let params = Params::new(request);
    let all = params.all();
    let results = link.transact("claim a slot", link.patience(), &[(&sql.claim, &all[..4])])?;
    Ok(taken(&results[0]))
}

impl LookReport {
    /// Looks at the line of `request.name`: with `join`, under the name's
    /// lock, takes a free slot when the line lets us, else joins it or keeps
    /// our place (`--no-wait`: only takes); without, takes no lock and keeps
    /// our place (for another TTL if `refresh`), or for `--no-wait` only
    /// reads. A look made while we queue listens for wake-ups on our own
    /// channel, if the session does not yet.
    pub fn take(
        link: &mut PostgresLink,
        sql: &Sql,
        request: &Request,
        join: bool,
        refresh: bool,
    ) -> Result<Self> {
        let params = Params::new(request);
        let all = params.all();
        let wake = wake_params(&params.name, &false);
        // Committed before the look, in the same round trip: a wake-up sent
        // after the look read the line reaches us, and what one sent before
        // it said the look sees.
        let began_listening = request.queue && !link.listening(&request.owner.token);
        let channel = began_listening.then(|| format!("{CHANNEL_PREFIX}{}", request.owner.token));
        let mut statements: Vec<Statement> = Vec::new();
        // Where the take's rows are, when there is one.
        let mut take = None;
        if join && request.queue {
            take = Some(2);
            statements.extend([
                (sql.lock_new.as_str(), &all[..1]),
                (&sql.purge, &all[..1]),
                (&sql.take, &all[..]),
                (&sql.join, &all[..]),
                (&sql.wake, &wake[..]),
            ]);
        } else if join {
            // A --no-wait run that a look found a slot free for takes it or
            // goes: it frees none and stands in no line, so it neither tidies
            // the line nor wakes it.
            take = Some(1);
            statements.extend([(sql.lock_new.as_str(), &all[..1]), (&sql.take, &all[..])]);
        } else if refresh && request.queue {
            statements.push((&sql.keep_place, &all[..4]));
        }
        let report = if request.queue {
            &sql.report
        } else {
            &sql.outside_report
        };
        statements.push((report, &all[..]));
        let what = if join {
            "join the line"
        } else {
            "look at the line"
        };
        let results =
            link.transact_listening(channel.as_deref(), what, link.patience(), &statements)?;
        if join {
            link.doubt_wakeups();
        }
        if began_listening {
            link.listens(&request.owner.token);
        }
        let mut look = Self::report(&results[results.len() - 1][0])?;
        look.taken = take.and_then(|take| taken(&results[take]));
        Ok(look)
    }

    /// The report's one row: our position and place, whether the line lets
    /// us in, the holders, the waiters just ahead, another `-p`, the waiter
    /// of our host nearest ahead and the one whose end brings us among the listeners.
    fn report(row: &Row) -> Result<Self> {
        fn listed<T: DeserializeOwned>(row: &Row, column: usize) -> Result<Vec<T>> {
            row.get::<_, Option<String>>(column)
                .map_or(Ok(Vec::new()), |json| serde_json::from_str(&json))
                .map_err(|err| Error::internal("reading the line", err))
        }
        fn one<T: DeserializeOwned>(row: &Row, column: usize) -> Result<Option<T>> {
            row.get::<_, Option<String>>(column)
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|err| Error::internal("reading the line", err))
        }
        Ok(Self {
            taken: None,
            position: row.get::<_, i32>(0).cast_unsigned(),
            place: row.get::<_, i32>(1).cast_unsigned(),
            admitted: row.get(2),
            holders: listed(row, 3)?,
            just_ahead: listed(row, 4)?,
            nearest_local: one(row, 6)?,
            local_at_listening: one(row, 7)?,
            answered: Moment::now(),
            moves_by: None,
            reach: Reach::Told,
            other_parallelism: row.get::<_, Option<i32>>(5).map(i32::cast_unsigned),
        })
    }

    /// The waiter of our host whose end brings us among the waiters the
    /// line keeps told, if one stands within their places ahead of us.
    pub fn local_at_listening(&self) -> Option<&Owner> {
        self.local_at_listening.as_ref().map(|waiter| &waiter.owner)
    }

    /// The live holders of `name` the look saw, as `status` lists them.
    pub fn holders(&self, name: &str) -> Vec<Entry> {
        self.holders
            .iter()
            .filter_map(|h| {
                let Neighbour { owner, kept, .. } = &h.neighbour;
                holder_entry(
                    name,
                    h.slot,
                    owner,
                    *kept,
                    h.fence,
                    (h.since_ms, h.expires_ms),
                )
            })
            .collect()
    }

    /// Where `me` stands, for the waiting loop.
    pub fn line(&self, me: &Process) -> Line {
        if let Some(theirs) = self.other_parallelism {
            return Line::refused(theirs);
        }
        let holders: Vec<Ahead> = self
            .holders
            .iter()
            .map(|h| h.neighbour.ahead(self.answered))
            .collect();
        let just_ahead: Vec<Ahead> = self
            .just_ahead
            .iter()
            .map(|w| w.ahead(self.answered))
            .collect();
        let nearest_local = self.nearest_local.as_ref().map(|waiter| &waiter.owner);
        let mut line = line(
            me,
            self.position,
            self.place,
            &holders,
            &just_ahead,
            nearest_local,
        );
        line.moves_by = match self.reach {
            // Only the end of the waiter we watch brings us among the
            // listeners: a lease or place ahead running out does not.
            Reach::Watching => None,
            _ => [line.moves_by, self.moves_by].into_iter().flatten().min(),
        };
        line.watched = self.reach == Reach::Watching;
        if self.reach != Reach::Told {
            // Far back, a dead entry ahead holds nobody up yet: we look at its
            // process at each of our looks, not every second in between.
            line.local_ahead.retain(|owner| owner.process.is_gone());
        }
        line
    }
}

/// The parameters of [`Sql::wake`]: tell the next two places too when `moved`.
pub fn wake_params<'a>(name: &'a &str, moved: &'a bool) -> [(&'a (dyn ToSql + Sync), Type); 3] {
    [
        (name, Type::TEXT),
        (&CHANNEL_PREFIX, Type::TEXT),
        (moved, Type::BOOL),
    ]
}
