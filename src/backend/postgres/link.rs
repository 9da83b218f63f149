//! The backend's connection to the server, shared by the store and the slot
//! it hands out: made when first needed (lockrun's schema checked, and made
//! if running may, on the first one), made anew after it broke (a restart, a
//! failover, `pg_terminate_backend`), and given up between looks by a waiter
//! far back in line. What fails comes out as lockrun's errors.

use std::time::Duration;

use tokio_postgres::Row;

use super::connect::{Connector, Session, Statement};
use super::prepared::{PreparedWake, SINCE_MAJOR};
use super::schema::{Schema, create_or_check};
use super::sql::{CHANNEL_PREFIX, GRANTED};
use crate::backend::net::{Deadline, Failure};
use crate::error::Result;
use crate::platform::clock::Moment;
use crate::timing::FREE_CALL;

pub struct PostgresLink {
    connector: Connector,
    schema: Schema,
    /// Whether a missing schema may be made (running), or only looked for.
    create: bool,
    session: Option<Session>,
    /// Whether a first connection looked for lockrun's tables.
    looked: bool,
    /// The version of lockrun's tables, if they are there.
    tables: Option<i64>,
    /// The token whose channel the session LISTENs on for wake-ups, if any (a
    /// new session listens on none). A run with several names listens on each
    /// in turn; a wake-up on another's channel is from an acquisition over.
    listening: Option<String>,
    /// How many of the wake-ups queued now came before the last join of the
    /// line: a grant among them may be for the place that join replaced, or
    /// for the new one (sent the moment the join committed), so it is claimed,
    /// not trusted.
    doubted: usize,
    /// Whether the session has the wake prepared and planned (see
    /// [`PreparedWake`]); `None` until it was tried.
    wake_ready: Option<bool>,
}

impl PostgresLink {
    pub fn new(connector: Connector, schema: Schema, create: bool) -> Self {
        Self {
            connector,
            schema,
            create,
            session: None,
            looked: false,
            tables: None,
            listening: None,
            doubted: 0,
            wake_ready: None,
        }
    }

    /// How long a look at the line (or `status`) may take, connecting
    /// included: the target's `connect_timeout`, and at least [`FREE_CALL`].
    pub fn patience(&self) -> Duration {
        self.connector.target().connect_timeout.max(FREE_CALL)
    }

    /// The version of lockrun's tables, if they are there (made or brought
    /// up to date first, when running): connects, if not connected yet.
    pub fn tables(&mut self) -> Result<Option<i64>> {
        self.session(self.patience())?;
        Ok(self.tables)
    }

    /// Whether the session listens for the wake-ups of `token`.
    pub fn listening(&self, token: &str) -> bool {
        self.listening.as_deref() == Some(token) && self.is_usable()
    }

    /// The session now listens for the wake-ups of `token` (a LISTEN it ran
    /// was committed).
    pub fn listens(&mut self, token: &str) {
        self.listening = Some(token.to_owned());
    }

    /// Doubts the wake-ups queued now (see [`PostgresLink::woken`]): a look
    /// that just joined the line starts a new place.
    pub fn doubt_wakeups(&mut self) {
        self.doubted = self
            .session
            .as_ref()
            .map_or(0, Session::queued_notifications);
    }

    /// Whether the session has the wake ready: a release can run it as prepared.
    pub fn wake_ready(&self) -> bool {
        self.wake_ready == Some(true) && self.is_usable()
    }

    /// Whether there is a session that can take more calls.
    pub fn is_usable(&self) -> bool {
        self.session.as_ref().is_some_and(Session::is_usable)
    }

    /// Readies `wake` in the session, once: for a waiter whose release may
    /// be a handoff. Without it (a server before PostgreSQL 12, or a failure),
    /// a release runs the plain wake, which does the same.
    pub fn ready_wake(&mut self, wake: &PreparedWake) {
        if self.wake_ready.is_some() {
            return;
        }
        let Some(session) = self.session.as_mut().filter(|session| session.is_usable()) else {
            return;
        };
        let able = session
            .server_major()
            .is_some_and(|major| major >= SINCE_MAJOR);
        let what = "ready the release";
        // Prepared and planned in one round trip: a new session has nothing
        // prepared, unless a pooler gave us a server session that has it.
        let ready = able
            && (session
                .transact_written(what, FREE_CALL, &wake.readied())
                .is_ok()
                || session.is_usable()
                    && session
                        .transaction(what, FREE_CALL, async |client| wake.ready(client).await)
                        .is_ok());
        self.wake_ready = Some(ready);
    }

