//! One look at a name's line, in one transaction and one round trip: under
//! the name's lock, taking a free slot when the line lets us or else joining
//! it (an act); or, for a waiter already in line, keeping its place, which
//! takes no lock. Either way the server reports where we stand.

use std::time::Duration;

use serde::Deserialize;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::connect::Statement;
use super::link::Link;
use super::millis;
use super::sql::{CHANNEL_PREFIX, Sql};
use crate::backend::record::{Ahead, line};
use crate::backend::{Line, Request};
use crate::error::{Error, Result};
use crate::identity::Process;
use crate::platform::clock::Moment;

/// What a look found.
pub struct Look {
    /// The slot and fence we hold now, after an act.
    pub taken: Option<(u32, u64)>,
    /// Our place, from 1; 0 when not in line.
    pub position: u32,
    /// Whether a slot is free (for the head of the line).
    pub free: bool,
    /// The look began to listen for wake-ups (its session did not before).
    pub began_listening: bool,
    holders: Vec<Seen>,
    just_ahead: Option<Seen>,
    /// When the answer came: `left_ms` counts from then.
    answered: Moment,
}

/// A holder or the waiter just ahead, as the report gives it.
#[derive(Deserialize)]
struct Seen {
    #[serde(flatten)]
    owner: crate::backend::Owner,
    kept: bool,
    /// Milliseconds until its lease or place ends, by the server's clock.
    left_ms: i64,
}

impl Seen {
    fn ahead(&self, answered: Moment) -> Ahead<'_> {
        Ahead {
            owner: &self.owner,
            kept: self.kept,
            // The server counted from before the answer came: one more millisecond, and it has ended.
            ends: answered + Duration::from_millis(self.left_ms.max(0).cast_unsigned() + 1),
        }
    }
}

impl Look {
    /// Looks at the line of `request.name`, acting (`act`) or only keeping
    /// our place. A look made while we queue listens for wake-ups on our own
    /// channel, in the same transaction, if the session does not yet.
    pub fn take(link: &mut Link, sql: &Sql, request: &Request, act: bool) -> Result<Self> {
        let owner = &request.owner;
        let process = &owner.process;
        let name = request.name.as_str();
        let (parallelism, ttl) = (request.parallelism.cast_signed(), millis(request.ttl));
        let (pid, start_time) = (process.pid.cast_signed(), process.start_time.cast_signed());
        let params: [(&(dyn ToSql + Sync), Type); 10] = [
            (&name, Type::TEXT),
            (&owner.token, Type::TEXT),
            (&parallelism, Type::INT4),
            (&ttl, Type::INT8),
            (&pid, Type::INT4),
            (&start_time, Type::INT8),
            (&process.boot_id, Type::TEXT),
            (&process.host, Type::TEXT),
            (&owner.command, Type::TEXT),
            (&request.queue, Type::BOOL),
        ];
        let wake = wake_params(&name, &parallelism);
        let listen = format!("LISTEN \"{CHANNEL_PREFIX}{}\"", owner.token);
        let began_listening = request.queue && !link.listening();
        let mut statements: Vec<Statement> = Vec::new();
        if began_listening {
            statements.push((&listen, &[]));
        }
        if act {
            statements.extend([
                (sql.lock_new.as_str(), &params[..1]),
                (&sql.purge, &params[..1]),
                (&sql.take, &params[..9]),
                (&sql.join, &params[..]),
                (&sql.wake, &wake[..]),
            ]);
        } else {
            statements.push((&sql.keep_place, &params[..4]));
        }
        statements.push((&sql.report, &params[..3]));
        let what = if act {
            "take a slot"
        } else {
            "keep our place in line"
        };
        let results = link.transact(what, link.patience(), &statements)?;
        if began_listening {
            link.listens();
        }
        // The take's rows come after the LISTEN, the lock and the purge.
        let take = usize::from(began_listening) + 2;
        let taken = act.then(|| results[take].first()).flatten().map(|row| {
            let (slot, fence): (i32, i64) = (row.get(0), row.get(1));
            (slot.cast_unsigned(), fence.cast_unsigned())
        });
        let mut look = Self::report(&results[results.len() - 1][0])?;
        look.taken = taken;
        look.began_listening = began_listening;
        Ok(look)
    }

    /// The report's one row: our place, whether a slot is free, the holders and the waiter ahead.
    fn report(row: &Row) -> Result<Self> {
        let holders: Option<String> = row.get(2);
        let just_ahead: Option<String> = row.get(3);
        let bad = |err: serde_json::Error| Error::internal("reading the line", err);
        Ok(Self {
            taken: None,
            position: row.get::<_, i32>(0).cast_unsigned(),
            free: row.get(1),
            began_listening: false,
            holders: holders
                .map_or(Ok(Vec::new()), |json| serde_json::from_str(&json))
                .map_err(bad)?,
            just_ahead: just_ahead
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(bad)?,
            answered: Moment::now(),
        })
    }

    /// Where `me` stands, for the waiting loop.
    pub fn line(&self, me: &Process) -> Line {
        let holders: Vec<Ahead> = self
            .holders
            .iter()
            .map(|h| h.ahead(self.answered))
            .collect();
        let just_ahead = self.just_ahead.as_ref().map(|w| w.ahead(self.answered));
        line(me, self.position, &holders, just_ahead.as_ref())
    }
}

/// The parameters of [`Sql::wake`].
pub fn wake_params<'a>(
    name: &'a &str,
    parallelism: &'a i32,
) -> [(&'a (dyn ToSql + Sync), Type); 3] {
    [
        (name, Type::TEXT),
        (parallelism, Type::INT4),
        (&CHANNEL_PREFIX, Type::TEXT),
    ]
}
