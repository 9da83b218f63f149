//! Where locks live. A backend is one folder below this one. It declares what it
//! can do ([`Abilities`]); the rest of lockrun asks that, never which backend it is.
//!
//! A backend provides its command-line options (a clap `Args` struct named
//! `Options`, with an `open` method that gives a [`Store`]), the [`Store`] — one
//! look at a name's waiting line, a wait for it to move, the operators' views —
//! and the [`Slot`] a waiter gets, which renews and releases itself. Waiting,
//! backoff, same-host reclaim of dead holders and waiters, the lease's
//! timekeeping and the holder record are written once, outside the backends
//! (`acquire.rs`, `lease.rs`, `backend/record.rs`).
//!
//! Adding a backend takes a new folder here and a few lines elsewhere (the
//! `backends!` list below, [`FORMATS`], the tests, a docs page): ARCHITECTURE.md,
//! "Adding a backend", lists them all.

mod boot_date;
#[cfg(feature = "etcd")]
pub mod etcd;
mod file;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "s3"
))]
pub mod net;
/// Public for the integration tests of its groundwork (sessions, schema, failures).
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod record;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "s3")]
mod s3;
mod sqlite;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::error::Result;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::timing::Plan;

pub use record::{Entry, Mode, Owner};

/// Generates [`StoreArgs`] (every backend's options, flattened into one clap
/// `Args`) and the table that opens the backend `--backend` names.
macro_rules! backends {
    ($($(#[$cfg:meta])* $name:ident => $module:ident,)+) => {
        /// Where locks live; shared by running, `status` and `release`.
        #[derive(Debug, clap::Args)]
        pub struct StoreArgs {
            /// Where the lock lives (in any case: sqlite, SQLite)
            #[arg(short = 'b', long, env = "LOCKRUN_BACKEND", default_value = DEFAULT_BACKEND, ignore_case = true,
                  value_parser = clap::builder::TypedValueParser::map(
                      clap::builder::PossibleValuesParser::new(NAMES),
                      |name| name.to_ascii_lowercase()))]
            pub backend: String,

            /// Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres
            #[arg(long, env = "LOCKRUN_PREFIX", default_value = "lockrun", value_name = "PREFIX")]
            pub prefix: String,

            $(
                $(#[$cfg])*
                #[command(flatten)]
                pub $name: $module::Options,
            )+

            /// The ids of the options whose value came from their variable, not a flag.
            #[arg(skip)]
            pub from_variables: Vec<String>,
        }

        /// The names `--backend` accepts, in the order of the list.
        pub const NAMES: &[&str] = &[$($(#[$cfg])* stringify!($name),)+];

        impl StoreArgs {
            /// Opens the store of the backend `--backend` names, creating it
            /// (a directory, a database, a schema) when missing only if `create`.
            pub fn open(&self, create: bool) -> Result<Box<dyn Store>> {
                let common = Common {
                    prefix: &self.prefix,
                    create,
                    from_variables: &self.from_variables,
                };
                $(
                    $(#[$cfg])*
                    if self.backend == stringify!($name) {
                        return self.$name.open(&common);
                    }
                )+
                unreachable!("clap accepts only the names of built-in backends")
            }
        }
    };
}

/// The backend of a run that names none.
pub const DEFAULT_BACKEND: &str = "file";

backends! {
    file => file,
    sqlite => sqlite,
    #[cfg(feature = "redis")]
    redis => redis,
    #[cfg(feature = "postgres")]
    postgres => postgres,
    #[cfg(feature = "etcd")]
    etcd => etcd,
    #[cfg(feature = "s3")]
    s3 => s3,
}

/// The versioned store formats of the backends built in, one line each
/// (`lockrun --version`; CHANGELOG.md: "Compatibility"): each backend's `FORMAT`.
pub const FORMATS: &[Format] = &[
    file::FORMAT,
    sqlite::FORMAT,
    #[cfg(feature = "redis")]
    redis::FORMAT,
    #[cfg(feature = "postgres")]
    postgres::FORMAT,
    #[cfg(feature = "etcd")]
    etcd::FORMAT,
    #[cfg(feature = "s3")]
    s3::FORMAT,
];

/// A backend's versioned store format: what it writes, and the oldest it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub backend: &'static str,
    /// What carries the version (`schema`, `format`, `key format`).
    pub kind: &'static str,
    /// The version this lockrun writes, and reads; a newer one it refuses.
    pub writes: u32,
    /// The oldest version it reads (and brings up to `writes` when it runs).
    pub reads_from: u32,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            backend,
            kind,
            writes,
            reads_from,
        } = self;
        write!(f, "{backend} {kind} {writes}")?;
        if reads_from < writes {
            write!(f, " (reads {reads_from} to {writes})")?;
        }
        Ok(())
    }
}

impl StoreArgs {
    /// Notes which of the store's options (`definition`: a command of them
    /// alone) `matches` took from their variable.
    pub fn note_variables(&mut self, definition: &clap::Command, matches: &clap::ArgMatches) {
        self.from_variables = definition
            .get_arguments()
            .map(|arg| arg.get_id().as_str())
            .filter(|id| {
                matches.try_get_raw(id).is_ok()
                    && matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable)
            })
            .map(str::to_owned)
            .collect();
    }
}

/// Why a store written by a newer lockrun is refused, before anything in it is
/// touched (exit 69; docs/operating.md: "Upgrading"): `what` names the store's format
/// (`file format`, `schema version`), `found` is its, `ours` the newest this lockrun knows.
pub fn newer_format(store: &str, what: &str, found: impl std::fmt::Display, ours: u32) -> String {
    format!(
        "{store} was written by a newer lockrun ({what} {found}; lockrun {} knows {what} {ours} and older): upgrade lockrun",
        env!("CARGO_PKG_VERSION")
    )
}

/// What every backend is told when it opens its store.
pub struct Common<'a> {
    /// `--prefix`, for backends that name keys or a schema.
    pub prefix: &'a str,
    /// Whether a missing store may be created: running does, `status` and `release` only look.
    pub create: bool,
    /// The ids of the options whose value came from their variable.
    pub from_variables: &'a [String],
}