    /// The session turned out not to have the wake ready (a pooler gave the
    /// transaction another server session): the plain one from now on.
    pub fn wake_missing(&mut self) {
        self.wake_ready = Some(false);
    }

    /// Gives the connection up, until the next call.
    pub fn disconnect(&mut self) {
        self.session = None;
        self.listening = None;
        self.doubted = 0;
    }

    /// Runs `statements` as [`Session::transact_written`] does, on the
    /// session there is, but never again on a new one: for statements that a
    /// new session would not know.
    pub fn transact_written_once(
        &mut self,
        what: &str,
        within: Duration,
        statements: &[String],
    ) -> Result<Vec<u64>> {
        let result = self
            .session(within)?
            .transact_written(what, within, statements);
        result.map_err(|failure| self.failed(failure))
    }

    /// Runs `statements` in one transaction and one round trip (see
    /// [`Session::transact`]) within `within`, connecting first if needed.
    /// A connection found dead on reuse (the server restarted since) is
    /// replaced once, in the time left: the statements are all safe to repeat.
    pub fn transact(
        &mut self,
        what: &str,
        within: Duration,
        statements: &[Statement],
    ) -> Result<Vec<Vec<Row>>> {
        self.transact_listening(None, what, within, statements)
    }

    /// [`PostgresLink::transact`], listening on the channel `listen_on` from
    /// just before, in the same round trip (see [`Session::transact`]).
    pub fn transact_listening(
        &mut self,
        listen_on: Option<&str>,
        what: &str,
        within: Duration,
        statements: &[Statement],
    ) -> Result<Vec<Vec<Row>>> {
        let deadline = Deadline::after(within);
        let reused = self.session.as_ref().is_some_and(Session::is_usable);
        let result = self
            .session(within)?
            .transact(listen_on, what, within, statements);
        match result {
            Err(failure) if reused && failure.is_transient() && self.is_broken() => {
                let left = deadline.remaining();
                self.session(left)?
                    .transact(listen_on, what, left, statements)
                    .map_err(|failure| self.failed(failure))
            }
            result => result.map_err(|failure| self.failed(failure)),
        }
    }

    /// Waits up to `within` for a wake-up on the channel of `token`: its
    /// payload, when one came (a doubted grant's without its slot and fence).
    /// Without a session listening there, it only sleeps.
    pub fn woken(&mut self, token: &str, within: Duration) -> Result<Option<String>> {
        if !self.listening(token) {
            std::thread::sleep(within);
            return Ok(None);
        }
        let until = Moment::now() + within;
        let channel = format!("{CHANNEL_PREFIX}{token}");
        let session = self.session.as_mut().expect("a listening session");
        let woken = loop {
            let notification = match session.notification(until.remaining()) {
                Ok(Some(notification)) => notification,
                other => break other.map(|_| None),
            };
            let doubted = self.doubted > 0;
            self.doubted = self.doubted.saturating_sub(1);
            if notification.channel() != channel {
                // For another name of this run, whose acquisition is over.
                continue;
            }
            let payload = notification.payload();
            // A doubted grant says no slot: it is claimed, which a lapsed one fails.
            break Ok(Some(if doubted && payload.starts_with(GRANTED) {
                GRANTED.to_owned()
            } else {
                payload.to_owned()
            }));
        };
        woken.map_err(|failure| self.failed(failure))
    }

    /// The session, connected within `within` (and the target's
    /// `connect_timeout` for each address), the schema checked on the first one.
    fn session(&mut self, within: Duration) -> Result<&mut Session> {
        if self.is_broken() {
            self.disconnect();
        }
        if self.session.is_none() {
            let deadline = Deadline::after(within);
            let mut session = self.connector.connect(within)?;
            self.wake_ready = None;
            if !self.looked {
                let left = deadline.remaining();
                self.tables = create_or_check(&mut session, &self.schema, self.create, left)?;
                self.looked = true;
            }
            self.session = Some(session);
        }
        Ok(self.session.as_mut().expect("connected above"))
    }

    fn is_broken(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|session| !session.is_usable())
    }

    /// lockrun's error for `failure`; a session it broke is let go.
    fn failed(&mut self, failure: Failure) -> crate::error::Error {
        if self.is_broken() {
            self.disconnect();
        }
        failure.into()
    }
}
