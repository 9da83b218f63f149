//! One look at a name's keys: the line in create order, the slots taken, and
//! where the owner of a lease stands. The oldest places that the rule of
//! shared and exclusive runs lets in (docs/guide.md: "Shared locks") are the group:
//! with `-p N` and exclusive runs the N oldest, else the oldest exclusive run
//! alone or the sharers up to the first exclusive run. Each takes a free slot
//! key when it gets there.

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::keys::{KeyKind, NameKeys};
use super::link::{KeyValue, Listing};
use crate::backend::record::{HolderRecord, WaiterRecord};
use crate::backend::{Entry, Line, MAX_SHARERS, Mode, Owner, Request, refuses};
use crate::identity::Process;

/// What a place's key holds: a holder's record with its slot, or a waiter's.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Record {
    Holding(Holding),
    Waiting(WaiterRecord),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Holding {
    pub slot: u32,
    #[serde(flatten)]
    pub holder: HolderRecord,
}

/// A place in line: a waiter's, or a holder's.
#[derive(Clone, Debug)]
pub struct Place {
    pub key: Vec<u8>,
    pub lease: i64,
    /// Its create revision: the line's order, and a holder's fence.
    pub revision: i64,
    /// The value as stored, read as a [`Record`] only when asked: a waiter's
    /// look at a long line needs the records of the few places at its head.
    value: Vec<u8>,
    record: OnceCell<Option<Record>>,
}

impl Place {
    fn new(kv: KeyValue) -> Self {
        Self {
            key: kv.key,
            lease: kv.lease,
            revision: kv.create_revision,
            value: kv.value,
            record: OnceCell::new(),
        }
    }

    /// Its record; `None` when the value is not a record of ours.
    pub fn record(&self) -> Option<&Record> {
        self.record
            .get_or_init(|| serde_json::from_slice(&self.value).ok())
            .as_ref()
    }

    /// Whether its record says it holds a slot.
    pub fn holds(&self) -> bool {
        matches!(self.record(), Some(Record::Holding(_)))
    }

    pub fn owner(&self) -> Option<&Owner> {
        match self.record()? {
            Record::Holding(holding) => Some(&holding.holder.owner),
            Record::Waiting(waiter) => Some(&waiter.owner),
        }
    }

    /// Kept taken by `--min-hold` after its holder left: no process to watch.
    pub fn kept(&self) -> bool {
        matches!(self.record(), Some(Record::Holding(h)) if h.holder.kept_until.is_some())
    }

    /// How it holds or waits for the name; a value that is not a record of
    /// ours reads as exclusive, as the records of older lockruns do.
    pub fn mode(&self) -> Mode {
        self.owner().map_or(Mode::Exclusive, |owner| owner.mode)
    }
}

/// Where the owner of a lease stands in a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stand {
    /// It holds this slot.
    Holding(u32),
    /// Its place is in the group and this slot is free: it may take it.
    MayTake(u32),
    /// It waits at this index of the line (in the group when no slot key is free for it).
    Waiting(usize),
    /// It has no place.
    Absent,
}

/// What keeps a waiter out, and so what it watches (docs/backends/etcd.md: "etcd backend").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// It is in the group, or behind as many sharers as may hold, and no
    /// slot key is free for it: any change may free one.
    NoFreeSlot,
    /// It is the head of the line, an exclusive run: it holds once `to_go`
    /// of the `ahead` places before it have gone (fewer than its `-p` are left).
    Oldest { ahead: usize, to_go: usize },
    /// The place at index `at`: an exclusive run watches the place just
    /// ahead, a sharer the nearest exclusive run ahead of it. Once it is
    /// gone, the waiter holds if it `frees` it (it holds, and is the last
    /// exclusive run ahead of a sharer, with room for the sharers ahead and
    /// it), else looks again; with `puts`, it looks again too when that
    /// place changes (it took a slot).
    Place { at: usize, frees: bool, puts: bool },
}

pub struct LineView {
    /// The store's revision at the look.
    pub revision: i64,
    /// The line, oldest first.
    pub places: Vec<Place>,
    /// The slots taken, and the leases they are attached to.
    slots: BTreeMap<u32, i64>,
}

