//! What changes a name's line, inside a write transaction: joining it, taking a
//! slot, leaving; and after a change, granting the freed slots to the head of
//! the line and saying whom to ring once it is committed.

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::{Connection, params};

use super::database::SCHEMA_VERSION;
use super::judge::Now;
use super::rows::{HolderRow, holders, live_holders, live_waiters, waiters};
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
                              command, acquired_at, expires_at, parallelism, mode,
                              clock, ends, span)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        params![
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
        ],
    )?;
    Ok(fence)
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
/// whom to ring, those it granted slots to and the first two places.
pub(super) fn moved(tx: &Connection, name: &str, now: &Now) -> rusqlite::Result<Vec<String>> {
    let mut tell = grant(tx, name, now)?;
    tell.extend(front(tx, name, now)?);
    Ok(tell)
}

/// Grants free slots of `name`, in line order, to the waiters at the head of
/// its line whom the line lets in (the rule of `Request::admitted`, for each
/// with those ahead of it let in first): every sharer there at once. Their
/// leases run for their TTL from now (to the end of their places, for rows of
/// older lockruns). Their tokens.
fn grant(tx: &Connection, name: &str, now: &Now) -> rusqlite::Result<Vec<String>> {
    let mut holders = live_holders(tx, Some(name), now, SCHEMA_VERSION)?;
    let mut granted = Vec::new();
    for waiter in live_waiters(tx, Some(name), now, SCHEMA_VERSION)? {
        let owner = &waiter.owner;
        let parallelism = owner.parallelism.unwrap_or(1);
        let modes = holders.iter().map(|row| row.owner.mode);
        let let_in = admitted(owner.mode, parallelism, modes, []);
        let free = lowest_free(&holders, capacity(owner.mode, parallelism));
        let Some(slot) = free.filter(|_| let_in) else {
            break;
        };
        let span = waiter.ttl.unwrap_or_else(|| millis(waiter.ends - now.at));
        let fence = take_slot(tx, name, owner, slot, now, span)?;
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
    Ok(granted)
}

/// The lowest slot number below `capacity` that none of `holders` has.
pub(super) fn lowest_free(holders: &[HolderRow], capacity: u32) -> Option<u32> {
    let taken: HashSet<u32> = holders.iter().map(|row| row.slot).collect();
    (0..capacity).find(|slot| !taken.contains(slot))
}

/// The tokens of the waiters in the first two places of the line of `name`:
/// when the line moves, those at the head may take a slot (every sharer there
/// at once) and those second must watch the head (docs/guide.md: "The waiting line").
fn front(tx: &Connection, name: &str, now: &Now) -> rusqlite::Result<Vec<String>> {
    let mut places = Places::default();
    let mut front = Vec::new();
    for waiter in live_waiters(tx, Some(name), now, SCHEMA_VERSION)? {
        if places.next(waiter.owner.mode) > 2 {
            break;
        }
        front.push(waiter.owner.token);
    }
    Ok(front)
}

/// Wakes the waiters of `tokens`, once what they must see is committed.
pub(super) fn ring(tokens: &[String]) {
    for token in tokens {
        doorbell::ring(token);
    }
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
