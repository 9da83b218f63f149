//! The rows of holders and waiters, and the queries that read them: in a
//! database of any schema version, as `status` reads an older one as it is.
//! A row counts only while its lease or place runs, as [`Now`] judges it.

use rusqlite::{Connection, params};

use super::database::{BOOT_CLOCK_SINCE, MODES_SINCE, PARALLELISM_SINCE};
use super::judge::{Dated, Now};
use crate::backend::{Entry, Mode, Owner};
use crate::identity::Process;
use crate::platform::clock::Moment;

/// A holder's row.
pub(super) struct HolderRow {
    pub(super) name: String,
    pub(super) slot: u32,
    pub(super) owner: Owner,
    pub(super) fence: u64,
    pub(super) acquired_at: u64,
    /// When its lease ends by the wall clock, for `status`: never compared.
    pub(super) expires_at: u64,
    /// When its lease ends, as judged (see `judge`).
    pub(super) ends: Moment,
    /// When its lease was last dated, if on our boot clock (see `judge`).
    pub(super) dated_at: Option<Moment>,
    /// Its lockrun has finished; the slot stays taken until expiry (`--min-hold`).
    pub(super) released: bool,
}

/// A waiter's row.
pub(super) struct WaiterRow {
    pub(super) ticket: i64,
    pub(super) name: String,
    pub(super) owner: Owner,
    pub(super) since: u64,
    /// When its place lapses by the wall clock, for `status`: never compared.
    pub(super) expires_at: u64,
    /// When its place lapses, as judged (see `judge`).
    pub(super) ends: Moment,
    /// The lease of a slot granted to it, in milliseconds; unknown in rows of older lockruns.
    pub(super) ttl: Option<u64>,
}

impl HolderRow {
    pub(super) fn entry(&self) -> Entry {
        Entry::holder(&self.name, self.slot, &self.owner, Some(self.acquired_at))
            .fenced(self.fence)
            .expiring(Some(self.expires_at))
    }
}

/// The holders of `name` (or of every name), by name and slot, in a database
/// of schema `version`: those whose leases run (`live`), or those whose have
/// ended (not `live`).
pub(super) fn holders(
    tx: &Connection,
    name: Option<&str>,
    now: &Now,
    version: u32,
    live: bool,
) -> rusqlite::Result<Vec<HolderRow>> {
    let mut statement = tx.prepare(&format!(
        "SELECT name, slot, token, fence, pid, start_time, boot_id, host, command,
                acquired_at, expires_at, released, {}
         FROM holders WHERE (?1 IS NULL OR name = ?1) ORDER BY name, slot",
        later_columns(version)
    ))?;
    let rows = statement.query_map(params![name], |row| {
        let name: String = row.get("name")?;
        let slot: u32 = row.get("slot")?;
        let token: String = row.get("token")?;
        let fence: u64 = row.get("fence")?;
        let acquired_at: u64 = row.get("acquired_at")?;
        let expires_at: u64 = row.get("expires_at")?;
        let dated = dated(
            row,
            format!("holder {name} {slot} {token} {fence}"),
            expires_at.saturating_sub(acquired_at),
        )?;
        let holder = HolderRow {
            name,
            slot,
            owner: owner(row)?,
            fence,
            acquired_at,
            expires_at,
            ends: Moment::now(),
            dated_at: None,
            released: row.get("released")?,
        };
        Ok((holder, dated))
    })?;
    let mut judged = Vec::new();
    for row in rows {
        let (mut holder, dated) = row?;
        let end = now.end(&dated);
        if end.is_some() == live {
            holder.ends = end.unwrap_or(now.at);
            holder.dated_at = now.dated_at(&dated);
            judged.push(holder);
        }
    }
    Ok(judged)
}

/// The holders of `name` (or of every name) whose leases run, by name and slot.
pub(super) fn live_holders(
    tx: &Connection,
    name: Option<&str>,
    now: &Now,
    version: u32,
) -> rusqlite::Result<Vec<HolderRow>> {
    holders(tx, name, now, version, true)
}

/// The waiters of `name` (or of every name), in line order, in a database of
/// schema `version`: those whose places run (`live`), or those whose have lapsed.
pub(super) fn waiters(
    tx: &Connection,
    name: Option<&str>,
    now: &Now,
    version: u32,
    live: bool,
) -> rusqlite::Result<Vec<WaiterRow>> {
    let ttl = if version >= MODES_SINCE {
        "ttl"
    } else {
        "NULL AS ttl"
    };
    let mut statement = tx.prepare(&format!(
        "SELECT ticket, name, token, pid, start_time, boot_id, host, command, since, expires_at,
                {ttl}, {}
         FROM waiters WHERE (?1 IS NULL OR name = ?1) ORDER BY name, ticket",
        later_columns(version)
    ))?;
    let rows = statement.query_map(params![name], |row| {
        let ticket: i64 = row.get("ticket")?;
        let since: u64 = row.get("since")?;
        let expires_at: u64 = row.get("expires_at")?;
        let ttl: Option<u64> = row.get("ttl")?;
        let span = ttl.unwrap_or_else(|| expires_at.saturating_sub(since));
        let dated = dated(row, format!("waiter {ticket}"), span)?;
        let waiter = WaiterRow {
            ticket,
            name: row.get("name")?,
            owner: owner(row)?,
            since,
            expires_at,
            ends: Moment::now(),
            ttl,
        };
        Ok((waiter, dated))
    })?;
    let mut judged = Vec::new();
    for row in rows {
        let (mut waiter, dated) = row?;
        let end = now.end(&dated);
        if end.is_some() == live {
            waiter.ends = end.unwrap_or(now.at);
            judged.push(waiter);
        }
    }
    Ok(judged)
}

/// The waiters of `name` (or of every name) whose places run, in line order.
pub(super) fn live_waiters(
    tx: &Connection,
    name: Option<&str>,
    now: &Now,
    version: u32,
) -> rusqlite::Result<Vec<WaiterRow>> {
    waiters(tx, name, now, version, true)
}

/// How the row dates its end; `legacy_span` is its span in a row of an older
/// lockrun, which says only when it ends by the wall clock.
fn dated(row: &rusqlite::Row, key: String, legacy_span: u64) -> rusqlite::Result<Dated> {
    let expires_at: u64 = row.get("expires_at")?;
    let span: Option<u64> = row.get("span")?;
    Ok(Dated {
        key,
        clock: row.get("clock")?,
        ends: row.get("ends")?,
        span: span.unwrap_or(legacy_span),
        beat: (row.get("beat")?, expires_at),
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
        user: String::new(),
        note: None,
        mode: Mode::parse(&row.get::<_, String>("mode")?),
        parallelism: row.get("parallelism")?,
    }
    .unpacked())
}

/// The columns of later versions, or what a database older than them means by
/// their absence (no known `-p`, exclusive, no boot clock): `status` reads an
/// older database without bringing it up to date (it never writes).
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
    let clock = if version >= BOOT_CLOCK_SINCE {
        "clock, ends, span, beat"
    } else {
        "NULL AS clock, NULL AS ends, NULL AS span, 0 AS beat"
    };
    format!("{parallelism}, {mode}, {clock}")
}
