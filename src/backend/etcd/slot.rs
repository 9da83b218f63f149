//! A slot of the etcd backend: a place in line and a slot key, both attached
//! to the holder's lease, which the cluster ends unless it is kept alive.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use super::keys::NameKeys;
use super::link::{Client, GrantedLease};
use super::look::Holding;
use super::recipe;
use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::identity::epoch_millis;
use crate::platform::clock::Moment;
use crate::timing::Plan;

pub struct EtcdSlot {
    pub(super) client: Rc<RefCell<Client>>,
    pub(super) keys: NameKeys,
    pub(super) lease: GrantedLease,
    /// What our place holds, to keep it for `--min-hold`.
    pub(super) holding: Holding,
    pub(super) fence: u64,
    /// When the last confirmed grant or keep-alive of the lease was sent (or earlier).
    pub(super) taken_at: Moment,
    /// Whether our place says that we hold the slot.
    pub(super) recorded: bool,
}

impl Slot for EtcdSlot {
    fn number(&self) -> u32 {
        self.holding.slot
    }

    fn fence(&self) -> u64 {
        self.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn granted_ttl(&self) -> Option<Duration> {
        Some(self.lease.ttl)
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let deadline = Moment::now() + Plan::new(self.lease.ttl).holder_call().min(within);
        let mut client = self.client.borrow_mut();
        if !self.recorded {
            let record = recipe::record(&self.keys, self.lease.id, &self.holding);
            if !client.txn(&record, deadline.remaining())?.succeeded {
                // Our place is no longer on our lease: the lease is gone.
                return Ok(Renewal::Lost);
            }
            self.recorded = true;
        }
        let renewed = client.lease_keep_alive(self.lease.id, deadline.remaining())?;
        Ok(Renewal::confirmed(renewed.is_some()))
    }

    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        let within = Plan::new(self.lease.ttl).holder_call();
        let mut client = self.client.borrow_mut();
        let keep = keep_until
            .map(Moment::remaining)
            .filter(|keep| !keep.is_zero());
        if let Some(keep) = keep {
            // The place and slot move to a lease that lasts as long as the
            // minimum hold (the cluster's clock ends it, in whole seconds);
            // the place keeps its create revision, so it keeps its place in line.
            let kept = client.lease_grant(keep, within)?;
            let mut holding = self.holding.clone();
            holding.holder.kept_until = Some(epoch_millis(SystemTime::now() + keep));
            client.txn(
                &recipe::keep(&self.keys, self.lease.id, kept.id, &holding),
                within,
            )?;
        }
        let ours = client.lease_revoke(self.lease.id, within)?;
        Ok(Released::ours(ours))
    }
}
