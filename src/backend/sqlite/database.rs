//! Finding, vetting and opening the SQLite database. A file is only ever
//! written to once it is known to be lockrun's (or empty): the check reads
//! the raw header, so a foreign file is never even opened by SQLite.

use std::env;
use std::fs::{DirBuilder, FileType, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use crate::backend::newer_format;
use crate::backoff::{self, Backoff};
use crate::error::{Error, Result, Trouble};

/// Bumped when the tables change, so a later lockrun can migrate (stored in `PRAGMA user_version`).
pub const SCHEMA_VERSION: u32 = 5;
/// Marks the file as lockrun's in the SQLite header (`PRAGMA application_id`): "LKRN".
const APPLICATION_ID: u32 = 0x4c4b_524e;

/// How long a statement waits for another connection's lock before giving up.
/// lockrun's own transactions last milliseconds; a lock held this long is stuck.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// The pause between tries of a busy `BEGIN IMMEDIATE`. Another lockrun's
/// write lasts about a millisecond; SQLite's own busy handler would sleep ever
/// longer (up to 100 ms a time), which the sharers woken together by one
/// release, taking their slots one after another, would pay many times over.
const WRITE_LOCK_RETRY: Duration = Duration::from_micros(250);

/// Pauses between tries of a busy switch to WAL mode: short, as the other
/// lockrun's transaction lasts milliseconds, and jittered, as a herd may retry.
const WAL_SWITCH_RETRY: backoff::Policy = backoff::Policy {
    initial_delay: Duration::from_millis(10),
    max_delay: Duration::from_millis(100),
    multiplier: 2.0,
};

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

/// Version 2: the waiting line. AUTOINCREMENT: a ticket is never handed out twice.
const WAITERS: &str = "
CREATE TABLE waiters (
    ticket INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    host TEXT NOT NULL,
    command TEXT NOT NULL,
    since INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX waiters_by_name ON waiters (name, ticket);
";

/// Version 3: each holder's and waiter's `-p`, as a name's slot count is part
/// of the lock (docs/guide.md: "Slots"); NULL in rows of older lockruns.
const PARALLELISM: &str = "
ALTER TABLE holders ADD COLUMN parallelism INTEGER;
ALTER TABLE waiters ADD COLUMN parallelism INTEGER;
";

/// Version 4: whether each holder and waiter holds the name alone or shares
/// it (docs/guide.md: "Shared locks"), rows of older lockruns held alone; and each
/// waiter's TTL in milliseconds, the lease of a slot granted to it.
const MODES: &str = "
ALTER TABLE holders ADD COLUMN mode TEXT NOT NULL DEFAULT 'exclusive';
ALTER TABLE waiters ADD COLUMN mode TEXT NOT NULL DEFAULT 'exclusive';
ALTER TABLE waiters ADD COLUMN ttl INTEGER;
";

/// Version 5: each lease's and place's end on the boot clock of the kernel
/// that wrote it (docs/backends/sqlite.md: "SQLite backend"): that boot's id (`clock`), the end
/// in milliseconds after it (`ends`), the milliseconds from the writing to the
/// end (`span`), and a `beat` that every writing changes. A renewal by an
/// older lockrun changes `expires_at` alone: the triggers then clear `clock`,
/// and the row is judged by its beats.
const BOOT_CLOCK: &str = "
ALTER TABLE holders ADD COLUMN clock TEXT;
ALTER TABLE holders ADD COLUMN ends INTEGER;
ALTER TABLE holders ADD COLUMN span INTEGER;
ALTER TABLE holders ADD COLUMN beat INTEGER NOT NULL DEFAULT 0;
ALTER TABLE waiters ADD COLUMN clock TEXT;
ALTER TABLE waiters ADD COLUMN ends INTEGER;
ALTER TABLE waiters ADD COLUMN span INTEGER;
ALTER TABLE waiters ADD COLUMN beat INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER holders_renewed_by_older AFTER UPDATE OF expires_at ON holders
WHEN NEW.beat = OLD.beat BEGIN
    UPDATE holders SET clock = NULL WHERE name = NEW.name AND slot = NEW.slot;
END;
CREATE TRIGGER waiters_refreshed_by_older AFTER UPDATE OF expires_at ON waiters
WHEN NEW.beat = OLD.beat BEGIN
    UPDATE waiters SET clock = NULL WHERE ticket = NEW.ticket;
END;
";

/// What brings a database of version N (from 1) up to version N + 1.
const UPGRADES: [&str; SCHEMA_VERSION as usize - 1] = [WAITERS, PARALLELISM, MODES, BOOT_CLOCK];

/// The first version whose rows say their `-p`.
pub const PARALLELISM_SINCE: u32 = 3;
/// The first version whose rows say their mode.
pub const MODES_SINCE: u32 = 4;
/// The first version whose rows date their ends on a boot clock.
pub const BOOT_CLOCK_SINCE: u32 = 5;

/// An open lockrun database.
pub struct Database {
    pub path: PathBuf,
    conn: Connection,
}

impl Database {
    /// Runs `body` in one `BEGIN IMMEDIATE` transaction, waiting at most `busy` for the write lock.
    pub fn write<T>(
        &self,
        what: &str,
        busy: Duration,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        self.transaction(what, TransactionBehavior::Immediate, busy, body)
    }

    /// Runs `body` in one read transaction: it sees one state of the database and changes nothing.
    pub fn read<T>(
        &self,
        what: &str,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        self.transaction(what, TransactionBehavior::Deferred, BUSY_TIMEOUT, body)
    }

    fn transaction<T>(
        &self,
        what: &str,
        behavior: TransactionBehavior,
        busy: Duration,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let fail = |err| failure(&self.path, what, &err);
        let tx = if matches!(behavior, TransactionBehavior::Immediate) {
            self.begin_write(busy).map_err(fail)?
        } else {
            self.conn.busy_timeout(busy).map_err(fail)?;
            Transaction::new_unchecked(&self.conn, behavior).map_err(fail)?
        };
        let value = body(&tx).map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(value)
    }

    /// Takes the write lock, trying again every [`WRITE_LOCK_RETRY`] for at most `busy`.
    fn begin_write(&self, busy: Duration) -> rusqlite::Result<Transaction<'_>> {
        let deadline = Instant::now() + busy;
        self.conn.busy_timeout(Duration::ZERO)?;
        let tx = loop {
            match Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate) {
                Err(err) if is_busy(&err) && Instant::now() < deadline => {
                    thread::sleep(WRITE_LOCK_RETRY);
                }
                begun => break begun?,
            }
        };
        // What waits inside the transaction (a checkpoint's lock) is left to SQLite's handler.
        self.conn.busy_timeout(busy)?;
        Ok(tx)
    }

    /// Changes whenever another connection commits: answered from shared memory, without disk access.
    pub fn data_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .map_err(|err| failure(&self.path, "watch for changes", &err))
    }
}

