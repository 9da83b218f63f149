//! A slot of the SQLite backend: a row of `holders` with a lease, renewed and
//! released in short transactions.

use std::rc::Rc;
use std::time::{Duration, SystemTime};

use rusqlite::params;

use super::database::{BUSY_TIMEOUT, Database};
use super::line::{moved, ring};
use super::{millis, now_millis};
use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::identity::epoch_millis;
use crate::platform::clock::Moment;

/// The longest one renewal waits for the write lock (less when the supervisor needs an answer sooner).
const RENEWAL_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// A slot of the SQLite backend: a row with a lease.
pub(super) struct SqliteSlot {
    pub(super) db: Rc<Database>,
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
            let now = now_millis();
            // Only a lease that has not lapsed: a renewal never brings one back.
            tx.execute(
                "UPDATE holders SET expires_at = ?1
                 WHERE name = ?2 AND slot = ?3 AND token = ?4 AND released = 0 AND expires_at > ?5",
                params![
                    now + millis(self.ttl),
                    self.name,
                    self.slot,
                    self.token,
                    now
                ],
            )
        })?;
        Ok(Renewal::confirmed(renewed == 1))
    }

    fn release(self: Box<Self>, keep_until: Option<SystemTime>) -> Result<Released> {
        let keep_until = keep_until.map(epoch_millis);
        let (ours, tell) = self.db.write("release the slot", BUSY_TIMEOUT, |tx| {
            let now = now_millis();
            if let Some(until) = keep_until.filter(|&until| until > now) {
                // The row outlives us until then (--min-hold); a lapsed lease is not revived.
                let kept = tx.execute(
                    "UPDATE holders SET expires_at = ?1, released = 1
                     WHERE name = ?2 AND slot = ?3 AND token = ?4 AND expires_at > ?5",
                    params![until, self.name, self.slot, self.token, now],
                )?;
                return Ok((kept == 1, Vec::new()));
            }
            let deleted = tx.execute(
                "DELETE FROM holders WHERE name = ?1 AND slot = ?2 AND token = ?3",
                params![self.name, self.slot, self.token],
            )?;
            Ok((deleted == 1, moved(tx, &self.name, now)?))
        })?;
        ring(&tell);
        Ok(Released::ours(ours))
    }
}
