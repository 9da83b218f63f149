//! A slot of the S3 backend: our holder entry in the name's state object,
//! renewed by bumping its heartbeat counter (every TTL/3, by the supervisor)
//! and released by taking it out, each a compare-and-swap.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::now_millis;
use super::swap::Objects;
use crate::backend::net::Deadline;
use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::platform::clock::Moment;
use crate::timing::Plan;

pub(super) struct S3Slot {
    pub(super) objects: Rc<RefCell<Objects>>,
    pub(super) key: String,
    pub(super) token: String,
    pub(super) number: u32,
    pub(super) fence: u64,
    pub(super) ttl: Duration,
    pub(super) taken_at: Moment,
}

impl Slot for S3Slot {
    fn number(&self) -> u32 {
        self.number
    }

    fn fence(&self) -> u64 {
        self.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let deadline = Deadline::after(Plan::new(self.ttl).holder_call().min(within));
        // The counter we mean to write: after an unknown outcome, a read that
        // shows it (or more) says the renewal was made; after a lost swap it
        // is decided afresh.
        let mut bumped_to = None;
        let token = &self.token;
        let ours = self
            .objects
            .borrow_mut()
            .change(&self.key, deadline, |state, seen| {
                if !seen.may_have_written {
                    bumped_to = None;
                }
                let Some(holder) = state.holder_mut(token).filter(|holder| !holder.kept) else {
                    return Ok((false, false));
                };
                if bumped_to.is_some_and(|beat| holder.beat >= beat) {
                    return Ok((true, false));
                }
                holder.beat += 1;
                bumped_to = Some(holder.beat);
                Ok((true, true))
            })?;
        Ok(Renewal::confirmed(ours))
    }

    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        let deadline = Deadline::after(Plan::new(self.ttl).holder_call());
        // A length, not a time: observers judge the keep by its silence on their own clocks.
        let keep_for = keep_until
            .map(|until| until.remaining().as_millis() as u64)
            .filter(|&left| left > 0);
        let token = &self.token;
        // Whether our entry was there at a look whose change may have been
        // made: a retry after an unknown outcome finds our own change made,
        // one after a lost swap finds what others did.
        let mut ours = None;
        self.objects
            .borrow_mut()
            .change(&self.key, deadline, |state, seen| {
                if !seen.may_have_written {
                    ours = None;
                }
                let at = state
                    .holders
                    .iter()
                    .position(|holder| &holder.record.owner.token == token);
                let Some(at) = at else {
                    return Ok(((), false));
                };
                if state.holders[at].kept {
                    ours.get_or_insert(true);
                    return Ok(((), false));
                }
                ours.get_or_insert(true);
                match keep_for {
                    Some(left) => {
                        // Kept until then (--min-hold): a new counter, so that
                        // every observer starts the keep's silence afresh.
                        let holder = &mut state.holders[at];
                        holder.kept = true;
                        holder.beat += 1;
                        holder.ttl_ms = left;
                        holder.record.kept_until = Some(now_millis() + left);
                    }
                    None => {
                        state.holders.remove(at);
                    }
                }
                Ok(((), true))
            })?;
        Ok(Released::ours(ours.unwrap_or(false)))
    }
}