/// Opens the lockrun database at `path` (or the default), creating it when
/// missing if `create`; without, a missing database is an error.
pub fn open(path: Option<&Path>, create: bool) -> Result<Database> {
    let path = match path {
        Some(path) => path.to_owned(),
        None => default_path()?,
    };
    if create {
        create_parent(&path)?;
    }
    let existing = inspect(&path)?;
    if !existing && !create {
        return Err(Error::Missing(format!(
            "there is no lockrun database at {}",
            path.display()
        )));
    }
    // No URI flag: a path that looks like `file:...?mode=...` is still just a path.
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let mut conn =
        Connection::open_with_flags(&path, flags).map_err(|err| failure(&path, "open", &err))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|err| failure(&path, "configure", &err))?;
    if create {
        initialize(&mut conn, &path)?;
    }
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let mut backoff = Backoff::new(WAL_SWITCH_RETRY);
    switch_to_wal(&conn, &path, || {
        let left = deadline.saturating_duration_since(Instant::now());
        thread::sleep(backoff.next_wait(Some(left)));
        !left.is_zero()
    })?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|err| failure(&path, "configure", &err))?;
    Ok(Database { path, conn })
}

/// Switches the database to WAL mode (kept in the file: later opens find it
/// so). A new database starts in rollback mode, and the switch must upgrade a
/// read lock to the write lock: when another lockrun already holds the write
/// lock, SQLite answers "busy" at once instead of waiting, as waiting could
/// deadlock. So a busy switch is tried again after `pause`, while it says so.
fn switch_to_wal(conn: &Connection, path: &Path, mut pause: impl FnMut() -> bool) -> Result<()> {
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        }) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::Unavailable(format!(
                    "cannot use {}: SQLite refused WAL mode (journal mode is {mode})",
                    path.display()
                )));
            }
            Err(err) if is_busy(&err) && pause() => {}
            Err(err) => return Err(failure(path, "switch to WAL mode", &err)),
        }
    }
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
    let refuse = |what: String| {
        Error::Unavailable(format!(
            "{} {what}; refusing to touch it (choose another --db)",
            path.display()
        ))
    };
    let cannot_read =
        |err| Error::unavailable(format!("cannot read the database {}", path.display()), err);
    // O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is read.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(cannot_read(err)),
    };
    let file_type = file.metadata().map_err(cannot_read)?.file_type();
    if !file_type.is_file() {
        // SQLite would block on a FIFO, or write a journal next to a device (/dev/null-journal).
        return Err(refuse(format!(
            "is {}, not a regular file",
            kind_of(file_type)
        )));
    }
    let mut header = Vec::with_capacity(100);
    file.take(100)
        .read_to_end(&mut header)
        .map_err(cannot_read)?;
    if header.is_empty() {
        return Ok(false);
    }
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
        1..=SCHEMA_VERSION => Ok(true),
        version if version > SCHEMA_VERSION => Err(Error::Unavailable(newer_format(
            &format!("the SQLite database {}", path.display()),
            "schema version",
            version,
            SCHEMA_VERSION,
        ))),
        version => Err(refuse(format!(
            "has lockrun schema version {version}, which this lockrun (version {SCHEMA_VERSION}) does not know"
        ))),
    }
}

