//! Finding, vetting and opening the SQLite database. A file is only ever
//! written to once it is known to be lockrun's (or empty): the check reads
//! the raw header, so a foreign file is never even opened by SQLite.

use std::env;
use std::fs::{DirBuilder, File};
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::error::{Error, Result};

/// Bumped when the tables change, so a later lockrun can migrate (stored in `PRAGMA user_version`).
const SCHEMA_VERSION: u32 = 1;
/// Marks the file as lockrun's in the SQLite header (`PRAGMA application_id`): "LKRN".
const APPLICATION_ID: u32 = 0x4c4b_524e;

/// How long a statement waits for another connection's lock before giving up.
/// lockrun's own transactions last milliseconds; a lock held this long is stuck.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

const SCHEMA: &str = "
CREATE TABLE holders (
    name TEXT NOT NULL,
    slot INTEGER NOT NULL,
    token TEXT NOT NULL,
    fence INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    host TEXT NOT NULL,
    command TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    released INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
) WITHOUT ROWID;
CREATE TABLE fences (
    name TEXT PRIMARY KEY,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Opens the lockrun database at `path` (or the default), creating it when missing.
pub fn open(path: Option<PathBuf>) -> Result<(PathBuf, Connection)> {
    let path = match path {
        Some(path) => path,
        None => default_path()?,
    };
    create_parent(&path)?;
    let existing = inspect(&path)?;
    // No URI flag: a path that looks like `file:...?mode=...` is still just a path.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn =
        Connection::open_with_flags(&path, flags).map_err(|err| failure(&path, "open", &err))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|err| failure(&path, "configure", &err))?;
    if !existing {
        initialize(&mut conn, &path)?;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|err| failure(&path, "switch to WAL mode", &err))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Unavailable(format!(
            "cannot use {}: SQLite refused WAL mode (journal mode is {mode})",
            path.display()
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|err| failure(&path, "configure", &err))?;
    Ok((path, conn))
}

/// `$XDG_STATE_HOME/lockrun/locks.sqlite3`, else `~/.local/state/lockrun/locks.sqlite3`.
fn default_path() -> Result<PathBuf> {
    let absolute = |var: &str| {
        env::var_os(var)
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute())
    };
    let state = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local/state")))
        .ok_or_else(|| {
            Error::Unavailable(
                "no default SQLite database: neither XDG_STATE_HOME nor HOME is set; use --db"
                    .into(),
            )
        })?;
    Ok(state.join("lockrun").join("locks.sqlite3"))
}

fn create_parent(path: &Path) -> Result<()> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(|err| {
            Error::unavailable(
                format!("cannot create the database directory {}", parent.display()),
                err,
            )
        })
}

/// Whether `path` already holds a lockrun database (`false`: missing or empty,
/// to be created); anything else is refused before SQLite opens it.
fn inspect(path: &Path) -> Result<bool> {
    let mut header = Vec::with_capacity(100);
    let read = File::open(path).and_then(|file| file.take(100).read_to_end(&mut header));
    match read {
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => {
            return Err(Error::unavailable(
                format!("cannot read the database {}", path.display()),
                err,
            ));
        }
    }
    if header.is_empty() {
        return Ok(false);
    }
    let refuse = |what: String| {
        Error::Unavailable(format!(
            "{} {what}; refusing to touch it (choose another --db)",
            path.display()
        ))
    };
    if header.len() < 100 || !header.starts_with(b"SQLite format 3\0") {
        return Err(refuse(
            "is not a lockrun database (not an SQLite file)".into(),
        ));
    }
    let field = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    // Offsets from the SQLite file format: user_version at 60, application_id at 68.
    if field(68) != APPLICATION_ID {
        return Err(refuse(
            "is another program's SQLite database, not lockrun's".into(),
        ));
    }
    match field(60) {
        SCHEMA_VERSION => Ok(true),
        version => Err(refuse(format!(
            "has lockrun schema version {version}, which this lockrun (version {SCHEMA_VERSION}) does not know"
        ))),
    }
}

/// Creates the tables in a new, empty database. Another lockrun may be doing
/// the same: the write lock orders them and the second finds the work done.
fn initialize(conn: &mut Connection, path: &Path) -> Result<()> {
    let fail = |err: rusqlite::Error| failure(path, "create the tables", &err);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail)?;
    let (application_id, version, objects): (u32, u32, u32) = tx
        .query_row(
            "SELECT (SELECT application_id FROM pragma_application_id),
                    (SELECT user_version FROM pragma_user_version),
                    (SELECT count(*) FROM sqlite_schema)",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(fail)?;
    if application_id == APPLICATION_ID && version == SCHEMA_VERSION {
        return Ok(());
    }
    if application_id != 0 || version != 0 || objects != 0 {
        return Err(Error::Unavailable(format!(
            "{} is another program's SQLite database, not lockrun's; refusing to touch it (choose another --db)",
            path.display()
        )));
    }
    tx.execute_batch(SCHEMA).map_err(fail)?;
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(fail)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(fail)?;
    tx.commit().map_err(fail)
}

/// A database failure as the user should read it (exit 69).
pub fn failure(path: &Path, what: &str, err: &rusqlite::Error) -> Error {
    let code = err.sqlite_error_code();
    let path = path.display();
    match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::Unavailable(format!(
            "cannot {what}: the SQLite database {path} stayed locked by another process"
        )),
        Some(ErrorCode::ReadOnly) => Error::Unavailable(format!(
            "cannot {what}: the SQLite database {path} is read-only"
        )),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => Error::Unavailable(format!(
            "cannot {what}: the SQLite database {path} is damaged ({err})"
        )),
        _ => Error::Unavailable(format!(
            "cannot {what} in the SQLite database {path}: {err}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_from_a_newer_lockrun_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.sqlite3");
        let (_, conn) = open(Some(path.clone())).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        // Closing the last connection checkpoints the WAL into the file's header.
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let err = open(Some(path.clone())).expect_err("refused");
        assert!(err.to_string().contains("schema version 2"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}
