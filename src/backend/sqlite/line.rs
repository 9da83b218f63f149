//! What changes a name's line, inside a write transaction: joining it, taking a
//! slot, leaving; and after a change, granting the freed slots to the head of
//! the line and saying whom to ring once it is committed.

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::{Connection, Statement, params};

use super::database::SCHEMA_VERSION;
use super::judge::Now;
use super::rows::{HolderRow, WaiterRow, holders, live_holders, live_waiters, waiters};
use crate::backend::record::Places;
use crate::backend::{Owner, admitted, capacity};
use crate::duration::millis;
use crate::platform::doorbell;

/// Puts `owner` at the end of the line of `name`, its place kept for `ttl` ms.
pub(super) fn join(
    tx: &Connection,
    name: &str,
    owner: &Owner,
    now: &Now,
    ttl: u64,
) -> rusqlite::Result<()> {
    let process = &owner.process;
    tx.execute(
        "INSERT INTO waiters (name, token, pid, start_time, boot_id, host, command, since, expires_at,
                              parallelism, mode, ttl, clock, ends, span)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?12)",
        params![
            name,
            owner.token,
            process.pid,
            process.start_time,
            process.boot_id,
            process.host,
            owner.packed(),
            now.wall,
            now.wall + ttl,
            owner.parallelism,
            owner.mode.as_str(),
            ttl,
            now.clock(),
            now.ends(ttl),
        ],
    )?;
    Ok(())
}

/// Gives `owner` slot `slot` of `name` for a lease of `span` ms, taking it out
/// of the line: the acquisition's fence.
pub(super) fn take_slot(
    tx: &Connection,
    name: &str,
    owner: &Owner,
    slot: u32,
    now: &Now,
    span: u64,
) -> rusqlite::Result<u64> {
    Taker::new(tx)?.take(name, owner, slot, now, span)
}

/// The statements that give waiters their slots, prepared once for every
/// slot a grant gives (preparing them took most of a release's CPU when it
/// let 8 readers in).
struct Taker<'tx> {
    leave_line: Statement<'tx>,
    next_fence: Statement<'tx>,
    hold: Statement<'tx>,
}

impl<'tx> Taker<'tx> {
    fn new(tx: &'tx Connection) -> rusqlite::Result<Self> {
        Ok(Self {
            leave_line: tx.prepare("DELETE FROM waiters WHERE token = ?1")?,
            next_fence: tx.prepare(
                "INSERT INTO fences (name, fence) VALUES (?1, 1)
                 ON CONFLICT (name) DO UPDATE SET fence = fence + 1
                 RETURNING fence",
            )?,
            hold: tx.prepare(
                "INSERT INTO holders (name, slot, token, fence, pid, start_time, boot_id, host,
                                      command, acquired_at, expires_at, parallelism, mode,
                                      clock, ends, span)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?,
        })
    }

    /// See [`take_slot`].
    fn take(
        &mut self,
        name: &str,
        owner: &Owner,
        slot: u32,
        now: &Now,
        span: u64,
    ) -> rusqlite::Result<u64> {
        self.leave_line.execute(params![owner.token])?;
        let fence: u64 = self.next_fence.query_row(params![name], |row| row.get(0))?;
        let process = &owner.process;
        self.hold.execute(params![
            name,
            slot,
            owner.token,
            fence,
            process.pid,
            process.start_time,
            process.boot_id,
            process.host,
            owner.packed(),
            now.wall,
            now.wall + span,
            owner.parallelism,
            owner.mode.as_str(),
            now.clock(),
            now.ends(span),
            span,
        ])?;
        Ok(fence)
    }
}

/// Dates the lease of our slot `slot` of `name` anew, `span` ms from now, on
/// our clock, unless it has ended by our clock (a renewal never brings a lease
/// back) or been let go; with `keep`, as a slot its holder left and
/// `--min-hold` keeps. Whether it was ours. (A row of ours dated elsewhere, a
/// slot granted to us by a lockrun of another boot, is still ours while it
/// is there: nobody takes a slot before its row is dropped.)
pub(super) fn redate(
    tx: &Connection,
    name: &str,
    slot: u32,
    token: &str,
    now: &Now,
    span: u64,
    keep: bool,
) -> rusqlite::Result<bool> {
    let changed = tx.execute(
        "UPDATE holders SET expires_at = ?1, clock = ?2, ends = ?3, span = ?4, beat = beat + 1,
                            released = released OR ?5
         WHERE name = ?6 AND slot = ?7 AND token = ?8 AND released = 0
           AND NOT (clock IS ?2 AND ends <= ?9)",
        params![
            now.wall + span,
            now.clock(),
            now.ends(span),
            span,
            keep,
            name,
            slot,
            token,
            now.ends(0),
        ],
    )?;
    Ok(changed == 1)
}

