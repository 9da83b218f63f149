//! A slot of the SQLite backend: a row of `holders` with a lease, renewed and
//! released in short transactions.

use std::rc::Rc;
use std::time::Duration;

use rusqlite::params;

use super::database::{BUSY_TIMEOUT, Database};
use super::judge::Judge;
use super::line::{moved, redate, ring};
use crate::backend::{Released, Renewal, Slot};
use crate::duration::millis;
use crate::error::Result;
use crate::platform::clock::Moment;

/// The longest one renewal waits for the write lock (less when the supervisor needs an answer sooner).
const RENEWAL_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// A slot of the SQLite backend: a row with a lease.
pub(super) struct SqliteSlot {
    pub(super) db: Rc<Database>,
    pub(super) judge: Rc<Judge>,
    pub(super) name: String,
    pub(super) slot: u32,
    pub(super) fence: u64,
    pub(super) token: String,
    pub(super) ttl: Duration,
    pub(super) taken_at: Moment,
}

impl Slot for SqliteSlot {
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
        // Short waits for the lock: the supervisor retries soon, and forwards signals in between.
        let busy = within.min(RENEWAL_BUSY_TIMEOUT);
        let renewed = self.db.write("renew the lease", busy, |tx| {
            let now = self.judge.now();
            redate(
                tx,
                &self.name,
                self.slot,
                &self.token,
                &now,
                millis(self.ttl),
                false,
            )
        })?;
        Ok(Renewal::confirmed(renewed))
    }

    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        let (ours, tell) = self.db.write("release the slot", BUSY_TIMEOUT, |tx| {
            let now = self.judge.now();
            if let Some(until) = keep_until.filter(|&until| until > now.at) {
                // The row outlives us until then (--min-hold); a lapsed lease is not revived.
                let keep = millis(until - now.at);
                let kept = redate(tx, &self.name, self.slot, &self.token, &now, keep, true)?;
                return Ok((kept, Vec::new()));
            }
            let deleted = tx.execute(
                "DELETE FROM holders WHERE name = ?1 AND slot = ?2 AND token = ?3",
                params![self.name, self.slot, self.token],
            )?;
            Ok((deleted == 1, moved(tx, &self.name, &now)?))
        })?;
        ring(&tell);
        Ok(Released::ours(ours))
    }
}