impl LineView {
    /// The look that `listing` of a name's keys (every key, oldest first) gives.
    pub fn new(keys: &NameKeys, listing: Listing) -> Self {
        let mut places = Vec::new();
        let mut slots = BTreeMap::new();
        for kv in listing.kvs {
            match keys.kind(&kv.key) {
                Some(KeyKind::Place) => places.push(Place::new(kv)),
                Some(KeyKind::Slot(slot)) => {
                    slots.insert(slot, kv.lease);
                }
                None => {}
            }
        }
        Self {
            revision: listing.revision,
            places,
            slots,
        }
    }

    pub fn stand(&self, lease: i64, request: &Request) -> Stand {
        if let Some(slot) = self.slot_of(lease) {
            return Stand::Holding(slot);
        }
        let Some(index) = self.places.iter().position(|place| place.lease == lease) else {
            return Stand::Absent;
        };
        // A sharer ahead that shows no slot may hold one already, let in by
        // a release (its record comes with its first renewal): which one is
        // not in the look, so a place behind it takes once it shows.
        let unshown = self
            .unslotted_ahead(index, None)
            .any(|place| place.mode() == Mode::Shared);
        match self.slot_for(index, request.capacity(), None) {
            Some(slot) if index < self.group(request) && !unshown => Stand::MayTake(slot),
            _ => Stand::Waiting(index),
        }
    }

    /// How many of the oldest places hold or may hold: the group. Each place
    /// in turn is let in by [`Request::admitted`] as a run like `request` in
    /// its mode would be, the places let in before it being the holders. A
    /// place behind one that must wait waits too, so the group is a prefix.
    pub fn group(&self, request: &Request) -> usize {
        let runs = [Mode::Exclusive, Mode::Shared].map(|mode| {
            let mut run = request.clone();
            run.owner.mode = mode;
            run
        });
        let run = |mode| &runs[usize::from(mode == Mode::Shared)];
        (0..self.places.len())
            .find(|&at| !self.lets_in(run(self.places[at].mode()), at, at))
            .unwrap_or(self.places.len())
    }

    /// Whether a run like `request` that joined the line now would be in
    /// the group at once (`--no-wait` joins only then).
    pub fn lets_in_newcomer(&self, request: &Request) -> bool {
        self.lets_in(request, self.group(request), self.places.len())
    }

    /// Whether [`Request::admitted`] lets a run like `request` in behind
    /// the first `behind` places, of which the first `group` hold.
    fn lets_in(&self, request: &Request, group: usize, behind: usize) -> bool {
        request.admitted(
            self.places[..group].iter().map(Place::mode),
            self.places[group..behind].iter().map(Place::mode),
        )
    }

    /// Another `-p` than `ours` that a place ahead of the owner of `lease`
    /// (every place, when it has none) was let in with. Places behind came
    /// later and looked at ours; a place let in with another `-p` saw none
    /// ahead of it, so the places ahead agree with each other.
    pub fn other_parallelism(&self, lease: i64, ours: u32) -> Option<u32> {
        self.places
            .iter()
            .take_while(|place| place.lease != lease)
            .map(|place| place.owner().and_then(|owner| owner.parallelism))
            .find(|&theirs| refuses(theirs, ours))
            .flatten()
    }

    /// The slot below `capacity` that the place at `index` takes (once the
    /// place at `gone` has gone, if given): of the free ones, the one at its
    /// rank among the places ahead of it that hold none yet, so that places
    /// let in together take one each, the lowest; else the lowest free one.
    pub fn slot_for(&self, index: usize, capacity: u32, gone: Option<usize>) -> Option<u32> {
        let rank = self.unslotted_ahead(index, gone).count();
        let mut free = self.free_slots(capacity, gone);
        free.clone().nth(rank).or_else(|| free.next())
    }

    /// The places ahead of the one at `index` that hold no slot key (but the one at `gone`).
    pub fn unslotted_ahead(
        &self,
        index: usize,
        gone: Option<usize>,
    ) -> impl Iterator<Item = &Place> {
        let gone = gone.map(|at| self.places[at].lease);
        let holding: HashSet<i64> = self.slots.values().copied().collect();
        self.places[..index]
            .iter()
            .filter(move |place| Some(place.lease) != gone && !holding.contains(&place.lease))
    }

