//! Reading a name's state object and changing it by compare-and-swap: read
//! (a conditional GET, 304 when nothing changed since our last read), change
//! locally, PUT `If-Match` the ETag read (`If-None-Match: *` for the first
//! write). A lost swap (412, 409, 404) or a write whose outcome is unknown is
//! followed by a fresh read, and the change is decided again on what it
//! shows: every change is written so that deciding it again after it was
//! applied finds nothing left to do. The observed heartbeats
//! ([`Heartbeats`]) are updated on every read.

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use rand::RngExt;

use super::object::{Condition, Got, ObjectClient, Put};
use super::state::{State, Unfit};
use super::watch::Heartbeats;
use crate::backend::net::{Deadline, Failure, Kind};
use crate::error::Result;
use crate::escape::escape_controls;

/// The longest pause between two tries of a lost swap, before jitter.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A name's object as last read: its ETag and document.
#[derive(Clone)]
pub struct Read {
    pub etag: String,
    pub state: State,
}

/// The bucket, with what this lockrun knows of each name's object.
pub struct Objects {
    pub client: ObjectClient,
    read: HashMap<String, Read>,
    heartbeats: HashMap<String, Heartbeats>,
}

impl Objects {
    pub fn new(client: ObjectClient) -> Self {
        Self {
            client,
            read: HashMap::new(),
            heartbeats: HashMap::new(),
        }
    }

    /// The object at `key` now (`None`: there is none), read anew unless unchanged.
    pub fn read(&mut self, key: &str, deadline: Deadline) -> Result<Option<Read>> {
        Ok(self.read_unless_unfit(key, deadline)??)
    }

    /// [`Objects::read`], with an object that is no state document of ours
    /// left to the caller (the inner `Err`), to refuse or to pass over.
    pub fn read_unless_unfit(
        &mut self,
        key: &str,
        deadline: Deadline,
    ) -> Result<Result<Option<Read>, Unfit>> {
        Ok(self
            .refresh_unless_unfit(key, deadline)?
            .map(|_| self.read.get(key).cloned()))
    }

    /// Reads `key` if it changed since our last read; whether it did.
    pub fn refresh(&mut self, key: &str, deadline: Deadline) -> Result<bool> {
        Ok(self.refresh_unless_unfit(key, deadline)??)
    }

    fn refresh_unless_unfit(
        &mut self,
        key: &str,
        deadline: Deadline,
    ) -> Result<Result<bool, Unfit>> {
        let known = self.read.get(key).map(|read| read.etag.clone());
        let changed = match self.client.get(key, known.as_deref(), deadline)? {
            Got::Unchanged => false,
            Got::Missing => self.read.remove(key).is_some(),
            Got::Found { etag, body } => {
                // A key from a listing may hold anything, an escape sequence too.
                let shown = format!(
                    "{} (key {})",
                    self.client.target().shown,
                    escape_controls(key)
                );
                let state = match State::parse(&body, &shown) {
                    Ok(state) => state,
                    Err(unfit) => return Ok(Err(unfit)),
                };
                self.read.insert(key.to_owned(), Read { etag, state });
                true
            }
        };
        let state = self.read.get(key).map(|read| &read.state);
        self.heartbeats
            .entry(key.to_owned())
            .or_default()
            .observe(state.unwrap_or(&State::default()));
        Ok(Ok(changed))
    }

    /// Changes the object at `key` by compare-and-swap until `decide`, given
    /// the document as read (an empty one when there is none), makes no
    /// change (it returns `false` with its verdict) or its change is written.
    /// `decide` is asked again after every lost swap and unknown outcome.
    pub fn change<T>(
        &mut self,
        key: &str,
        deadline: Deadline,
        mut decide: impl FnMut(&mut State, &Heartbeats) -> Result<(T, bool)>,
    ) -> Result<T> {
        let mut tries = 0u32;
        loop {
            let read = self.read(key, deadline)?;
            let mut state = read
                .as_ref()
                .map(|read| read.state.clone())
                .unwrap_or_default();
            let heartbeats = self.heartbeats.get(key).expect("observed at the read");
            let (verdict, write) = decide(&mut state, heartbeats)?;
            if !write {
                return Ok(verdict);
            }
            let body = state.next_body();
            let condition = match &read {
                Some(read) => Condition::Match(&read.etag),
                None => Condition::Create,
            };
            let last_trouble = match self.client.put(key, &body, condition, deadline)? {
                Put::Written => {
                    // The ETag of what we wrote is unknown (some stores send none): the next read tells.
                    return Ok(verdict);
                }
                Put::Lost => None,
                Put::Unknown(failure) => Some(failure),
            };
            tries += 1;
            if deadline.has_passed() {
                return Err(last_trouble
                    .unwrap_or_else(|| {
                        Failure::new(
                            Kind::Transient,
                            format!(
                                "{}: too many writers at once on {key}",
                                self.client.target().shown
                            ),
                        )
                    })
                    .into());
            }
            // A pause that grows with the tries, jittered, so that contenders spread out.
            let most = (Duration::from_millis(5) * tries).min(MAX_RETRY_PAUSE);
            let pause = rand::rng().random_range(Duration::ZERO..=most);
            thread::sleep(pause.min(deadline.remaining()));
        }
    }
}