impl Common<'_> {
    /// What a message calls the option `id`: its `flag`, or the `variable` it was read from.
    pub fn option_name(
        &self,
        id: &str,
        flag: &'static str,
        variable: &'static str,
    ) -> &'static str {
        if self.from_variables.iter().any(|from| from == id) {
            variable
        } else {
            flag
        }
    }
}

/// What a backend can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abilities {
    /// A slot is a lease that lapses unless renewed; otherwise the kernel or the
    /// server holds it for exactly as long as lockrun lives, with nothing to renew.
    pub leases: bool,
    /// `release --force` can take a slot away from its holder.
    pub breakable: bool,
    /// How a waiter learns that the line moved.
    pub wakeup: Wakeup,
}

impl Abilities {
    /// A store of leases that can be broken and tells its waiters when the line
    /// moves: a database or a server of locks.
    pub const LEASES_THAT_TELL: Self = Self {
        leases: true,
        breakable: true,
        wakeup: Wakeup::Told,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// [`Store::wait`] blocks until the line moves (in the kernel): no polling, no backoff.
    Blocks,
    /// [`Store::wait`] returns when told that the line moved; backoff steps only
    /// bound how long a lost notice could keep a waiter asleep.
    Told,
    /// [`Store::wait`] returns when a watch sees the line move; the watch starts
    /// where the last look ended and ends the wait with an error if it breaks,
    /// so no change is lost: no backoff steps.
    Watches,
}

/// One waiter's request for a slot of `name`.
#[derive(Clone, Debug)]
pub struct Request {
    pub name: Name,
    pub parallelism: u32,
    /// The lease's timing: its length on lease backends (also how long a
    /// waiter's place outlives it when it stops asking: a crash on another
    /// host) and how long a call made for it may take.
    pub plan: Plan,
    pub owner: Owner,
    /// Joins the waiting line when no slot is free; `--no-wait` only looks.
    pub queue: bool,
    /// When the wait gives up (`--timeout`); `None` waits forever. A backend
    /// never blocks past it, whatever a neighbour does to the store.
    pub deadline: Option<Moment>,
}

impl Request {
    /// Whether the run holds the name alone or with other sharers.
    pub fn mode(&self) -> Mode {
        self.owner.mode
    }

    /// How many holders the name may have while we hold it: `-p` for an
    /// exclusive run, [`MAX_SHARERS`] for a shared one.
    pub fn capacity(&self) -> u32 {
        capacity(self.mode(), self.parallelism)
    }

