//! The rows of holders and waiters, and the queries that read them: in a
//! database of any schema version, as `status` reads an older one as it is.

use rusqlite::{Connection, OptionalExtension, params};

use super::database::{MODES_SINCE, PARALLELISM_SINCE, SCHEMA_VERSION};
use crate::backend::{Entry, Mode, Owner};
use crate::identity::Process;

/// A holder's row.
pub(super) struct HolderRow {
    pub(super) name: String,
    pub(super) slot: u32,
    pub(super) owner: Owner,
    pub(super) fence: u64,
    pub(super) acquired_at: u64,
    pub(super) expires_at: u64,
    /// Its lockrun has finished; the slot stays taken until expiry (`--min-hold`).
    pub(super) released: bool,
}

/// A waiter's row.
pub(super) struct WaiterRow {
    pub(super) name: String,
    pub(super) owner: Owner,
    pub(super) since: u64,
    pub(super) expires_at: u64,
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

/// The holders of `name` (or of every name) whose leases have not expired, by
/// name and slot, in a database of schema `version`.
pub(super) fn live_holders(
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
pub(super) fn live_waiters(
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
pub(super) fn next_waiter(
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
        user: String::new(),
        note: None,
        mode: Mode::parse(&row.get::<_, String>("mode")?),
        parallelism: row.get("parallelism")?,
    }
    .unpacked())
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