    /// The slots below `capacity` that no slot key holds (but that of the place at `gone`), lowest first.
    pub fn free_slots(
        &self,
        capacity: u32,
        gone: Option<usize>,
    ) -> impl Iterator<Item = u32> + Clone {
        let gone = gone.map(|at| self.places[at].lease);
        (0..capacity)
            .filter(move |slot| self.slots.get(slot).is_none_or(|&held| Some(held) == gone))
    }

    /// The slot of the place at `index`, if it holds one.
    pub fn slot_at(&self, index: usize) -> Option<u32> {
        self.slot_of(self.places.get(index)?.lease)
    }

    fn slot_of(&self, lease: i64) -> Option<u32> {
        self.slots
            .iter()
            .find_map(|(&slot, &held)| (held == lease).then_some(slot))
    }

    /// The holders as `status` lists them (those kept by `--min-hold`, and
    /// those whose processes are not known to be gone), each with its lease;
    /// a holder's fence is its place's create revision.
    pub fn holders(&self) -> impl Iterator<Item = (Entry, i64)> + '_ {
        self.places.iter().filter_map(|place| match place.record() {
            Some(Record::Holding(holding))
                if place.kept() || !holding.holder.owner.process.is_gone() =>
            {
                let entry = holding.holder.entry(holding.slot);
                Some((entry.fenced(place.revision as u64), place.lease))
            }
            _ => None,
        })
    }

    /// The waiters' records in line order, each with its lease.
    pub fn waiters(&self) -> impl Iterator<Item = (&WaiterRecord, i64)> {
        self.places.iter().filter_map(|place| match place.record() {
            Some(Record::Waiting(waiter)) => Some((waiter, place.lease)),
            _ => None,
        })
    }

    /// What keeps the waiter at `index` out, and where it stands for the
    /// waiting loop: its place behind the group, and the entries on this
    /// host among those it watches that are at the head of the line (the
    /// group, the first waiter and the sharers right behind a sharer there),
    /// whose death it can see at once; with none of those on this host, the
    /// nearest place of this host ahead of it.
    pub fn waiting(&self, me: &Process, index: usize, request: &Request) -> (Blocker, Line) {
        let group = self.group(request);
        let blocker = self.blocker(index, group, request);
        let head = group + self.waiters_at_head(group);
        let watched = match blocker {
            Blocker::NoFreeSlot => 0..index.min(group),
            Blocker::Oldest { ahead, .. } => 0..ahead,
            Blocker::Place { at, .. } if at < head => at..at + 1,
            Blocker::Place { .. } => 0..0,
        };
        let mut local_ahead = self.local(me, watched, None);
        if local_ahead.is_empty() {
            local_ahead = self.nearest_local(me, index);
        }
        let line = Line {
            position: (index + 1).saturating_sub(group).max(1) as u32,
            local_ahead,
            // A lease that runs out deletes its keys, and the watch sees it.
            moves_by: None,
            watched: false,
            other_parallelism: None,
        };
        (blocker, line)
    }

    /// Where a caller stands who is not in line (`--no-wait`): behind every
    /// place, kept out by the group's holders.
    pub fn outside(&self, request: &Request) -> Line {
        Line {
            position: 0,
            local_ahead: self.local(
                &request.owner.process,
                0..self.group(request),
                Some(&request.owner.token),
            ),
            moves_by: None,
            watched: false,
            other_parallelism: None,
        }
    }

    fn blocker(&self, index: usize, group: usize, request: &Request) -> Blocker {
        if index < group {
            return Blocker::NoFreeSlot;
        }
        match request.mode() {
            Mode::Exclusive if index == group => Blocker::Oldest {
                ahead: index,
                to_go: (index + 1)
                    .saturating_sub(request.parallelism as usize)
                    .max(1),
            },
            Mode::Exclusive => Blocker::Place {
                at: index - 1,
                frees: false,
                puts: true,
            },
            Mode::Shared => {
                let mut exclusive = (0..index)
                    .rev()
                    .filter(|&at| self.places[at].mode() == Mode::Exclusive);
                match exclusive.next() {
                    Some(at) => Blocker::Place {
                        at,
                        // Once it goes, the `index - 1` places ahead are all
                        // sharers: we go with them if there is room. Only a
                        // holder's going: the sharers let in by it then
                        // count their slots from the same places (a waiter's
                        // going may come after others changed the line).
                        frees: exclusive.next().is_none()
                            && index <= MAX_SHARERS as usize
                            && at < group,
                        // A holder's record changes nothing for us.
                        puts: at >= group,
                    },
                    None => Blocker::NoFreeSlot,
                }
            }
        }
    }

    /// How many waiters right behind the group are at the head of the line:
    /// the first, and the sharers behind a sharer there, who go with it.
    fn waiters_at_head(&self, group: usize) -> usize {
        let behind = &self.places[group.min(self.places.len())..];
        match behind.first() {
            Some(first) if first.mode() == Mode::Shared => behind
                .iter()
                .take_while(|place| place.mode() == Mode::Shared)
                .count(),
            Some(_) => 1,
            None => 0,
        }
    }

    /// The owner of the place nearest ahead of `index` that runs on `me`'s
    /// host (not kept by `--min-hold`), if any. As each waiter watches the
    /// nearest one of its host, dead places of a host are seen however many
    /// died together (docs/guide.md: "The waiting line").
    fn nearest_local(&self, me: &Process, index: usize) -> Vec<Owner> {
        self.places[..index]
            .iter()
            .rev()
            .filter(|place| !place.kept())
            .filter_map(Place::owner)
            .find(|owner| owner.process.shares_host_with(me))
            .into_iter()
            .cloned()
            .collect()
    }

    /// The owners of the places in `range` that run on `me`'s host (not
    /// kept by `--min-hold`, not the one with `token`).
    fn local(&self, me: &Process, range: Range<usize>, token: Option<&String>) -> Vec<Owner> {
        self.places[range]
            .iter()
            .filter(|place| !place.kept())
            .filter_map(Place::owner)
            .filter(|owner| owner.process.shares_host_with(me) && Some(&owner.token) != token)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::name::Name;
    use crate::timing::Plan;

    /// A place in a test's line: its mode, and the slot it holds, if any.
    pub(crate) type Entry = (Mode, Option<u32>);

    pub(crate) const S: Entry = (Mode::Shared, None);
    pub(crate) const X: Entry = (Mode::Exclusive, None);
    const MAX: u32 = crate::backend::MAX_SHARERS;

    pub(crate) fn holding(mode: Mode, slot: u32) -> Entry {
        (mode, Some(slot))
    }

    fn name() -> Name {
        Name::parse("shelf").unwrap()
    }

    fn owner(mode: Mode, token: &str) -> Owner {
        Owner {
            token: token.to_owned(),
            process: Process {
                pid: 1,
                start_time: 0,
                boot_id: String::new(),
                host: "elsewhere".to_owned(),
            },
            command: "true".to_owned(),
            user: String::new(),
            note: None,
            parallelism: Some(1),
            mode,
        }
    }

    pub(crate) fn request(mode: Mode, parallelism: u32) -> Request {
        Request {
            name: name(),
            parallelism,
            plan: Plan::new(Duration::from_secs(30)),
            owner: owner(mode, "me"),
            queue: true,
            deadline: None,
        }
    }

    /// A look at a line of `entries`, oldest first: place `i` is on lease `i + 1`.
    pub(crate) fn view(entries: &[Entry]) -> LineView {
        let keys = NameKeys::new("t", &name());
        let mut kvs = Vec::new();
        for (lease, &(mode, slot)) in (1..).zip(entries) {
            let owner = owner(mode, &format!("t{lease}"));
            let record = match slot {
                Some(slot) => Record::Holding(Holding {
                    slot,
                    holder: HolderRecord {
                        name: "shelf".to_owned(),
                        owner,
                        acquired_at: 0,
                        fence: 0,
                        kept_until: None,
                        kept_on: None,
                    },
                }),
                None => Record::Waiting(WaiterRecord {
                    name: "shelf".to_owned(),
                    owner,
                    since: 0,
                }),
            };
            kvs.push(KeyValue {
                key: keys.place(lease),
                value: serde_json::to_vec(&record).unwrap(),
                create_revision: lease,
                mod_revision: lease,
                lease,
            });
            if let Some(slot) = slot {
                kvs.push(KeyValue {
                    key: keys.slot(slot),
                    value: Vec::new(),
                    create_revision: lease,
                    mod_revision: lease,
                    lease,
                });
            }
        }
        LineView::new(&keys, Listing { kvs, revision: 99 })
    }

    fn blocker(look: &LineView, index: usize, request: &Request) -> Blocker {
        look.waiting(&request.owner.process, index, request).0
    }

    #[test]
    fn sharers_up_to_the_first_exclusive_run_go_together_one_slot_each() {
        let look = view(&[holding(Mode::Shared, 0), S, S, X, S]);
        let shared = request(Mode::Shared, 1);
        assert_eq!(look.group(&shared), 3);
        assert_eq!(look.stand(2, &shared), Stand::MayTake(1));
        assert_eq!(
            look.stand(3, &shared),
            Stand::Waiting(2),
            "the sharer ahead may hold a slot that it does not show yet"
        );
        assert_eq!(blocker(&look, 2, &shared), Blocker::NoFreeSlot);
        let shown = view(&[holding(Mode::Shared, 0), holding(Mode::Shared, 2), S]);
        assert_eq!(
            shown.stand(3, &shared),
            Stand::MayTake(1),
            "the lowest free"
        );
        assert_eq!(look.stand(5, &shared), Stand::Waiting(4));
        assert_eq!(
            blocker(&look, 4, &shared),
            Blocker::Place {
                at: 3,
                frees: false,
                puts: true
            },
            "a sharer behind a waiting writer watches it, and the writer's record"
        );
        assert!(!look.lets_in_newcomer(&shared), "the writer is ahead");
    }

    #[test]
    fn an_exclusive_run_at_the_head_waits_for_every_sharer_ahead_of_it() {
        let look = view(&[holding(Mode::Shared, 0), holding(Mode::Shared, 1), S, X]);
        let exclusive = request(Mode::Exclusive, 1);
        assert_eq!(look.group(&exclusive), 3);
        assert_eq!(look.stand(4, &exclusive), Stand::Waiting(3));
        assert_eq!(
            blocker(&look, 3, &exclusive),
            Blocker::Oldest { ahead: 3, to_go: 3 }
        );
        assert!(!look.lets_in_newcomer(&exclusive));
        assert!(!look.lets_in_newcomer(&request(Mode::Shared, 1)));
        let sharers = view(&[holding(Mode::Shared, 0), S]);
        assert!(sharers.lets_in_newcomer(&request(Mode::Shared, 1)));
        assert!(!sharers.lets_in_newcomer(&exclusive));
    }

    #[test]
    fn the_sharers_behind_a_writer_all_watch_it_and_take_a_slot_each_when_it_goes() {
        let look = view(&[holding(Mode::Exclusive, 0), S, S, S, X, S]);
        let shared = request(Mode::Shared, 1);
        assert_eq!(look.group(&shared), 1);
        for index in 1..4 {
            let (blocker, line) = look.waiting(&shared.owner.process, index, &shared);
            assert_eq!(
                blocker,
                Blocker::Place {
                    at: 0,
                    frees: true,
                    puts: false
                }
            );
            assert_eq!(line.position, index as u32);
            assert_eq!(
                look.slot_for(index, MAX, Some(0)),
                Some(index as u32 - 1),
                "the writer's slot is free once it goes"
            );
        }
        assert_eq!(
            blocker(&look, 5, &shared),
            Blocker::Place {
                at: 4,
                frees: false,
                puts: true
            },
            "the writer ahead is not the only one"
        );
        assert_eq!(
            blocker(&look, 4, &request(Mode::Exclusive, 1)),
            Blocker::Place {
                at: 3,
                frees: false,
                puts: true
            }
        );
    }

    #[test]
    fn exclusive_runs_with_more_slots_are_the_oldest_as_before() {
        let look = view(&[holding(Mode::Exclusive, 0), X, X, X]);
        let three = request(Mode::Exclusive, 3);
        assert_eq!(look.group(&three), 3);
        assert_eq!(look.stand(2, &three), Stand::MayTake(1));
        assert_eq!(look.stand(3, &three), Stand::MayTake(2));
        assert_eq!(
            blocker(&look, 3, &three),
            Blocker::Oldest { ahead: 3, to_go: 1 }
        );
    }
}