    /// Whether the line lets us take a slot now (docs/guide.md: "Shared locks"),
    /// given the modes of the name's holders and of the waiters ahead of us.
    /// An exclusive run needs a free one of its `-p` slots and nobody ahead;
    /// a shared run needs no exclusive holder, no more than [`MAX_SHARERS`]
    /// holders, and only sharers ahead (they go with us). A shared holder
    /// keeps an exclusive run of `-p 1` out, as it fills the one slot.
    pub fn admitted(
        &self,
        holders: impl IntoIterator<Item = Mode>,
        ahead: impl IntoIterator<Item = Mode>,
    ) -> bool {
        admitted(self.mode(), self.parallelism, holders, ahead)
    }
}

/// [`Request::capacity`] of a run of `mode` with `-p parallelism`.
pub fn capacity(mode: Mode, parallelism: u32) -> u32 {
    match mode {
        Mode::Exclusive => parallelism,
        Mode::Shared => MAX_SHARERS,
    }
}

/// [`Request::admitted`] for a run of `mode` with `-p parallelism`: also for
/// a waiter that a store grants a slot to while another run changes the line.
pub fn admitted(
    mode: Mode,
    parallelism: u32,
    holders: impl IntoIterator<Item = Mode>,
    ahead: impl IntoIterator<Item = Mode>,
) -> bool {
    let mut count = 0;
    for holder in holders {
        if mode == Mode::Shared && holder == Mode::Exclusive {
            return false;
        }
        count += 1;
    }
    count < capacity(mode, parallelism)
        && ahead
            .into_iter()
            .all(|waiter| mode == Mode::Shared && waiter == Mode::Shared)
}

/// The most holders a name held in shared mode may have at once; a further
/// sharer waits. Each has a slot number of its own, from 0.
pub const MAX_SHARERS: u32 = 1024;

/// What one look at the line found.
pub enum Attempt {
    /// A slot is ours.
    Taken(Box<dyn Slot>),
    /// Not yet (or, without `queue`, not at all).
    Waiting(Line),
}

/// Where a waiter stands.
#[derive(Clone, Debug, Default)]
pub struct Line {
    /// Our place among the waiters, from 1; 0 when we are not in line (`--no-wait`).
    pub position: u32,
    /// Entries ahead of us (holders and waiters) whose owners run on this host:
    /// when one's process is gone, it can be dropped at once.
    pub local_ahead: Vec<Owner>,
    /// When the line moves by itself at the latest (a lease running out), without anyone telling us.
    pub moves_by: Option<Moment>,
    /// The store's wait ends when the line has moved for us, though nobody
    /// tells it (a process of this host ahead of us ended): no backoff step
    /// needs to bound a lost notice.
    pub watched: bool,
    /// The `-p` of the name's holders or waiters, when it is not ours: then
    /// we neither hold a slot nor stand in line (docs/guide.md: "Slots").
    pub other_parallelism: Option<u32>,
}

impl Line {
    /// The line of a store that let us in neither as a holder nor as a
    /// waiter: the name is held or waited for with `-p parallelism`.
    pub fn refused(parallelism: u32) -> Self {
        Self {
            other_parallelism: Some(parallelism),
            ..Self::default()
        }
    }
}

/// Whether an entry recorded with `-p theirs` keeps a run with `-p ours`
/// out: only a known, different count does.
pub fn refuses(theirs: Option<u32>, ours: u32) -> bool {
    theirs.is_some_and(|theirs| theirs != ours)
}

/// How a wait ended.
pub enum Waited {
    /// The slot is ours (a backend that [`Wakeup::Blocks`]).
    Taken(Box<dyn Slot>),
    /// The line may have moved: look again.
    Moved,
    /// `until` came, and nothing said the line moved.
    Quiet,
}

impl Waited {
    /// `Moved` when the wait was told something (or got what it waited for), else `Quiet`.
    pub fn told(told: bool) -> Self {
        if told { Self::Moved } else { Self::Quiet }
    }
}

/// A slot this lockrun holds. Dropping it without [`Slot::release`] leaves the
/// slot to its lease (or to the kernel, when lockrun exits).
pub trait Slot {
    /// Its number, from 0.
    fn number(&self) -> u32;

    /// The fence of this acquisition (`LOCKRUN_FENCE`).
    fn fence(&self) -> u64;

    /// When the request that took the slot was sent: its lease runs from no earlier than this.
    fn taken_at(&self) -> Moment;

    /// The lease's length as the store granted it, when that is not the
    /// request's TTL (etcd: whole seconds, at least its minimum).
    fn granted_ttl(&self) -> Option<Duration> {
        None
    }

