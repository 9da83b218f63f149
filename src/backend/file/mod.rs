//! The file backend (docs/backends/file.md: "File backend"): one lock file per slot in a
//! directory, held with flock(2), and a waiting line of files the kernel keeps
//! in order; sharers hold slot 0's file shared (see `share`). Nothing polls:
//! waiters sleep in the kernel (or on inotify, for more than one slot, or for
//! a share slot when every one is taken) and wake when the line moves.

mod admit;
mod dir;
mod fence;
mod format;
mod line;
mod share;
mod slot;
mod wait;

/// The directory's layout, in its `format` file; a newer one is refused.
pub const FORMAT: super::Format = super::Format {
    backend: "file",
    kind: "format",
    writes: format::FORMAT,
    reads_from: 1,
};

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, SystemTime};

use super::record::{HolderRecord, WaiterRecord};
use super::{
    Abilities, Attempt, Common, Entry, Line, Mode, Owner, Request, Slot, Store, Waited, Wakeup,
};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::platform::proc::{self, live_flocks};
use crate::platform::watch::DirWatch;
use dir::LockDir;
use line::PlaceInLine;
use slot::{Probe, SlotFile};
use wait::LockMode;

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    /// File backend's directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]
    #[arg(long, env = "LOCKRUN_DIR", value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        let dir = dir::choose(self.dir.as_deref(), common.create)?;
        format::check(&dir, common.create)?;
        Ok(Box::new(FileStore {
            dir,
            arriving: None,
            place: None,
            ahead: None,
            head: None,
        }))
    }
}

/// How long a contended exclusive `-p 1` run waits in the kernel before it
/// takes its place in line, where `status` shows it (docs/guide.md: "The waiting
/// line"): most contended waits end sooner, with no line's files to write.
const SEEN_AFTER: Duration = Duration::from_millis(100);

struct FileStore {
    dir: LockDir,
    /// When a run waiting in the kernel, not yet in line, takes its place there.
    arriving: Option<Moment>,
    /// Our place in line, once we joined it.
    place: Option<PlaceInLine>,
    /// The waiter in our way (see `line`), whose leaving we wait for.
    ahead: Option<File>,
    /// At the head of a line for more than one slot: every slot's file, kept
    /// open (closing one would wake us), and the directory watched. A sharer
    /// at the head watches it too while every share slot is taken.
    head: Option<Head>,
}

struct Head {
    watch: DirWatch,
    slots: Vec<File>,
}

/// What looking at the slots found, when none was ours.
#[derive(Default)]
struct NoSlot {
    /// The earliest a `--min-hold` lets a slot go.
    kept_until: Option<Moment>,
    /// A free slot was given back: a holder has this other `-p`.
    other_parallelism: Option<u32>,
}

impl NoSlot {
    fn refused(theirs: u32) -> Self {
        Self {
            other_parallelism: Some(theirs),
            ..Self::default()
        }
    }

    fn kept(until: Moment) -> Self {
        Self {
            kept_until: Some(until),
            ..Self::default()
        }
    }
}

impl FileStore {
    /// A newcomer takes a free slot only when nobody waits: it would overtake
    /// them (a sharer, nobody but sharers, whom it joins).
    fn take_as_newcomer(
        &mut self,
        request: &Request,
        stem: &str,
    ) -> Result<Result<Box<dyn Slot>, NoSlot>> {
        let mut kept_until = None;
        for slot in 0..request.parallelism {
            let path = slot::slot_path(self.dir.path(), stem, slot);
            let lock = LockMode::from(request.mode());
            match slot::probe(self.dir.open_lock_file(&path)?, &path, lock)? {
                Probe::Free(file, fence) => {
                    if line::is_occupied(&self.dir, stem, request)? {
                        give_back(&file);
                        return Ok(Err(NoSlot::default()));
                    }
                    return self.take_free(request, stem, slot, file, fence);
                }
                Probe::Held => {}
                Probe::Kept(until) => kept_until = Some(earliest(kept_until, until)),
            }
        }
        Ok(Err(NoSlot {
            kept_until,
            ..NoSlot::default()
        }))
    }

