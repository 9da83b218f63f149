//! What a waiter watches between looks (docs/backends/etcd.md: "etcd backend"): at the head
//! of the line, the places of the group ahead of it, whose deletion lets it
//! in; a sharer, the nearest exclusive run ahead of it, whose deletion (as
//! a holder) lets in every sharer up to the next exclusive run at once, and
//! the line's other deletes, which move its slot down; further back, the
//! place just ahead, which wakes it when it leaves or takes a slot (its
//! record then says so). So a release wakes the head (or the sharers at the
//! head), and the new holder the next head, however long the line. A watch is
//! kept from look to look while its keys stay the same.

use std::time::Duration;

use super::keys::NameKeys;
use super::link::{self, Client, EventKind, Keys, Watch, WatchEvent};
use super::look::{Blocker, LineView};
use crate::backend::Request;
use crate::backend::net::Deadline;
use crate::platform::clock::Moment;

/// What a look says to watch until the next one.
pub struct WatchTarget {
    keys: Keys,
    deletes_only: bool,
    /// The places whose change concerns us, each with the slot to try for
    /// when its deletion lets us in; empty: any change does.
    wakers: Vec<(Vec<u8>, u32)>,
    /// How many wakers must be deleted before we may take a slot; 0: a
    /// change of one only means that the line moved.
    to_go: usize,
    /// Let in by a holder's going: the places ahead of ours that go in with
    /// us, a slot each in line order, and the free slots, lowest first. One
    /// that leaves first moves our slot down, so that a sharer joining
    /// behind meanwhile, which counts only those still there, never counts
    /// ours as its own.
    ahead: Vec<Vec<u8>>,
    free: Vec<u32>,
    /// The look's revision: what it saw needs no wake-up.
    after: i64,
}

/// Why a wait ended early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// What kept us out was deleted: a slot is ours, this one most likely.
    Freed(u32),
    /// The line moved: look again.
    Moved,
    /// The watch broke: look again, and watch anew.
    Broke,
}

impl WatchTarget {
    /// For the waiter at `index` of `look`'s line, kept out by `blocker`.
    pub fn new(
        keys: &NameKeys,
        look: &LineView,
        index: usize,
        request: &Request,
        blocker: Blocker,
    ) -> Self {
        let key = |at: usize| look.places[at].key.clone();
        let (mut ahead, mut free) = (Vec::new(), Vec::new());
        let (keys, deletes_only, wakers, to_go) = match blocker {
            Blocker::NoFreeSlot => (keys.all(), false, Vec::new(), 0),
            Blocker::Oldest { ahead, to_go } => {
                let slots = request.parallelism;
                let free = look.slot_for(index, slots, None).unwrap_or(0);
                let wakers: Vec<_> = (0..ahead)
                    .map(|at| {
                        let slot = look.slot_at(at).filter(|&slot| slot < slots);
                        (key(at), slot.unwrap_or(free))
                    })
                    .collect();
                let keys = match wakers.as_slice() {
                    [(only, _)] => Keys::one(only),
                    _ => keys.line(),
                };
                (keys, true, wakers, to_go)
            }
            // The holder whose going lets us in: the places ahead are
            // sharers that go with us, and any of them leaving counts.
            Blocker::Place {
                at, frees: true, ..
            } => {
                ahead = look
                    .unslotted_ahead(index, Some(at))
                    .map(|place| place.key.clone())
                    .collect();
                free = look
                    .free_slots(request.capacity(), Some(at))
                    .take(ahead.len() + 1)
                    .collect();
                (keys.line(), true, vec![(key(at), 0)], 1)
            }
            Blocker::Place { at, puts, .. } => (Keys::one(&key(at)), !puts, vec![(key(at), 0)], 0),
        };
        let mut target = Self {
            keys,
            deletes_only,
            wakers,
            to_go,
            ahead,
            free,
            after: look.revision,
        };
        target.count_ahead();
        target
    }

    /// Our slot, by the places still ahead of us that go in with us.
    fn count_ahead(&mut self) {
        if let Some(&slot) = self.free.get(self.ahead.len()).or(self.free.first()) {
            for waker in &mut self.wakers {
                waker.1 = slot;
            }
        }
    }

    fn judge(&mut self, event: &WatchEvent) -> Option<Woken> {
        if event.kv.mod_revision <= self.after {
            return None;
        }
        if self.wakers.is_empty() {
            return Some(Woken::Moved);
        }
        if let Some(left) = self.ahead.iter().position(|key| *key == event.kv.key) {
            self.ahead.swap_remove(left);
            self.count_ahead();
            return None;
        }
        let waker = self
            .wakers
            .iter()
            .position(|(key, _)| *key == event.kv.key)?;
        if self.to_go == 0 || event.kind != EventKind::Delete {
            return Some(Woken::Moved);
        }
        let (_, slot) = self.wakers.swap_remove(waker);
        self.to_go -= 1;
        (self.to_go == 0).then_some(Woken::Freed(slot))
    }
}