    /// The open files whose kernel locks hold the slot, if the kernel holds
    /// it so (the file backend): lockrun's watchdog keeps them open until the
    /// command's group is gone, so the slot is not free while it may run.
    fn lock_files(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// Extends the lease by its TTL; never re-creates a lapsed one.
    /// Gives up with an error when the answer does not come `within` this long.
    fn renew(&mut self, within: Duration) -> Result<Renewal>;

    /// Gives the slot up. With `keep_until` in the future the slot stays taken
    /// until then (`--min-hold`), though lockrun exits. A moment on the boot
    /// clock, not a wall-clock time: no step of the wall clock shortens it.
    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released>;
}

/// What a release found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The slot was ours to the end.
    Ours,
    /// The lease was gone already (expired or broken): another holder may have had the slot.
    Lost,
}

impl Released {
    /// `Ours` when the store still held our lease, `Lost` when it found none.
    pub fn ours(ours: bool) -> Self {
        if ours { Self::Ours } else { Self::Lost }
    }
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

/// A backend's handle on its store.
pub trait Store {
    fn abilities(&self) -> Abilities;

    /// Where the locks live, for people (`-v`, `status`): a directory, a
    /// database's path or a server, never with its password.
    fn location(&self) -> String;

    /// Looks at the line of `request.name`: takes a slot when the line lets us
    /// (a free slot, and no live waiter ahead of us), else joins the line (once,
    /// and only with `request.queue`) and says where we stand.
    fn attempt(&mut self, request: &Request) -> Result<Attempt>;

    /// Drops the entries of `owners` (holders or waiters of `request.name`)
    /// whose processes are known to be gone, each only if it is still theirs.
    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()>;

    /// Waits until the line may have moved for us, `until` at the latest.
    /// A backend that [`Wakeup::Blocks`] may take the slot here and return it.
    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited>;

    /// Leaves the line: we stop waiting without a slot.
    fn leave(&mut self, request: &Request) -> Result<()>;

    /// The holders, then the waiters in line order, of `name` (or of every
    /// name). Only reads: never takes a lock or writes.
    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>>;

    /// The holders of `name`, for a busy run's message and the waiting line's
    /// display. A store that pays a call per entry overrides it to skip the waiters.
    fn holders(&mut self, name: &Name) -> Result<Vec<Entry>> {
        let mut entries = self.list(Some(name))?;
        entries.retain(Entry::is_holder);
        Ok(entries)
    }

    /// Takes the slots of `name` (one, or all) away from their holders
    /// (`release --force`) and returns what it broke. Only where
    /// [`Abilities::breakable`]: elsewhere nothing can be broken.
    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let _ = (name, slot);
        Ok(Vec::new())
    }

    /// What `lockrun check` found, one line each: that the store answers and
    /// is fit to lock on. Stores with more to check than a read override it.
    fn check(&mut self) -> Result<Vec<String>> {
        self.list(None)?;
        Ok(vec![format!("reachable: {}", self.location())])
    }

    /// Problems with the store's setup worth a warning (shown with `-v`); may ask the server.
    fn warnings(&mut self) -> Vec<String> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Process;
    use Mode::{Exclusive, Shared};

    fn request(mode: Mode, parallelism: u32) -> Request {
        Request {
            name: Name::parse("shelf").unwrap(),
            parallelism,
            plan: Plan::new(Duration::from_secs(30)),
            owner: Owner {
                token: "t".into(),
                process: Process::current_without_liveness(),
                command: "true".into(),
                user: String::new(),
                note: None,
                parallelism: Some(parallelism),
                mode,
            },
            queue: true,
            deadline: None,
        }
    }

    #[test]
    fn an_exclusive_run_needs_a_free_slot_and_nobody_ahead() {
        let one = request(Exclusive, 1);
        assert!(one.admitted([], []));
        assert!(!one.admitted([Exclusive], []));
        assert!(!one.admitted([Shared], []));
        assert!(!one.admitted([], [Shared]));
        let three = request(Exclusive, 3);
        assert!(three.admitted([Exclusive, Exclusive], []));
        assert!(!three.admitted([Exclusive; 3], []));
        assert!(!three.admitted([Exclusive], [Exclusive]));
    }

    #[test]
    fn a_shared_run_goes_beside_sharers_behind_sharers_only() {
        let shared = request(Shared, 1);
        assert!(shared.admitted([], []));
        assert!(shared.admitted([Shared, Shared], [Shared, Shared]));
        assert!(!shared.admitted([Exclusive], []));
        assert!(!shared.admitted([Shared], [Exclusive]));
        assert!(!shared.admitted([Shared], [Shared, Exclusive, Shared]));
        assert!(!shared.admitted([Shared; MAX_SHARERS as usize], []));
    }
}