    /// At the head of the line: takes a free slot if there is one.
    fn take_as_head(
        &mut self,
        request: &Request,
        stem: &str,
    ) -> Result<Result<Box<dyn Slot>, NoSlot>> {
        if request.parallelism == 1 {
            let path = slot::slot_path(self.dir.path(), stem, 0);
            let lock = LockMode::from(request.mode());
            return match slot::probe(self.dir.open_lock_file(&path)?, &path, lock)? {
                Probe::Free(file, fence) => self.take_free(request, stem, 0, file, fence),
                Probe::Held => {
                    // Held exclusively: a sharer waits in the kernel for it, not for a share slot.
                    self.head = None;
                    Ok(Err(NoSlot::default()))
                }
                Probe::Kept(until) => Ok(Err(NoSlot::kept(until))),
            };
        }
        if self.head.is_none() {
            // Watched before the first look: a slot freed in between still wakes us.
            let watch = self.watch_dir()?;
            let files = (0..request.parallelism)
                .map(|slot| {
                    self.dir
                        .open_lock_file(&slot::slot_path(self.dir.path(), stem, slot))
                })
                .collect::<Result<_>>()?;
            self.head = Some(Head {
                watch,
                slots: files,
            });
        }
        let head = self.head.as_ref().expect("set above");
        let mut kept_until = None;
        let mut free = None;
        for (slot, open) in head.slots.iter().enumerate() {
            let path = slot::slot_path(self.dir.path(), stem, slot as u32);
            // A second descriptor of the same open file: dropping it closes nothing, so wakes nobody.
            let open = open.try_clone().map_err(|err| unusable(&path, err))?;
            match slot::probe(open, &path, LockMode::Exclusive)? {
                Probe::Free(locked, fence) => {
                    free = Some((slot as u32, locked, fence));
                    break;
                }
                Probe::Held => {}
                Probe::Kept(until) => kept_until = Some(earliest(kept_until, until)),
            }
        }
        match free {
            Some((slot, locked, fence)) => {
                self.take(request, stem, SlotFile::Lock(slot), locked, fence, None)
            }
            None => Ok(Err(NoSlot {
                kept_until,
                ..NoSlot::default()
            })),
        }
    }

    /// Takes the free slot whose file's lock we got: for a sharer, slot 0's
    /// file locked shared lets it take a share slot.
    fn take_free(
        &mut self,
        request: &Request,
        stem: &str,
        slot: u32,
        file: File,
        fence: u64,
    ) -> Result<Result<Box<dyn Slot>, NoSlot>> {
        match request.mode() {
            Mode::Exclusive => self.take(request, stem, SlotFile::Lock(slot), file, fence, None),
            Mode::Shared => self.take_share(request, stem, file),
        }
    }

    /// A sharer holding `gate` (slot 0's file, locked shared) takes the lowest
    /// free share slot. When every one is taken, a sharer in line watches the
    /// directory for one to be let go, from before its next look on.
    fn take_share(
        &mut self,
        request: &Request,
        stem: &str,
        gate: File,
    ) -> Result<Result<Box<dyn Slot>, NoSlot>> {
        loop {
            match share::take_lowest_free(&self.dir, stem, self.head.is_some())? {
                Ok((slot, file, fence)) => {
                    return self.take(
                        request,
                        stem,
                        SlotFile::Share(slot),
                        file,
                        fence,
                        Some(gate),
                    );
                }
                Err(kept_until) if self.place.is_none() || self.head.is_some() => {
                    let _ = gate.unlock();
                    return Ok(Err(NoSlot {
                        kept_until,
                        ..NoSlot::default()
                    }));
                }
                Err(_) => {
                    self.head = Some(Head {
                        watch: self.watch_dir()?,
                        slots: Vec::new(),
                    });
                }
            }
        }
    }

