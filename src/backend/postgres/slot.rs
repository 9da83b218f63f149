//! A slot of the PostgreSQL backend: a row in `holders` with a lease that
//! the server's clock dates, renewed on the connection that took it (made
//! anew if it broke: a restart or failover loses the holder nothing).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};

use super::link::PostgresLink;
use super::prepared::DELETE_AT;
use super::sql::Sql;
use super::{change, millis};
use crate::backend::net::Deadline;
use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::platform::clock::Moment;
use crate::timing::Plan;

pub struct PostgresSlot {
    pub link: Rc<RefCell<PostgresLink>>,
    pub sql: Rc<Sql>,
    pub name: String,
    pub slot: u32,
    pub fence: u64,
    pub token: String,
    pub plan: Plan,
    pub taken_at: Moment,
}

impl Slot for PostgresSlot {
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
        let (slot, ttl) = (self.slot.cast_signed(), millis(self.plan.ttl()));
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&self.name, Type::TEXT),
            (&slot, Type::INT4),
            (&self.token, Type::TEXT),
            (&ttl, Type::INT8),
        ];
        let within = self.plan.holder_call().min(within);
        let renewed = self.link.borrow_mut().transact(
            "renew the lease",
            within,
            &[(&self.sql.renew, &params)],
        )?;
        Ok(Renewal::confirmed(renewed[0].len() == 1))
    }

    fn release(self: Box<Self>, keep_until: Option<Moment>) -> Result<Released> {
        // A duration from now, not a time: only the server's clock dates leases.
        let keep = keep_until.map_or(0, |until| millis(until.remaining()));
        let slot = self.slot.cast_signed();
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&self.name, Type::TEXT),
            (&slot, Type::INT4),
            (&self.token, Type::TEXT),
            (&keep, Type::INT8),
        ];
        let within = self.plan.holder_call();
        if keep == 0 {
            return Ok(Released::ours(self.free(within, &params[..3])?));
        }
        // Kept taken, and nobody to wake: the slot is not free.
        let kept = [(self.sql.keep.as_str(), &params[..])];
        let rows = self
            .link
            .borrow_mut()
            .transact("keep the slot", within, &kept)?;
        Ok(Released::ours(rows[0].len() == 1))
    }
}

impl PostgresSlot {
    /// Frees the slot and grants it on, within `within`; whether it was still
    /// ours. With the wake ready in the session, in one message; else with
    /// `params` ($1 name, $2 slot, $3 token) bound to the plain release.
    fn free(&self, within: Duration, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<bool> {
        let deadline = Deadline::after(within);
        let what = "release the slot";
        let prepared =
            (self.sql.prepared_wake.as_ref()).filter(|_| self.link.borrow().wake_ready());
        if let Some(prepared) = prepared {
            let release = prepared.release(&self.sql, &self.name, self.slot, &self.token);
            let mut link = self.link.borrow_mut();
            match link.transact_written_once(what, within, &release) {
                Ok(counts) => return Ok(counts.get(DELETE_AT) == Some(&1)),
                // Rolled back (a pooler's other server session lacks the statement),
                // or the session broke: a new one would lack it too. The plain way,
                // if enough time is left for it (after an answer lost with the
                // session, it finds the slot freed already, as any repeated call would).
                Err(err) => {
                    link.wake_missing();
                    if deadline.remaining() < within / 2 {
                        return Err(err);
                    }
                }
            }
        }
        let freed = [(self.sql.release.as_str(), params)];
        let rows = change(
            &self.link,
            &self.sql,
            what,
            deadline.remaining(),
            &self.name,
            false,
            &freed,
        )?;
        Ok(rows[0].len() == 1)
    }
}