/// Drops the holder (unless kept by `--min-hold`) and the waiter of `name` that `token` is.
pub(super) fn drop_entries(tx: &Connection, name: &str, token: &str) -> rusqlite::Result<()> {
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
/// whom to ring: those it granted slots to, and the first two places of the
/// line left (when the line moves, those at the head may take a slot, every
/// sharer there at once, and those second must watch the head:
/// docs/guide.md: "The waiting line").
pub(super) fn moved(tx: &Connection, name: &str, now: &Now) -> rusqlite::Result<Vec<String>> {
    let (mut tell, left) = grant(tx, name, now)?;
    let mut places = Places::default();
    let front = left
        .into_iter()
        .take_while(|waiter| places.next(waiter.owner.mode) <= 2)
        .map(|waiter| waiter.owner.token);
    tell.extend(front);
    Ok(tell)
}

/// Grants free slots of `name`, in line order, to the waiters at the head of
/// its line whom the line lets in (the rule of `Request::admitted`, for each
/// with those ahead of it let in first): every sharer there at once. Their
/// leases run for their TTL from now (to the end of their places, for rows of
/// older lockruns). Their tokens, and the waiters left in line.
fn grant(
    tx: &Connection,
    name: &str,
    now: &Now,
) -> rusqlite::Result<(Vec<String>, Vec<WaiterRow>)> {
    let mut holders = live_holders(tx, Some(name), now, SCHEMA_VERSION)?;
    let mut waiters = live_waiters(tx, Some(name), now, SCHEMA_VERSION)?.into_iter();
    let mut granted = Vec::new();
    let mut taker = None;
    let mut left = Vec::new();
    for waiter in waiters.by_ref() {
        let owner = &waiter.owner;
        let parallelism = owner.parallelism.unwrap_or(1);
        let modes = holders.iter().map(|row| row.owner.mode);
        let let_in = admitted(owner.mode, parallelism, modes, []);
        let free = lowest_free(&holders, capacity(owner.mode, parallelism));
        let Some(slot) = free.filter(|_| let_in) else {
            left.push(waiter);
            break;
        };
        let span = waiter.ttl.unwrap_or_else(|| millis(waiter.ends - now.at));
        let taker = match &mut taker {
            Some(taker) => taker,
            None => taker.insert(Taker::new(tx)?),
        };
        let fence = taker.take(name, owner, slot, now, span)?;
        granted.push(owner.token.clone());
        holders.push(HolderRow {
            name: waiter.name,
            slot,
            owner: waiter.owner,
            fence,
            acquired_at: now.wall,
            expires_at: now.wall + span,
            ends: now.at + Duration::from_millis(span),
            dated_at: Some(now.at),
            released: false,
        });
    }
    left.extend(waiters);
    Ok((granted, left))
}

/// The lowest slot number below `capacity` that none of `holders` has.
pub(super) fn lowest_free(holders: &[HolderRow], capacity: u32) -> Option<u32> {
    let taken: HashSet<u32> = holders.iter().map(|row| row.slot).collect();
    (0..capacity).find(|slot| !taken.contains(slot))
}

/// Wakes the waiters of `tokens`, once what they must see is committed.
pub(super) fn ring(tokens: &[String]) {
    doorbell::ring(tokens);
}

/// Drops the rows of `name` whose leases or places in line have ended.
pub(super) fn purge_ended(tx: &Connection, name: &str, now: &Now) -> rusqlite::Result<()> {
    for row in holders(tx, Some(name), now, SCHEMA_VERSION, false)? {
        tx.execute(
            "DELETE FROM holders WHERE name = ?1 AND slot = ?2",
            params![name, row.slot],
        )?;
    }
    for row in waiters(tx, Some(name), now, SCHEMA_VERSION, false)? {
        tx.execute("DELETE FROM waiters WHERE ticket = ?1", params![row.ticket])?;
    }
    Ok(())
}

/// Keeps our place in line `ttl` ms from now.
pub(super) fn refresh_waiter(
    tx: &Connection,
    token: &str,
    now: &Now,
    ttl: u64,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE waiters SET expires_at = ?1, clock = ?2, ends = ?3, span = ?4, beat = beat + 1
         WHERE token = ?5",
        params![now.wall + ttl, now.clock(), now.ends(ttl), ttl, token],
    )?;
    Ok(())
}
