//! One lockrun's side of the line: its lease (granted at its first look,
//! kept alive by its looks), its looks at the line, the slot it takes, and
//! its waits between looks.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::keys::NameKeys;
use super::link::{self, Client, GrantedLease, Op, Txn, TxnOutcome};
use super::look::{Blocker, Holding, LineView, Place, Record, Stand};
use super::slot::EtcdSlot;
use super::watching::{WatchTarget, Watcher, Woken};
use super::{holding, now_millis, recipe};
use crate::backend::record::WaiterRecord;
use crate::backend::{Attempt, Line, Mode, Request, Slot};
use crate::platform::clock::Moment;
use crate::timing::{FREE_CALL, Plan};

pub struct Waiter {
    client: Rc<RefCell<Client>>,
    lease: Option<Mine>,
    /// When our first look was: our record says we began waiting then.
    since: Option<u64>,
    /// What ended the last wait early.
    woken: Option<Woken>,
    watcher: Watcher,
}

/// Our lease, and whether our place is in line.
struct Mine {
    lease: GrantedLease,
    /// When its last confirmed grant or keep-alive was sent.
    refreshed_at: Moment,
    in_line: bool,
    /// Our place's create revision, as the last look saw it.
    revision: i64,
}

impl Waiter {
    pub fn new(client: Rc<RefCell<Client>>) -> Self {
        Self {
            client,
            lease: None,
            since: None,
            woken: None,
            watcher: Watcher::default(),
        }
    }

    /// One look at the line, and a slot if the line lets us have one.
    pub fn attempt(&mut self, keys: &NameKeys, request: &Request) -> link::Result<Attempt> {
        match self.look(keys, request) {
            // Our lease ran out between two calls (a pause, a TTL shorter
            // than a round trip), and our place with it: join again.
            Err(err) if err.lease_not_found() => {
                self.lease = None;
                self.look(keys, request)
            }
            result => result,
        }
    }

    /// Waits until what our last look said to watch changes, `until` at the
    /// latest; true when the wait ended early (the next look has to see why).
    pub fn wait(&mut self, until: Moment) -> link::Result<bool> {
        self.woken = self
            .watcher
            .wait(&mut self.client.borrow_mut(), until, FREE_CALL)?;
        Ok(self.woken.is_some())
    }

    /// Revokes our lease, and with it our place.
    pub fn leave(&mut self, within: Duration) -> link::Result<()> {
        self.watcher.stop();
        if let Some(mine) = self.lease.take() {
            self.client
                .borrow_mut()
                .lease_revoke(mine.lease.id, within)?;
        }
        Ok(())
    }

    fn look(&mut self, keys: &NameKeys, request: &Request) -> link::Result<Attempt> {
        let within = FREE_CALL;
        let parallelism = request.parallelism;
        let woken = self.woken.take();
        // Told that a slot is ours, take it at once: a keep-alive can wait for the supervisor.
        let taking = matches!(woken, Some(Woken::Freed(_)));
        let refresh_after = request.plan.refresh_place_after(taking);
        let lease = self.keep_lease(request, refresh_after, within)?.id;
        let newcomer = !self.lease.as_ref().is_some_and(|mine| mine.in_line);
        let mut look = match woken {
            _ if newcomer => self.claim(keys, request, request.queue, within)?,
            // The places ahead of ours at the head are gone, so ours is the
            // oldest: with one slot, that is what holds it (etcd's own lock
            // recipe). A sharer freed by the last exclusive run ahead of it
            // going has only sharers ahead, few enough to hold beside: its
            // place in line is what lets it in too, and a writer behind waits
            // for that place, not for a slot key. No call stands between the
            // release and our command (a write each, which a line of readers
            // let in at once would queue for); the first renewal, at once,
            // writes our record and our slot key.
            Some(Woken::Freed(slot))
                if request.capacity() == 1 || request.mode() == Mode::Shared =>
            {
                let mine = self.lease.as_ref().expect("in line with a lease");
                let fence = mine.revision;
                return Ok(Attempt::Taken(self.slot(
                    keys,
                    holding(request, slot),
                    fence,
                    false,
                )));
            }
            Some(Woken::Freed(slot)) => self.take(keys, slot, request, within)?,
            _ => self.look_ahead(keys, request, within)?,
        };
        if newcomer && let Some(theirs) = look.other_parallelism(lease, parallelism) {
            // Our place, if the claim put one, goes with our lease (docs/guide.md: "Slots").
            self.leave(within)?;
            return Ok(Attempt::Waiting(Line::refused(theirs)));
        }
        // A take fails only when another new holder took that slot first: the next look decides.
        let mut settled = false;
        for _ in 0..=request.capacity() {
            match look.stand(lease, request) {
                Stand::Holding(slot) => {
                    let place = look.places.iter().find(|place| place.lease == lease);
                    let holding = match place.and_then(Place::record).cloned() {
                        Some(Record::Holding(holding)) => holding,
                        // Only a place edited by hand reads otherwise.
                        _ => holding(request, slot),
                    };
                    let fence = place.map_or(0, |place| place.revision);
                    return Ok(Attempt::Taken(self.slot(keys, holding, fence, true)));
                }
                Stand::MayTake(slot) => look = self.take(keys, slot, request, within)?,
                // --no-wait joins only when it may take a slot at once.
                Stand::Absent if request.queue || look.lets_in_newcomer(request) => {
                    look = self.claim(keys, request, true, within)?;
                }
                Stand::Absent => return Ok(Attempt::Waiting(look.outside(request))),
                // In the group, behind sharers whose slots do not show yet:
                // they show at once, so --no-wait waits for that, once.
                Stand::Waiting(index)
                    if !request.queue && !settled && index < look.group(request) =>
                {
                    settled = true;
                    let target = WatchTarget::new(keys, &look, index, request, Blocker::NoFreeSlot);
                    self.watcher.aim(target);
                    let until = Moment::now() + within;
                    self.watcher
                        .wait(&mut self.client.borrow_mut(), until, within)?;
                    look = self.look_ahead(keys, request, within)?;
                }
                Stand::Waiting(_) if !request.queue => {
                    self.leave(within)?;
                    return Ok(Attempt::Waiting(look.outside(request)));
                }
                Stand::Waiting(index) => {
                    if let Some(mine) = &mut self.lease {
                        mine.revision = look.places[index].revision;
                    }
                    let me = &request.owner.process;
                    let (blocker, line) = look.waiting(me, index, request);
                    self.watcher
                        .aim(WatchTarget::new(keys, &look, index, request, blocker));
                    return Ok(Attempt::Waiting(line));
                }
            }
        }
        self.watcher.stop();
        Ok(Attempt::Waiting(Line {
            position: 1,
            ..Line::default()
        }))
    }

