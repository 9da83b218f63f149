//! One look at a name's keys: the line in create order, the slots taken, and
//! where the owner of a lease stands. With `-p N` the N oldest places hold
//! slots; each takes the lowest free slot key when it gets there.

use std::cell::OnceCell;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::keys::{KeyKind, NameKeys};
use super::link::{KeyValue, Listing};
use crate::backend::record::{HolderRecord, WaiterRecord, local_ahead};
use crate::backend::{Entry, Line, Owner, Request, refuses};
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
}

/// Where the owner of a lease stands in a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stand {
    /// It holds this slot.
    Holding(u32),
    /// Its place is among the N oldest and this slot is free: it may take it.
    MayTake(u32),
    /// It waits at this index of the line (N or more; below N when no slot key is free).
    Waiting(usize),
    /// It has no place.
    Absent,
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

    pub fn stand(&self, lease: i64, parallelism: u32) -> Stand {
        if let Some((&slot, _)) = self.slots.iter().find(|&(_, &held)| held == lease) {
            return Stand::Holding(slot);
        }
        let Some(index) = self.places.iter().position(|place| place.lease == lease) else {
            return Stand::Absent;
        };
        match self.free_slot(parallelism) {
            Some(slot) if index < parallelism as usize => Stand::MayTake(slot),
            _ => Stand::Waiting(index),
        }
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

    /// The lowest slot without a holder.
    pub fn free_slot(&self, parallelism: u32) -> Option<u32> {
        (0..parallelism).find(|slot| !self.slots.contains_key(slot))
    }

    /// The slot of the place at `index`, if it holds one.
    pub fn slot_at(&self, index: usize) -> Option<u32> {
        let lease = self.places.get(index)?.lease;
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

    /// Where a waiter at `index` stands, for the waiting loop.
    pub fn line(&self, me: &Process, index: usize, parallelism: u32) -> Line {
        self.stand_at(me, index, parallelism, None)
    }

    /// Where a caller stands who is not in line (`--no-wait`): behind every place.
    pub fn outside(&self, request: &Request, parallelism: u32) -> Line {
        let me = &request.owner.process;
        let behind = self
            .places
            .iter()
            .filter(|place| {
                place
                    .owner()
                    .is_none_or(|owner| owner.token != request.owner.token)
            })
            .count();
        self.stand_at(me, behind, parallelism, Some(0))
    }

    fn stand_at(
        &self,
        me: &Process,
        index: usize,
        parallelism: u32,
        position: Option<u32>,
    ) -> Line {
        let holders = index.min(parallelism as usize);
        let position = position.unwrap_or((index + 1).saturating_sub(holders) as u32);
        let holding = self.places[..holders]
            .iter()
            .filter(|place| !place.kept())
            .filter_map(Place::owner);
        let just_ahead = self.places[holders..index].last().and_then(Place::owner);
        Line {
            position,
            local_ahead: local_ahead(me, position, holding, just_ahead),
            // A lease that runs out deletes its keys, and the watch sees it.
            moves_by: None,
            other_parallelism: None,
        }
    }
}