    /// Takes the slot whose lock `file` holds (with `gate`, for a sharer),
    /// unless it is given back: see `slot::take`.
    fn take(
        &mut self,
        request: &Request,
        stem: &str,
        slot: SlotFile,
        file: File,
        fence: u64,
        gate: Option<File>,
    ) -> Result<Result<Box<dyn Slot>, NoSlot>> {
        let mut taken = match slot::take(&self.dir, stem, slot, file, fence, gate, request)? {
            Ok(taken) => taken,
            Err(no_slot) => return Ok(Err(no_slot)),
        };
        // The directory's watch is closed only once the slot is released:
        // closing an inotify instance waits for the kernel's grace period
        // (from 0.1 ms to over 10 ms), which would hold up the command.
        taken.keep(self.leave_line());
        Ok(Ok(Box::new(taken)))
    }

    /// Whether a contended exclusive `-p 1` run, which found slot 0 held and
    /// nobody in line, waits in the kernel for it first, as flock(1) does, until
    /// [`SEEN_AFTER`] has passed: like a newcomer, it takes the slot only if
    /// nobody stands in line then. Joining the line costs a look at every
    /// holder's and waiter's `-p` under the fence counter's lock, files made
    /// and removed: the waits that end sooner skip it.
    fn arrives_unseen(&mut self, request: &Request, stem: &str, no_slot: &NoSlot) -> Result<bool> {
        if request.parallelism != 1
            || request.mode() != Mode::Exclusive
            || no_slot.kept_until.is_some()
        {
            return Ok(false);
        }
        let seen_at = *self
            .arriving
            .get_or_insert_with(|| Moment::now() + SEEN_AFTER);
        // With waiters in line, the slot is theirs first: nothing is gained by waiting unseen.
        Ok(!seen_at.has_passed() && !line::is_occupied(&self.dir, stem, request)?)
    }

    /// A watch on the lock directory for slot files let go.
    fn watch_dir(&self) -> Result<DirWatch> {
        DirWatch::closed_or_touched_in(self.dir.path()).map_err(|err| {
            Error::unavailable(format!("cannot watch {}", self.dir.path().display()), err)
        })
    }

    /// Leaves the line, the one behind us woken first; returns the directory's
    /// watch if we watched it at the head of the line.
    fn leave_line(&mut self) -> Option<DirWatch> {
        self.arriving = None;
        if let Some(place) = self.place.take() {
            place.leave();
        }
        self.ahead = None;
        self.head.take().map(|head| head.watch)
    }
}

impl Store for FileStore {
    fn location(&self) -> String {
        format!("directory {}", self.dir.path().display())
    }

    fn abilities(&self) -> Abilities {
        Abilities {
            leases: false,
            breakable: false,
            wakeup: Wakeup::Blocks,
        }
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let stem = request.name.stem();
        if self.place.is_none() {
            let no_slot = match self.take_as_newcomer(request, &stem)? {
                Ok(slot) => return Ok(Attempt::Taken(slot)),
                Err(no_slot) => no_slot,
            };
            if let Some(theirs) = no_slot.other_parallelism {
                return Ok(Attempt::Waiting(Line::refused(theirs)));
            }
            if !request.queue {
                // Busy, unless busy with another -p: that is a mistake to say.
                let other =
                    admit::other_parallelism(&self.dir, &stem, None, request.parallelism, true)?;
                return Ok(Attempt::Waiting(match other {
                    Some(theirs) => Line::refused(theirs),
                    None => Line {
                        moves_by: no_slot.kept_until,
                        ..Line::default()
                    },
                }));
            }
            if self.arrives_unseen(request, &stem, &no_slot)? {
                return Ok(Attempt::Waiting(Line {
                    position: 1,
                    ..Line::default()
                }));
            }
            // Let into the line under the counter's lock, as into a slot.
            let counter = fence::Counter::lock(&self.dir, &stem, request.deadline)?;
            if let Some(theirs) =
                admit::other_parallelism(&self.dir, &stem, None, request.parallelism, true)?
            {
                return Ok(Attempt::Waiting(Line::refused(theirs)));
            }
            let record = WaiterRecord {
                name: request.name.to_string(),
                owner: request.owner.clone(),
                since: epoch_millis(SystemTime::now()),
            };
            self.place = Some(PlaceInLine::join(
                &self.dir,
                &stem,
                &record,
                request.deadline,
            )?);
            drop(counter);
        }
        let ahead = self
            .place
            .as_ref()
            .expect("joined above")
            .ahead(self.dir.path(), &stem)?;
        // Our own lock on a file ahead would make that waiter look alive.
        self.ahead = None;
        let (nearest, dead) = line::nearest_in_the_way(&ahead, request)?;
        self.ahead = nearest;
        let mut moves_by = None;
        if self.ahead.is_none() {
            match self.take_as_head(request, &stem)? {
                Ok(slot) => return Ok(Attempt::Taken(slot)),
                Err(NoSlot {
                    other_parallelism: Some(theirs),
                    ..
                }) => return Ok(Attempt::Waiting(Line::refused(theirs))),
                Err(no_slot) => moves_by = no_slot.kept_until,
            }
        }
        Ok(Attempt::Waiting(Line {
            position: (ahead.len() - dead + 1) as u32,
            local_ahead: Vec::new(),
            moves_by,
            watched: false,
            other_parallelism: None,
        }))
    }