    /// Our lease: granted at the first look, kept alive when `refresh_after`
    /// has passed since it was last. A lease that lapsed took our place with
    /// it: a new one joins the line again, at its end.
    fn keep_lease(
        &mut self,
        request: &Request,
        refresh_after: Duration,
        within: Duration,
    ) -> link::Result<GrantedLease> {
        let mut client = self.client.borrow_mut();
        let sent = Moment::now();
        if let Some(mine) = &mut self.lease {
            if sent < mine.refreshed_at + refresh_after {
                return Ok(mine.lease);
            }
            if client.lease_keep_alive(mine.lease.id, within)?.is_some() {
                mine.refreshed_at = sent;
                return Ok(mine.lease);
            }
        }
        let lease = client.lease_grant(request.plan.ttl(), within)?;
        self.lease = Some(Mine {
            lease,
            refreshed_at: sent,
            in_line: false,
            revision: 0,
        });
        Ok(lease)
    }

    fn claim(
        &mut self,
        keys: &NameKeys,
        request: &Request,
        join: bool,
        within: Duration,
    ) -> link::Result<LineView> {
        let since = *self.since.get_or_insert_with(now_millis);
        let waiting = Record::Waiting(WaiterRecord {
            name: request.name.to_string(),
            owner: request.owner.clone(),
            since,
        });
        let mine = self.lease.as_mut().expect("a lease before a claim");
        let claim = recipe::claim(
            keys,
            mine.lease.id,
            &holding(request, 0),
            join.then_some(&waiting),
        );
        let outcome = self.client.borrow_mut().txn(&claim, within)?;
        if !outcome.succeeded
            && let Some(newer) = outcome.listings.first().and_then(|newer| newer.kvs.first())
        {
            return Err(link::Error::permanent(keys.format().refusal(&newer.key)));
        }
        mine.in_line = join || outcome.succeeded;
        Ok(look(keys, outcome))
    }

    /// A look at the line from our place forward: once we know our place's
    /// revision, the places behind it are left out, as they change nothing
    /// of where we stand, and a look at a long line stays as short as the
    /// part ahead of us. Slots are read whole: one may be newer than our place.
    fn look_ahead(
        &mut self,
        keys: &NameKeys,
        request: &Request,
        within: Duration,
    ) -> link::Result<LineView> {
        let ours = self.lease.as_ref().map_or(0, |mine| mine.revision);
        let mut client = self.client.borrow_mut();
        if ours == 0 || !request.queue {
            return Ok(LineView::new(keys, client.range(&keys.all(), within)?));
        }
        let ahead = Txn::new()
            .then(Op::RangeUpTo(keys.line(), ours))
            .then(Op::Range(keys.slots()));
        let outcome = client.txn(&ahead, within)?;
        let kvs = outcome.listings.into_iter().flat_map(|listing| listing.kvs);
        Ok(LineView::new(
            keys,
            link::Listing {
                kvs: kvs.collect(),
                revision: outcome.revision,
            },
        ))
    }

    fn take(
        &mut self,
        keys: &NameKeys,
        slot: u32,
        request: &Request,
        within: Duration,
    ) -> link::Result<LineView> {
        let lease = self.lease.as_ref().expect("a lease before a take").lease.id;
        let take = recipe::take(keys, lease, &holding(request, slot));
        let outcome = self.client.borrow_mut().txn(&take, within)?;
        Ok(look(keys, outcome))
    }

    /// The slot our lease holds, as `holding` says, with our place's create
    /// revision as its fence; the lease is the slot's from now on. Unless
    /// `recorded` (our place holds `holding` already), the slot's first
    /// renewal writes it, and comes at once.
    fn slot(
        &mut self,
        keys: &NameKeys,
        holding: Holding,
        fence: i64,
        recorded: bool,
    ) -> Box<dyn Slot> {
        self.watcher.stop();
        let mine = self.lease.take().expect("a lease holds the slot");
        let taken_at = if recorded {
            mine.refreshed_at
        } else {
            // Earlier is always safe: the lease runs from no earlier than this.
            mine.refreshed_at
                .min(Moment::now() - Plan::new(mine.lease.ttl).renew_every())
        };
        Box::new(EtcdSlot {
            client: Rc::clone(&self.client),
            keys: keys.clone(),
            lease: mine.lease,
            holding,
            fence: fence as u64,
            taken_at,
            recorded,
        })
    }
}

/// The look a transaction's range gives.
fn look(keys: &NameKeys, mut outcome: TxnOutcome) -> LineView {
    let listing = outcome.listings.pop().unwrap_or(link::Listing {
        kvs: Vec::new(),
        revision: outcome.revision,
    });
    LineView::new(keys, listing)
}
