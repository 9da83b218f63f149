//! Where locks live. Each backend implements [`Backend`]; the acquire loop,
//! the supervisor and the operator commands only talk to this trait.

mod file;
mod redis;
mod sqlite;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::identity::Process;
use crate::name::Name;
use crate::platform::clock::Moment;

pub use file::FileBackend;
pub use redis::RedisBackend;
pub use sqlite::SqliteBackend;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    File,
    Sqlite,
    Redis,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
        }
    }

    /// Lease backends expire a holder after its TTL; file locks die with their holder.
    pub fn uses_leases(self) -> bool {
        self != Self::File
    }
}

/// Everything a backend needs to find its store.
#[derive(Clone, Debug)]
pub struct Location {
    pub kind: Kind,
    pub dir: Option<PathBuf>,
    pub db: Option<PathBuf>,
    pub redis_url: String,
    pub prefix: String,
}

/// One attempt to take a slot of `name`.
#[derive(Clone, Debug)]
pub struct Request {
    pub name: Name,
    pub parallelism: u32,
    /// Lease length on lease backends.
    pub ttl: Duration,
    pub owner: Owner,
}

/// Who is asking: written into the slot for `status` and for same-host reclaim.
#[derive(Clone, Debug)]
pub struct Owner {
    pub token: String,
    pub process: Process,
    pub command: String,
}

/// A slot this lockrun now holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub slot: u32,
    pub fence: u64,
    /// When the request that took the slot was sent: a lease runs from no earlier than this.
    pub sent: Moment,
}

/// How long one wait may last.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// Return (`Ok(None)`) by then at the latest: the end of a backoff step, after
    /// which a polling backend tries again, or sooner when the live waiting line
    /// needs redrawing.
    pub step_until: Moment,
    /// The `--timeout` deadline; `None` waits forever.
    pub deadline: Option<Moment>,
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease is ours until at least the TTL from when the renewal was sent.
    Renewed,
    /// The lease is gone (expired or broken): another holder may have the slot.
    Lost,
}

impl Renewal {
    /// `Renewed` when the store confirmed the renewal, `Lost` when it found no lease of ours.
    pub fn confirmed(confirmed: bool) -> Self {
        if confirmed { Self::Renewed } else { Self::Lost }
    }
}

/// A current holder, as `status` shows it (SPEC §5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub name: String,
    pub slot: u32,
    pub pid: u32,
    pub host: String,
    pub command: String,
    /// Milliseconds since the Unix epoch.
    pub acquired_at: u64,
    /// Milliseconds since the Unix epoch; `None` for file locks.
    pub expires_at: Option<u64>,
    pub fence: u64,
}

pub trait Backend {
    /// Takes a free slot if there is one, without waiting.
    fn try_acquire(&mut self, request: &Request) -> Result<Option<Acquired>>;

    /// Waits until a slot may have been freed, at most as long as `wait` allows.
    /// A backend that can wait in the kernel takes the slot itself and returns it.
    fn wait(&mut self, request: &Request, wait: Wait) -> Result<Option<Acquired>>;

    /// Extends the held lease by the request's TTL; never re-creates a lapsed one.
    /// Gives up with an error when the renewal cannot be confirmed `within` this
    /// long: the supervisor must stop the command then, so it may not be kept waiting.
    fn renew(&mut self, within: Duration) -> Result<Renewal>;

    /// Gives the held slot up. With `keep_until` in the future, the slot stays
    /// taken until then (`--min-hold`); only lease backends can do that without
    /// lockrun staying alive.
    fn release(&mut self, keep_until: Option<SystemTime>) -> Result<()>;

    /// Current holders of `name`, or of every name.
    fn holders(&mut self, name: Option<&Name>) -> Result<Vec<Holder>>;

    /// Breaks the leases of `name` (one slot or all) and returns what it broke.
    fn break_leases(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Holder>>;

    /// Problems with the store's setup worth a warning (shown with `-v`); may ask the server.
    fn warnings(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// Opens the backend at `location`.
pub fn open(location: &Location) -> Result<Box<dyn Backend>> {
    match location.kind {
        Kind::File => Ok(Box::new(FileBackend::open(location.dir.clone())?)),
        Kind::Redis => Ok(Box::new(RedisBackend::open(
            &location.redis_url,
            &location.prefix,
        )?)),
        Kind::Sqlite => Ok(Box::new(SqliteBackend::open(location.db.clone())?)),
    }
}