    fn evict(&mut self, _request: &Request, _owners: &[Owner]) -> Result<()> {
        // The kernel frees a dead process's locks by itself: nothing is ever left to evict.
        Ok(())
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        let stem = request.name.stem();
        if let Some(ahead) = self.ahead.take() {
            // Woken when the waiter in our way takes a slot, gives up or dies.
            let left = wait::lock_until(&ahead, LockMode::Shared, until, self.dir.path())?;
            return Ok(Waited::told(left));
        }
        if let Some(head) = &self.head {
            // A sharer waits for a share file; our own looks at slot 0's file wake nobody then.
            let lock_file = |name: &std::ffi::OsString| {
                name.to_str()
                    .and_then(SlotFile::parse)
                    .is_some_and(|(s, slot)| s == stem && slot.mode() == request.mode())
            };
            while !until.has_passed() {
                let changed = head.watch.changes(until.remaining()).map_err(|err| {
                    Error::unavailable(format!("cannot watch {}", self.dir.path().display()), err)
                })?;
                if changed.iter().any(lock_file) {
                    return Ok(Waited::Moved);
                }
            }
            return Ok(Waited::Quiet);
        }
        // The head of a one-slot line waits in the kernel for the slot itself,
        // as flock(1) does; the sharers at the head for a shared lock on it, as
        // flock -s does, so that the release that lets them in wakes them all.
        // A run not yet in line waits so only until it is to take its place there.
        let until = match self.arriving {
            Some(seen_at) if self.place.is_none() => until.min(seen_at),
            _ => until,
        };
        let path = slot::slot_path(self.dir.path(), &stem, 0);
        let file = self.dir.open_lock_file(&path)?;
        if !wait::lock_until(&file, request.mode().into(), until, &path)? {
            return Ok(Waited::Quiet);
        }
        let taken = match slot::free_or_kept(file) {
            // Not in line, it is a newcomer: the waiters in line go first.
            Probe::Free(file, _)
                if self.place.is_none() && line::is_occupied(&self.dir, &stem, request)? =>
            {
                give_back(&file);
                Err(NoSlot::default())
            }
            Probe::Free(file, fence) => self.take_free(request, &stem, 0, file, fence)?,
            Probe::Kept(kept_until) => Err(NoSlot::kept(kept_until)),
            Probe::Held => unreachable!("the lock was just got"),
        };
        match taken {
            Ok(slot) => Ok(Waited::Taken(slot)),
            Err(NoSlot {
                kept_until: Some(kept_until),
                ..
            }) => {
                thread::sleep(kept_until.min(until).remaining());
                Ok(Waited::Moved)
            }
            // The next look says why.
            Err(_) => Ok(Waited::Moved),
        }
    }