/// What a file that is not a regular file is, for the refusal.
fn kind_of(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// Creates the tables in a new, empty database, or brings an older lockrun
/// database up to date. Another lockrun may be doing the same: the write lock
/// orders them and the second finds the work done.
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
    let upgrades = match (application_id, version) {
        (APPLICATION_ID, SCHEMA_VERSION) => return Ok(()),
        (APPLICATION_ID, 1..SCHEMA_VERSION) => &UPGRADES[version as usize - 1..],
        (0, 0) if objects == 0 => {
            tx.execute_batch(SCHEMA).map_err(fail)?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(fail)?;
            &UPGRADES[..]
        }
        _ => {
            return Err(Error::Unavailable(format!(
                "{} is another program's SQLite database, not lockrun's; refusing to touch it (choose another --db)",
                path.display()
            )));
        }
    };
    for upgrade in upgrades {
        tx.execute_batch(upgrade).map_err(fail)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(fail)?;
    tx.commit().map_err(fail)
}

fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// A database failure as the user should read it (exit 69).
pub fn failure(path: &Path, what: &str, err: &rusqlite::Error) -> Error {
    let path = path.display();
    match err.sqlite_error_code() {
        _ if is_busy(err) => Error::trouble(
            Trouble::Transient,
            format!("cannot {what}: the SQLite database {path} stayed locked by another process"),
        ),
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
pub(super) mod tests {
    use super::*;

    /// A lockrun database still in rollback mode, as its creator leaves it
    /// before switching, and a second connection holding its write lock.
    fn rollback_database_with_a_writer() -> (tempfile::TempDir, PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.sqlite3");
        initialize(&mut Connection::open(&path).unwrap(), &path).unwrap();
        let writer = Connection::open(&path).unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        (dir, path, writer)
    }

    fn journal_version(path: &Path) -> (u8, u8) {
        let header = std::fs::read(path).unwrap();
        (header[18], header[19])
    }

    #[test]
    fn a_switch_to_wal_refused_while_another_writes_is_tried_again() {
        let (_dir, path, writer) = rollback_database_with_a_writer();
        let conn = Connection::open(&path).unwrap();
        conn.busy_timeout(BUSY_TIMEOUT).unwrap();
        let mut pauses = 0;
        switch_to_wal(&conn, &path, || {
            pauses += 1;
            writer.execute_batch("COMMIT").unwrap();
            true
        })
        .unwrap();
        assert_eq!(pauses, 1, "the first try was not refused");
        assert_eq!(
            journal_version(&path),
            (2, 2),
            "the file is not in WAL mode"
        );
    }

    #[test]
    fn a_switch_to_wal_busy_past_its_time_says_so() {
        let (_dir, path, _writer) = rollback_database_with_a_writer();
        let conn = Connection::open(&path).unwrap();
        let Err(err) = switch_to_wal(&conn, &path, || false) else {
            panic!("switched while another connection held the write lock");
        };
        assert!(
            err.to_string().contains("stayed locked by another process"),
            "{err}"
        );
        assert_eq!(journal_version(&path), (1, 1));
    }

    /// A holder and a waiter of `old` on another host, as a lockrun of schema version 3 wrote them.
    pub(in super::super) const VERSION_3_ROWS: &str = "
        INSERT INTO holders (name, slot, token, fence, pid, start_time, boot_id, host, command,
                             acquired_at, expires_at, parallelism)
        VALUES ('old', 0, 't1', 1, 1, 1, 'b', 'elsewhere', 'c', 1, 9999999999999, 1);
        INSERT INTO waiters (name, token, pid, start_time, boot_id, host, command, since,
                             expires_at, parallelism)
        VALUES ('old', 't2', 2, 1, 'b', 'elsewhere', 'c', 1, 9999999999999, 1);";

    /// A database as a lockrun of schema `version` left it, with `rows` run in it.
    pub(in super::super) fn database_of_version(
        version: u32,
        rows: &str,
    ) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.sqlite3");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(SCHEMA).unwrap();
        for upgrade in &UPGRADES[..version as usize - 1] {
            old.execute_batch(upgrade).unwrap();
        }
        old.execute_batch(rows).unwrap();
        old.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        old.pragma_update(None, "user_version", version).unwrap();
        (dir, path)
    }

    fn user_version(db: &Database) -> u32 {
        db.conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn a_version_2_database_is_brought_up_to_date() {
        let (_dir, path) = database_of_version(2, "");
        let db = open(Some(&path), true).unwrap();
        assert_eq!(user_version(&db), SCHEMA_VERSION);
        db.conn
            .prepare(
                "SELECT h.parallelism, w.parallelism, h.mode, w.mode, w.ttl, h.clock, h.ends, h.span,
                        h.beat, w.clock, w.ends, w.span, w.beat FROM holders h, waiters w",
            )
            .unwrap();
    }

    #[test]
    fn the_rows_of_a_version_3_database_read_as_exclusive() {
        let (_dir, path) = database_of_version(3, VERSION_3_ROWS);
        let db = open(Some(&path), true).unwrap();
        assert_eq!(user_version(&db), SCHEMA_VERSION);
        let modes: (String, String) = db
            .conn
            .query_row(
                "SELECT h.mode, w.mode FROM holders h, waiters w",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(modes, ("exclusive".to_owned(), "exclusive".to_owned()));
    }

    #[test]
    fn a_renewal_by_an_older_lockrun_leaves_its_row_to_the_heartbeat_rule() {
        let (_dir, path) = database_of_version(4, "");
        let db = open(Some(&path), true).unwrap();
        assert_eq!(user_version(&db), SCHEMA_VERSION);
        let clock = |db: &Database| -> Option<String> {
            db.conn
                .query_row("SELECT clock FROM holders", [], |row| row.get(0))
                .unwrap()
        };
        db.conn
            .execute_batch(
                "INSERT INTO holders (name, slot, token, fence, pid, start_time, boot_id, host,
                                      command, acquired_at, expires_at, clock, ends, span)
                 VALUES ('x', 0, 't', 1, 1, 1, 'b', 'h', 'c', 0, 10, 'b', 10, 10);
                 UPDATE holders SET expires_at = 20, clock = 'b', ends = 20, beat = beat + 1",
            )
            .unwrap();
        assert_eq!(
            clock(&db).as_deref(),
            Some("b"),
            "a renewal of this version"
        );
        // What an older lockrun's renewal writes: the wall-clock end alone.
        db.conn
            .execute_batch("UPDATE holders SET expires_at = 30")
            .unwrap();
        assert_eq!(clock(&db), None, "no longer judged by a boot clock");
    }

    #[test]
    fn a_database_from_a_newer_lockrun_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.sqlite3");
        let db = open(Some(&path), true).unwrap();
        db.conn
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        // Closing the last connection checkpoints the WAL into the file's header.
        drop(db);
        let before = std::fs::read(&path).unwrap();
        let Err(err) = open(Some(&path), true) else {
            panic!("a newer database was opened");
        };
        let newer = format!("schema version {}", SCHEMA_VERSION + 1);
        assert!(err.to_string().contains(&newer), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}
