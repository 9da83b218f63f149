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
use crate::platform::clock::Moment;

/// The longest pause between two tries of a lost swap, before jitter.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long a copy of an object stays likely enough to be current that a
/// swap is tried against it without reading the object first: older copies
/// (a waiter far back in line, a holder at the end of a long run) are mostly
/// out of date, and a lost try would cost a request more than a read.
const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// A name's object as last read: its ETag and document.
#[derive(Clone)]
pub struct Read {
    pub etag: String,
    pub state: State,
    /// When the store last confirmed it: read, found unchanged, or written by us.
    confirmed: Moment,
}

/// What a decision of [`Objects::change`] is given beside the document.
pub struct Seen<'a> {
    /// The heartbeats observed so far.
    pub heartbeats: &'a Heartbeats,
    /// Whether an earlier try of this change ended with its outcome unknown,
    /// so that what the decisions noted still holds: that write may have been
    /// made, even where a later try was lost (to it, perhaps). Until then a
    /// decision notes afresh: a lost try changed nothing.
    pub may_have_written: bool,
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
            Got::Unchanged => {
                if let Some(read) = self.read.get_mut(key) {
                    read.confirmed = Moment::now();
                }
                false
            }
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
                let confirmed = Moment::now();
                let read = Read {
                    etag,
                    state,
                    confirmed,
                };
                self.read.insert(key.to_owned(), read);
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
    /// `decide` is asked again after every lost swap and unknown outcome
    /// ([`Seen::may_have_written`] tells whether one was unknown).
    ///
    /// The first try swaps against the object as this lockrun last knew it
    /// (read, or written with the ETag the store sent back), without reading
    /// it first, where the store confirmed that copy within [`TRUSTED_FOR`]:
    /// a head that just saw the slot freed, or a holder that lets go soon
    /// after its own write, makes one request instead of two. Should it have
    /// changed, the swap is lost and read anew; a verdict of no change is only
    /// given on a fresh read.
    pub fn change<T>(
        &mut self,
        key: &str,
        deadline: Deadline,
        mut decide: impl FnMut(&mut State, Seen) -> Result<(T, bool)>,
    ) -> Result<T> {
        let mut tries = 0u32;
        let mut known = self
            .read
            .get(key)
            .filter(|read| !(read.confirmed + TRUSTED_FOR).has_passed())
            .cloned();
        let mut may_have_written = false;
        loop {
            let fresh = known.is_none();
            let read = match known.take() {
                Some(read) => Some(read),
                None => self.read(key, deadline)?,
            };
            let mut state = read
                .as_ref()
                .map(|read| read.state.clone())
                .unwrap_or_default();
            let heartbeats = self.heartbeats.entry(key.to_owned()).or_default();
            let seen = Seen {
                heartbeats,
                may_have_written,
            };
            let (verdict, write) = decide(&mut state, seen)?;
            if !write {
                if fresh {
                    return Ok(verdict);
                }
                continue;
            }
            let body = state.next_body();
            let condition = match &read {
                Some(read) => Condition::Match(&read.etag),
                None => Condition::Create,
            };
            let last_trouble = match self.client.put(key, &body, condition, deadline)? {
                Put::Written(etag) => {
                    // Without an ETag (some stores send none) the next read tells.
                    match etag {
                        Some(etag) => {
                            let confirmed = Moment::now();
                            let read = Read {
                                etag,
                                state,
                                confirmed,
                            };
                            self.read.insert(key.to_owned(), read)
                        }
                        None => self.read.remove(key),
                    };
                    return Ok(verdict);
                }
                Put::Lost => None,
                Put::Unknown(failure) => Some(failure),
            };
            if last_trouble.is_some() {
                may_have_written = true;
                // Whatever the store holds now, it may be our write: no copy is trusted.
                self.read.remove(key);
            }
            if !fresh {
                // Only our copy was out of date: read it and decide again, at once.
                continue;
            }
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
