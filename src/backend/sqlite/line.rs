//! What changes a name's line, inside a write transaction: joining it, taking a
//! slot, leaving; and after a change, granting the freed slots to the head of
//! the line and saying whom to ring once it is committed.

use std::collections::HashSet;

use rusqlite::{Connection, params};

use super::database::SCHEMA_VERSION;
use super::rows::{HolderRow, live_holders, next_waiter};
use crate::backend::{Mode, Owner, admitted, capacity};
use crate::platform::doorbell;

/// Puts `owner` at the end of the line of `name`, its place kept for `ttl` ms.
pub(super) fn join(
    tx: &Connection,
    name: &str,
    owner: &Owner,
    now: u64,
    ttl: u64,
) -> rusqlite::Result<()> {
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
            owner.packed(),
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
pub(super) fn take_slot(
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
            owner.packed(),
            now,
            expires_at,
            owner.parallelism,
            owner.mode.as_str(),
        ],
    )?;
    Ok(fence)
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
pub(super) fn moved(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<Vec<String>> {
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
pub(super) fn lowest_free(holders: &[HolderRow], capacity: u32) -> Option<u32> {
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
pub(super) struct Places {
    place: u32,
    last: Option<Mode>,
}

impl Places {
    /// The place, from 1, of the next waiter, who waits in `mode`.
    pub(super) fn next(&mut self, mode: Mode) -> u32 {
        if mode == Mode::Exclusive || self.last != Some(Mode::Shared) {
            self.place += 1;
        }
        self.last = Some(mode);
        self.place
    }
}

/// Wakes the waiters of `tokens`, once what they must see is committed.
pub(super) fn ring(tokens: &[String]) {
    for token in tokens {
        doorbell::ring(token);
    }
}

/// Drops the rows of `name` whose leases or places in line have lapsed.
pub(super) fn purge_expired(tx: &Connection, name: &str, now: u64) -> rusqlite::Result<()> {
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

pub(super) fn refresh_waiter(
    tx: &Connection,
    token: &str,
    expires_at: u64,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE waiters SET expires_at = ?1 WHERE token = ?2",
        params![expires_at, token],
    )?;
    Ok(())
}