    fn leave(&mut self, _request: &Request) -> Result<()> {
        drop(self.leave_line());
        Ok(())
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let entries = fs::read_dir(self.dir.path()).map_err(|err| {
            Error::unavailable(
                format!("cannot read lock directory {}", self.dir.path().display()),
                err,
            )
        })?;
        let wanted = name.map(Name::stem);
        let locked = live_flocks();
        let mut holders = Vec::new();
        let mut waiters: Vec<(String, String, Entry)> = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            let path = entry.path();
            if let Some((stem, slot)) = SlotFile::parse(file_name) {
                if wanted.as_deref().is_some_and(|wanted| wanted != stem) {
                    continue;
                }
                let Ok(Some(file)) = dir::open_existing(&path) else {
                    continue;
                };
                let lock_pid = file
                    .metadata()
                    .ok()
                    .and_then(|meta| locked.iter().find(|l| l.is_on(&meta)).map(|l| l.pid));
                let record = slot::read_record(&file);
                if let Some(entry) = holder_entry(stem, slot, record, lock_pid) {
                    holders.push(entry);
                }
            } else if let Some((stem, ticket)) = line::parse_waiter_file_name(file_name) {
                if wanted.as_deref().is_some_and(|wanted| wanted != stem) {
                    continue;
                }
                let Ok(Some(file)) = dir::open_existing(&path) else {
                    continue;
                };
                let live = file
                    .metadata()
                    .is_ok_and(|meta| locked.iter().any(|l| l.is_on(&meta)));
                let record: Option<WaiterRecord> = slot::first_json_value(&file);
                if let (true, Some(record)) = (live, record) {
                    let entry = Entry::waiter(&record.name, 0, &record.owner, Some(record.since));
                    waiters.push((stem.to_owned(), ticket.to_owned(), entry));
                }
            }
        }
        waiters.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let mut position = 0;
        let mut previous_stem = String::new();
        for (stem, _, mut entry) in waiters {
            position = if stem == previous_stem {
                position + 1
            } else {
                1
            };
            previous_stem = stem;
            entry.position = position;
            holders.push(entry);
        }
        super::record::sort(&mut holders);
        Ok(holders)
    }
}

/// What `status` and a busy run say of a lock held by another program than
/// lockrun (docs/backends/file.md: "File backend", a lock held by another program).
const NOT_LOCKRUN: &str = "not lockrun: flock(1)?";

/// A slot file's holder as `status` shows it: the one whose lock is live, or
/// the one whose `--min-hold` still keeps the slot. A record whose writer is
/// not the lock's holder, which runs another program (`flock FILE`), is an
/// earlier lockrun's: the holder is then named by its pid alone.
fn holder_entry(
    stem: &str,
    slot: SlotFile,
    record: Option<HolderRecord>,
    lock_pid: Option<u32>,
) -> Option<Entry> {
    // A lockrun in another pid namespace has a pid of its own in its record: its program tells.
    let foreign = lock_pid.is_some_and(|pid| proc::runs_this_program(pid) == Some(false));
    match (record, lock_pid) {
        (Some(record), Some(pid)) if record.owner.process.pid == pid || !foreign => {
            Some(record.entry(slot.number()))
        }
        (Some(record), None) if record.kept_end().is_some() => Some(record.entry(slot.number())),
        // Locked, but not (yet) by a holder that wrote its record, or by another program.
        (_, Some(pid)) => Some(Entry {
            name: stem.to_owned(),
            slot: Some(slot.number()),
            position: 0,
            pid,
            host: String::new(),
            command: if foreign {
                NOT_LOCKRUN.into()
            } else {
                String::new()
            },
            since: None,
            expires_at: None,
            fence: None,
            mode: slot.mode(),
            user: String::new(),
            note: None,
        }),
        _ => None,
    }
}

/// Lets go of a free slot's lock that a run got but must leave (to the line,
/// or for another `-p`, or a slot kept by `--min-hold`).
fn give_back(file: &File) {
    let _ = file.unlock();
    // The head of the line may be watching this very file.
    let _ = file.set_modified(SystemTime::now());
}

fn earliest(current: Option<Moment>, other: Moment) -> Moment {
    current.map_or(other, |current| current.min(other))
}

fn unusable(path: &Path, err: io::Error) -> Error {
    Error::unavailable(format!("cannot lock {}", path.display()), err)
}
