//! A slot of the Redis backend: a key with a PX TTL, renewed while its
//! command runs (with `WAIT` for `--redis-replicas`) and released after.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::Release;
use super::link::{RedisLink, Route};
use super::replicas::Replicas;
use super::scripts::{RedisKeys, Scripts};
use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::platform::clock::Moment;
use crate::timing::{FREE_CALL, Plan};

const RENEWING: &str = "renewing the lease";

pub struct RedisSlot {
    pub link: Rc<RefCell<RedisLink>>,
    pub scripts: Rc<Scripts>,
    pub replicas: Replicas,
    pub keys: RedisKeys,
    pub slot: u32,
    pub fence: u64,
    pub token: String,
    pub plan: Plan,
    pub taken_at: Moment,
}

impl RedisSlot {
    /// Frees a slot that was taken but does not count (too few replicas have
    /// it), waking the head of the line.
    pub fn give_back(self) -> Result<bool> {
        super::release(
            &self.link,
            &self.scripts,
            &self.keys,
            &self.keys.slot(self.slot),
            &self.token,
            Release::GiveBack,
            FREE_CALL,
        )
    }
}

impl Slot for RedisSlot {
    fn number(&self) -> u32 {
        self.slot
    }

    fn fence(&self) -> u64 {
        self.fence
    }

    fn taken_at(&self) -> Moment {
        self.taken_at
    }

    fn renew(&mut self, within: Duration) -> Result<Renewal> {
        let key = self.keys.slot(self.slot);
        let mut invocation = self.scripts.renew.key(&key);
        invocation
            .arg(&self.token)
            .arg(self.plan.ttl().as_millis() as u64);
        let timeout = self.plan.holder_call().min(within);
        let replicas = self.replicas;
        let (renewed, acknowledged): (i64, u32) =
            self.link
                .borrow_mut()
                .call(Route::Key(&key), RENEWING, timeout, |c| {
                    replicas.invoke(c, &invocation, timeout)
                })?;
        if renewed == 1
            && let Some(short) = replicas.short(acknowledged)
        {
            // Not confirmed: retried until the command's stop, as any failed
            // renewal, after asking the Sentinels again (a failover's new primary).
            self.link.borrow_mut().forget_primary();
            return Err(self.link.borrow().failure(RENEWING, &short).into());
        }
        Ok(Renewal::confirmed(renewed == 1))
    }

    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        // A duration from now, not a time: only the server's clock decides expiry.
        let how = keep_until
            .map(Moment::remaining)
            .filter(|keep| keep.as_millis() > 0)
            .map_or(Release::Free(self.replicas), |keep| {
                Release::Keep(keep, self.replicas)
            });
        let ours = super::release(
            &self.link,
            &self.scripts,
            &self.keys,
            &self.keys.slot(self.slot),
            &self.token,
            how,
            self.plan.holder_call(),
        )?;
        Ok(Released::ours(ours))
    }
}
