//! One look at a name's line, in one transaction: its live holders, the waiters
//! ahead of us, our ticket and a slot granted to us; and what they let us do.

use rusqlite::Connection;

use super::database::SCHEMA_VERSION;
use super::judge::Now;
use super::line::lowest_free;
use super::rows::{HolderRow, WaiterRow, live_holders, live_waiters};
use crate::backend::record::{Ahead, Places, line};
use crate::backend::{Line, Request, refuses};
use crate::platform::clock::Moment;

/// A slot granted to us while we waited: its number and fence, and when it
/// was granted if the lockrun that granted it shares our boot clock.
pub(super) struct Granted {
    pub(super) slot: u32,
    pub(super) fence: u64,
    pub(super) at: Option<Moment>,
}

/// One look at the line of a name, in one transaction.
pub(super) struct LineRows {
    pub(super) holders: Vec<HolderRow>,
    /// Our ticket, if our row is there.
    pub(super) ticket: Option<i64>,
    /// The slot granted to us, if one was.
    pub(super) granted: Option<Granted>,
    /// Waiters ahead of us (all of them when we are not in line).
    pub(super) ahead: Vec<WaiterRow>,
    pub(super) data_version: i64,
}

impl LineRows {
    pub(super) fn take(
        tx: &Connection,
        name: &str,
        token: &str,
        now: &Now,
    ) -> rusqlite::Result<Self> {
        let holders = live_holders(tx, Some(name), now, SCHEMA_VERSION)?;
        let mut ahead = live_waiters(tx, Some(name), now, SCHEMA_VERSION)?;
        let ticket = ahead
            .iter()
            .find(|row| row.owner.token == token)
            .map(|row| row.ticket);
        if let Some(ours) = ticket {
            ahead.retain(|row| row.ticket < ours);
        }
        let granted = holders
            .iter()
            .find(|row| row.owner.token == token && !row.released)
            .map(|row| Granted {
                slot: row.slot,
                fence: row.fence,
                at: row.dated_at,
            });
        Ok(Self {
            holders,
            ahead,
            ticket,
            granted,
            data_version: tx.query_row("PRAGMA data_version", [], |row| row.get(0))?,
        })
    }

    /// The lowest free slot, if the line lets us have one (docs/guide.md: "Shared locks").
    pub(super) fn free_slot(&self, request: &Request) -> Option<u32> {
        let holders = self.holders.iter().map(|row| row.owner.mode);
        let ahead = self.ahead.iter().map(|row| row.owner.mode);
        if !request.admitted(holders, ahead) {
            return None;
        }
        lowest_free(&self.holders, request.capacity())
    }

    /// The `-p` of a holder or a waiter ahead of us, when it is not ours.
    pub(super) fn other_parallelism(&self, ours: u32) -> Option<u32> {
        let holders = self.holders.iter().map(|row| row.owner.parallelism);
        let waiters = self.ahead.iter().map(|row| row.owner.parallelism);
        holders
            .chain(waiters)
            .find(|&theirs| refuses(theirs, ours))
            .flatten()
    }

    pub(super) fn line(&self, request: &Request, in_line: bool) -> Line {
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
                ends: row.ends,
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
                ends: row.ends,
            })
            .collect();
        let me = &request.owner.process;
        let nearest_local = self
            .ahead
            .iter()
            .rev()
            .map(|row| &row.owner)
            .find(|owner| owner.process.shares_host_with(me));
        line(me, position, place, &holders, &just_ahead, nearest_local)
    }
}
