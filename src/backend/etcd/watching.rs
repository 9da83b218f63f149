//! What a waiter watches between looks (README: "etcd backend"): at the head
//! of the line, the holders' places, whose deletion frees a slot for it;
//! further back, the place just ahead, which wakes it when it leaves or takes
//! a slot (its record then says so). So a release wakes the head, and the
//! new holder the next head, however long the line. A watch is kept from look
//! to look while its keys stay the same.

use std::time::Duration;

use super::keys::NameKeys;
use super::link::{self, Client, EventKind, Keys, Watch, WatchEvent};
use super::look::LineView;
use crate::backend::net::Deadline;
use crate::platform::clock::Moment;

/// What a look says to watch until the next one.
pub struct WatchTarget {
    keys: Keys,
    deletes_only: bool,
    /// The places whose change concerns us, and the slot to try for when one
    /// of them is deleted while we are at the head; empty: any change does.
    wakers: Vec<(Vec<u8>, u32)>,
    /// We are the head: a deleted waker leaves fewer than N places ahead of us.
    head: bool,
    /// The look's revision: what it saw needs no wake-up.
    after: i64,
}

/// Why a wait ended early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A place ahead of us at the head was deleted: a slot is ours, this one most likely.
    Freed(u32),
    /// The line moved: look again.
    Moved,
    /// The watch broke: look again, and watch anew.
    Broke,
}

impl WatchTarget {
    /// For a waiter at `index` of `look`'s line.
    pub fn new(keys: &NameKeys, look: &LineView, index: usize, parallelism: u32) -> Self {
        let slots = parallelism as usize;
        let free = look.free_slot(parallelism).unwrap_or(0);
        let waker = |at: usize| {
            (
                look.places[at].key.clone(),
                look.slot_at(at).unwrap_or(free),
            )
        };
        let (keys, deletes_only, wakers) = if index < slots {
            // Among the N oldest without a free slot key: anything may change that.
            (keys.all(), false, Vec::new())
        } else if index > slots {
            // The place just ahead: its delete moves us up, and its put (it
            // now holds a slot) makes us the head.
            let ahead = waker(index - 1);
            (Keys::one(&ahead.0), false, vec![ahead])
        } else if slots == 1 {
            // The head of a line with one slot: the holder's place.
            let holder = waker(0);
            (Keys::one(&holder.0), true, vec![holder])
        } else {
            (keys.line(), true, (0..index).map(waker).collect())
        };
        Self {
            keys,
            deletes_only,
            wakers,
            head: index == slots,
            after: look.revision,
        }
    }

    fn judge(&self, event: &WatchEvent) -> Option<Woken> {
        if event.kv.mod_revision <= self.after {
            return None;
        }
        if self.wakers.is_empty() {
            return Some(Woken::Moved);
        }
        let &(_, slot) = self.wakers.iter().find(|(key, _)| *key == event.kv.key)?;
        Some(if self.head && event.kind == EventKind::Delete {
            Woken::Freed(slot)
        } else {
            Woken::Moved
        })
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
        let Some(target) = self.target.as_ref().filter(|_| until.remaining() >= SET_UP) else {
            std::thread::sleep(until.remaining());
            return Ok(None);
        };
        let broke = std::mem::take(&mut self.broke);
        let reused = matches!(&self.watch,
            Some((keys, deletes_only, _)) if *keys == target.keys && *deletes_only == target.deletes_only);
        if !reused {
            self.watch = None;
            let watch =
                client.watch(&target.keys, target.after + 1, target.deletes_only, within)?;
            self.watch = Some((target.keys.clone(), target.deletes_only, watch));
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