/// Less time than this before the wait ends is not worth a new watch.
const SET_UP: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct Watcher {
    target: Option<WatchTarget>,
    /// The open watch, and whether it sees deletes only.
    watch: Option<(Keys, bool, Watch)>,
    /// The last wait ended with a broken watch.
    broke: bool,
}

impl Watcher {
    /// Watches `target` from now on.
    pub fn aim(&mut self, target: WatchTarget) {
        self.target = Some(target);
    }

    /// Closes the watch: we hold a slot or left the line.
    pub fn stop(&mut self) {
        *self = Self::default();
    }

    /// Waits until the target changes, `until` at the latest. A watch that
    /// breaks ends the wait early, so that the next look (on another member
    /// if need be) sets up a new one; a second in a row is trouble for the
    /// waiting loop to ride out.
    pub fn wait(
        &mut self,
        client: &mut Client,
        until: Moment,
        within: Duration,
    ) -> link::Result<Option<Woken>> {
        let Some(target) = self.target.as_mut().filter(|_| until.remaining() >= SET_UP) else {
            std::thread::sleep(until.remaining());
            return Ok(None);
        };
        let broke = std::mem::take(&mut self.broke);
        let reused = matches!(&self.watch,
            Some((keys, deletes_only, _)) if *keys == target.keys && *deletes_only == target.deletes_only);
        if !reused {
            self.watch = None;
            // From now, not from the look's revision: etcd serves a watch
            // that starts in its past from a queue it catches up only every
            // 100 ms (its "unsynced" watchers), so a release in between
            // would reach us up to 100 ms late. Whatever changed since the
            // look the next look sees, and this watch is kept for it.
            let watch = client.watch(&target.keys, 0, target.deletes_only, within)?;
            // A member that did not say its revision might have moved on too.
            let changed = !(1..=target.after).contains(&watch.created_at());
            self.watch = Some((target.keys.clone(), target.deletes_only, watch));
            if changed {
                return Ok(Some(Woken::Moved));
            }
        }
        let (_, _, watch) = self.watch.as_mut().expect("set above");
        let deadline = Deadline::at(until);
        loop {
            match watch.next(deadline) {
                Ok(events) if events.is_empty() => return Ok(None),
                Ok(events) => {
                    if let Some(woken) = events.iter().find_map(|event| target.judge(event)) {
                        return Ok(Some(woken));
                    }
                }
                Err(err) => {
                    self.watch = None;
                    // Compacted past our look, or a member that broke off: look again.
                    if !err.watch_cancelled() {
                        if broke {
                            return Err(err);
                        }
                        self.broke = true;
                    }
                    return Ok(Some(Woken::Broke));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Mode;
    use crate::backend::etcd::link::KeyValue;
    use crate::backend::etcd::look::tests::{S, X, holding, request, view};
    use crate::name::Name;

    fn deleted(look: &LineView, at: usize) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: look.places[at].key.clone(),
                mod_revision: look.revision + 1,
                ..KeyValue::default()
            },
        }
    }

    fn target(look: &LineView, index: usize, request: &Request) -> WatchTarget {
        let keys = NameKeys::new("t", &Name::parse("shelf").unwrap());
        let (blocker, _) = look.waiting(&request.owner.process, index, request);
        WatchTarget::new(&keys, look, index, request, blocker)
    }

    #[test]
    fn a_writer_at_the_head_holds_once_every_sharer_ahead_has_gone() {
        let look = view(&[holding(Mode::Shared, 0), holding(Mode::Shared, 3), S, X]);
        let mut writer = target(&look, 3, &request(Mode::Exclusive, 1));
        assert_eq!(writer.judge(&deleted(&look, 1)), None);
        assert_eq!(writer.judge(&deleted(&look, 1)), None, "counted once");
        assert_eq!(writer.judge(&deleted(&look, 0)), None);
        assert_eq!(writer.judge(&deleted(&look, 2)), Some(Woken::Freed(0)));
    }

    #[test]
    fn every_sharer_behind_a_writer_is_let_in_by_its_release_with_a_slot_of_its_own() {
        let look = view(&[holding(Mode::Exclusive, 0), S, S, S]);
        for index in 1..4 {
            let mut reader = target(&look, index, &request(Mode::Shared, 1));
            assert_eq!(
                reader.judge(&deleted(&look, 0)),
                Some(Woken::Freed(index as u32 - 1))
            );
        }
        let look = view(&[holding(Mode::Exclusive, 0), S, S, S]);
        let mut last = target(&look, 3, &request(Mode::Shared, 1));
        assert_eq!(last.judge(&deleted(&look, 1)), None, "a reader ahead left");
        assert_eq!(
            last.judge(&deleted(&look, 0)),
            Some(Woken::Freed(1)),
            "one slot lower: a reader joining meanwhile counts only those still there"
        );
        let look = view(&[holding(Mode::Exclusive, 0), X, S]);
        let mut reader = target(&look, 2, &request(Mode::Shared, 1));
        assert_eq!(
            reader.judge(&deleted(&look, 1)),
            Some(Woken::Moved),
            "a writer left, another is ahead"
        );
    }
}
