//! The S3 backend (docs/backends/s3.md: "S3 backend"): each name is one state object in a
//! bucket (`PREFIX/NAME.lock.json`, the name escaped), holding the name's
//! slots, waiting line and fence counter, changed only by compare-and-swap
//! ([`swap`]). Holders and waiters bump a heartbeat counter every TTL/3; an
//! entry is dropped by whoever saw its counter unchanged for its TTL on its
//! own clock ([`watch`]). Waiters poll with conditional GETs, the more often
//! the nearer the head of the line ([`poll`]). Before it grants anything, a run
//! checks once that the store honours conditional writes ([`probe`]).

mod credentials;
mod issued;
mod object;
mod poll;
mod probe;
mod slot;
mod state;
mod swap;
mod target;
mod watch;

/// The format of a name's state object; a newer one is refused.
pub const FORMAT: super::Format = super::Format {
    backend: "s3",
    kind: "object format",
    writes: state::FORMAT,
    reads_from: 1,
};

use std::cell::RefCell;
use std::rc::Rc;
use std::thread;
use std::time::{Duration, SystemTime};

use super::record::{Ahead, HolderRecord, Places, WaiterRecord, line, sort, waiting};
use super::{
    Abilities, Attempt, Common, Entry, Line, Owner, Request, Store, Waited, Wakeup, refuses,
};
use crate::backend::net::Deadline;
use crate::duration::millis;
use crate::error::Result;
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::timing::FREE_CALL;
use object::ObjectClient;
use slot::S3Slot;
use state::{Holder, State, Unfit, Waiter};
use swap::Objects;
use target::Target;

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    #[arg(
        long,
        env = "LOCKRUN_S3_URL",
        value_name = "URL",
        help = "The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]"
    )]
    pub s3_url: Option<String>,

    #[arg(
        long,
        value_name = "URL",
        help = "An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]"
    )]
    pub s3_endpoint: Option<String>,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        self.open_with(common, &|name| std::env::var(name).ok())
    }

    /// [`Options::open`], reading the AWS variables from `env` instead of
    /// the process's environment: public for the integration tests, whose
    /// threads cannot safely change the environment they share.
    pub fn open_with(&self, _common: &Common, env: credentials::Env) -> Result<Box<dyn Store>> {
        let Some(url) = &self.s3_url else {
            return Err(crate::error::Error::Usage(
                "-b s3 needs --s3-url s3://BUCKET[/PREFIX] (or LOCKRUN_S3_URL)".to_owned(),
            ));
        };
        let endpoint = self
            .s3_endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3").filter(|value| !value.is_empty()))
            .or_else(|| env("AWS_ENDPOINT_URL").filter(|value| !value.is_empty()));
        let region = credentials::region(env);
        let target = Target::parse(url, endpoint.as_deref(), &region)?;
        let (credentials, vars) =
            credentials::find_noting(env, &region, Deadline::after(FREE_CALL))?;
        let location = format!(
            "S3 bucket {} (credentials from {})",
            target.shown, credentials.source
        );
        Ok(Box::new(S3Store {
            objects: Rc::new(RefCell::new(Objects::new(ObjectClient::new(
                target,
                credentials,
                vars,
                region,
            )))),
            location,
            probed: false,
            beat_due: None,
            take_sent: None,
            poll: poll::Schedule::default(),
            position: 0,
        }))
    }
}

struct S3Store {
    objects: Rc<RefCell<Objects>>,
    location: String,
    /// Whether this run has seen the store honour conditional writes.
    probed: bool,
    /// When our place in line must next show a new heartbeat.
    beat_due: Option<Moment>,
    /// When a write that could have given us a slot was sent by a look that
    /// ended in trouble before it learnt whether it did: the lease runs from
    /// no earlier, should a later look find the slot ours.
    take_sent: Option<Moment>,
    /// When a wait polls next.
    poll: poll::Schedule,
    /// Our place in line at the last look (0: not in line).
    position: u32,
}

/// What one look decided.
enum Look {
    /// The slot is ours already (a write whose answer we missed took it).
    Taken(Holder),
    /// The slot is ours once this look's write is made.
    Took(Holder),
    Waiting(Line),
}

/// One look at `state`, changed as the look decides: silent entries
/// dropped, and then a slot taken if the line lets us, else our place
/// taken (with `request.queue`) or our heartbeat bumped (when `beat_due`).
/// Whether it changed anything.
fn look_at(
    state: &mut State,
    heartbeats: &watch::Heartbeats,
    request: &Request,
    beat_due: bool,
) -> (Look, bool) {
    let token = &request.owner.token;
    let dropped = heartbeats.drop_silent(state, token);
    if let Some(holder) = state.holder(token) {
        return (Look::Taken(holder.clone()), dropped);
    }
    let place = state.place_of(token);
    let ahead = &state.line[..place.unwrap_or(state.line.len())];
    let parallelism = state
        .holders
        .iter()
        .map(|holder| holder.record.owner.parallelism)
        .chain(ahead.iter().map(|waiter| waiter.record.owner.parallelism))
        .find(|&theirs| refuses(theirs, request.parallelism))
        .flatten();
    if let Some(theirs) = parallelism {
        return (Look::Waiting(Line::refused(theirs)), dropped);
    }
    let modes = ahead.iter().map(|waiter| waiter.record.owner.mode);
    let free = state.lowest_free(request.capacity());
    if let Some(slot) = free.filter(|_| request.admitted(state.holder_modes(), modes)) {
        let beat = state.leave_line(token);
        state.fence += 1;
        let holder = Holder {
            slot,
            record: HolderRecord {
                name: request.name.to_string(),
                owner: request.owner.clone(),
                acquired_at: now_millis(),
                fence: state.fence,
                kept_until: None,
                kept_on: None,
            },
            beat,
            ttl_ms: millis(lease_ttl(request)),
            kept: false,
        };
        state.holders.push(holder.clone());
        return (Look::Took(holder), true);
    }
    let mut write = dropped;
    match place {
        Some(at) if beat_due => {
            state.line[at].beat += 1;
            write = true;
        }
        None if request.queue => {
            state.line.push(Waiter {
                record: WaiterRecord {
                    name: request.name.to_string(),
                    owner: request.owner.clone(),
                    since: now_millis(),
                },
                beat: 0,
                ttl_ms: millis(lease_ttl(request)),
            });
            write = true;
        }
        _ => {}
    }
    (
        Look::Waiting(where_we_stand(state, heartbeats, request)),
        write,
    )
}

impl S3Store {
    fn key(&self, name: &Name) -> String {
        object_key(&self.objects.borrow().client.target().prefix, name)
    }

    /// The slot `holder` is ours; the write that took it was sent at `sent`
    /// (by this look) or before (by one whose outcome was not learnt).
    fn slot(
        &mut self,
        request: &Request,
        key: String,
        holder: &Holder,
        sent: Option<Moment>,
    ) -> Attempt {
        let taken_at = [self.take_sent.take(), sent]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Moment::now() - request.plan.renew_every());
        self.beat_due = None;
        Attempt::Taken(Box::new(S3Slot {
            objects: Rc::clone(&self.objects),
            key,
            token: request.owner.token.clone(),
            number: holder.slot,
            fence: holder.record.fence,
            ttl: lease_ttl(request),
            taken_at,
        }))
    }
}

impl Store for S3Store {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn abilities(&self) -> Abilities {
        Abilities {
            // A conditional GET sees every change since the last look: none is lost.
            wakeup: Wakeup::Watches,
            ..Abilities::LEASES_THAT_TELL
        }
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let deadline = Deadline::after(FREE_CALL);
        if !self.probed {
            probe::refuse_unsafe(&mut self.objects.borrow_mut(), deadline)?;
            self.probed = true;
        }
        let key = self.key(&request.name);
        let beat_due = self.beat_due.is_none_or(Moment::has_passed);
        let mut sent = None;
        let look = self
            .objects
            .borrow_mut()
            .change(&key, deadline, |state, seen| {
                let (look, write) = look_at(state, seen.heartbeats, request, beat_due);
                if matches!(look, Look::Took(_)) {
                    sent.get_or_insert_with(Moment::now);
                }
                Ok((look, write))
            });
        let look = match look {
            Ok(look) => look,
            Err(err) => {
                self.take_sent = [self.take_sent, sent].into_iter().flatten().min();
                return Err(err);
            }
        };
        match look {
            Look::Taken(holder) | Look::Took(holder) => Ok(self.slot(request, key, &holder, sent)),
            Look::Waiting(line) => {
                // The look saw the slot not ours: no earlier write of ours took it.
                self.take_sent = None;
                if line.position != self.position {
                    // A look that found us moved up (our own heartbeat written with it shows
                    // no change to our next poll) starts the polls again from our new place.
                    self.poll = poll::Schedule::default();
                }
                self.position = line.position;
                if beat_due && line.position > 0 {
                    self.beat_due = Some(Moment::now() + request.plan.refresh_place_after(false));
                }
                Ok(Attempt::Waiting(line))
            }
        }
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let key = self.key(&request.name);
        self.objects
            .borrow_mut()
            .change(&key, Deadline::after(FREE_CALL), |state, _| {
                let mut dropped = false;
                for owner in owners {
                    dropped |= state.drop_owner(&owner.token);
                }
                Ok(((), dropped))
            })
    }

    fn wait(&mut self, request: &Request, until: Moment) -> Result<Waited> {
        let key = self.key(&request.name);
        loop {
            let due = self.poll.due(self.position);
            thread::sleep(due.min(until).remaining());
            if !due.has_passed() {
                return Ok(Waited::Quiet);
            }
            let changed = self
                .objects
                .borrow_mut()
                .refresh(&key, Deadline::after(FREE_CALL));
            // A poll that failed counts as one that found nothing new.
            self.poll.polled(
                changed.as_ref().is_ok_and(|&changed| changed),
                self.position,
            );
            if changed? {
                return Ok(Waited::Moved);
            }
        }
    }

    fn leave(&mut self, request: &Request) -> Result<()> {
        let key = self.key(&request.name);
        self.beat_due = None;
        self.objects
            .borrow_mut()
            .change(&key, Deadline::after(FREE_CALL), |state, _| {
                // A slot our unanswered write took goes back too.
                Ok(((), state.drop_owner(&request.owner.token)))
            })
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        let deadline = Deadline::after(FREE_CALL);
        let keys = match name {
            Some(name) => vec![self.key(name)],
            None => self.every_key(deadline)?,
        };
        let now = now_millis();
        let mut entries = Vec::new();
        let mut objects = self.objects.borrow_mut();
        for key in keys {
            let read = match objects.read_unless_unfit(&key, deadline)? {
                Ok(read) => read,
                // Every name listed: another file under the prefix is no lock, and
                // must not hide the others (docs/backends/s3.md: "S3 backend").
                Err(Unfit::NotOurs(_)) if name.is_none() => None,
                Err(unfit) => return Err(unfit.into()),
            };
            let Some(read) = read else {
                continue;
            };
            let state = read.state;
            entries.extend(state.holder_entries(now));
            entries.extend(waiting(state.line.iter().map(|waiter| {
                (
                    waiter.record.name.as_str(),
                    &waiter.record.owner,
                    waiter.record.since,
                    Some(now + waiter.ttl_ms),
                )
            })));
        }
        sort(&mut entries);
        Ok(entries)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let key = self.key(name);
        self.objects
            .borrow_mut()
            .change(&key, Deadline::after(FREE_CALL), |state, _| {
                let (broken, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut state.holders)
                    .into_iter()
                    .partition(|holder| slot.is_none_or(|slot| slot == holder.slot));
                state.holders = kept;
                let entries: Vec<Entry> = broken
                    .iter()
                    .map(|holder| holder.record.entry(holder.slot))
                    .collect();
                let write = !entries.is_empty();
                Ok((entries, write))
            })
    }

    fn check(&mut self) -> Result<Vec<String>> {
        let deadline = Deadline::after(FREE_CALL);
        let mut objects = self.objects.borrow_mut();
        let found = probe::refuse_unsafe(&mut objects, deadline)?;
        Ok(found)
    }
}

impl S3Store {
    /// The keys of every name's state object under the prefix.
    fn every_key(&self, deadline: Deadline) -> Result<Vec<String>> {
        let mut objects = self.objects.borrow_mut();
        let prefix = objects.client.target().prefix.clone();
        let mut keys = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let page = objects.client.list(&prefix, from.as_deref(), deadline)?;
            // A name's object sits right under the prefix; deeper keys are another prefix's.
            keys.extend(page.keys.into_iter().filter(|key| {
                key.strip_prefix(&prefix)
                    .is_some_and(|rest| rest.ends_with(SUFFIX) && !rest.contains('/'))
            }));
            match page.next {
                Some(next) => from = Some(next),
                None => return Ok(keys),
            }
        }
    }
}

/// The end of every state object's key.
const SUFFIX: &str = ".lock.json";

fn object_key(prefix: &str, name: &Name) -> String {
    format!("{prefix}{}{SUFFIX}", name.stem())
}

/// Where we stand in `state`'s line, and when it moves by itself at the latest
/// (when an entry ahead would have been silent for its TTL).
fn where_we_stand(state: &State, heartbeats: &watch::Heartbeats, request: &Request) -> Line {
    let token = &request.owner.token;
    let in_line = state.place_of(token);
    let ahead = &state.line[..in_line.unwrap_or(state.line.len())];
    let mut places = Places::default();
    let places_ahead: Vec<u32> = ahead
        .iter()
        .map(|waiter| places.next(waiter.record.owner.mode))
        .collect();
    let (position, place) = match in_line {
        Some(at) => (at as u32 + 1, places.next(request.mode())),
        None => (0, 0),
    };
    let holders: Vec<Ahead> = state
        .holders
        .iter()
        .map(|holder| Ahead {
            owner: &holder.record.owner,
            kept: holder.kept,
            ends: heartbeats.ends(&holder.record.owner.token, holder.ttl_ms),
        })
        .collect();
    let just_ahead: Vec<Ahead> = ahead
        .iter()
        .zip(places_ahead)
        .filter(|&(_, theirs)| theirs + 1 == place)
        .map(|(waiter, _)| Ahead {
            owner: &waiter.record.owner,
            kept: false,
            ends: heartbeats.ends(&waiter.record.owner.token, waiter.ttl_ms),
        })
        .collect();
    let me = &request.owner.process;
    let nearest_local = ahead
        .iter()
        .rev()
        .map(|waiter| &waiter.record.owner)
        .find(|owner| owner.process.shares_host_with(me));
    let mut line = line(me, position, place, &holders, &just_ahead, nearest_local);
    // Any silent entry ahead, not only the nearest, is dropped by whoever sees it silent long enough.
    let silent = ahead
        .iter()
        .map(|waiter| heartbeats.ends(&waiter.record.owner.token, waiter.ttl_ms))
        .chain(holders.iter().map(|holder| holder.ends))
        .min();
    line.moves_by = line.moves_by.into_iter().chain(silent).min();
    line
}

/// The shortest lease an entry gets on S3 (docs/backends/s3.md: "S3 backend"):
/// a swap is two round trips to an object store, and an observer that saw a
/// beat unchanged for a shorter TTL could drop a live entry whose writes were
/// merely slow.
const MIN_TTL: Duration = Duration::from_secs(2);

/// The TTL an entry of `request` is recorded with: `--ttl`, at least [`MIN_TTL`].
fn lease_ttl(request: &Request) -> Duration {
    request.plan.ttl().max(MIN_TTL)
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Plan;

    #[test]
    fn a_waiter_that_takes_a_slot_starts_a_new_silence() {
        let owner = r#""token":"me","pid":1,"host":"h","command":"c""#;
        let waiting = format!(
            r#"{{"format":1,"seq":1,"nonce":"n","fence":0,
                "line":[{{"name":"n",{owner},"since":0,"beat":0,"ttl_ms":30000}}]}}"#
        );
        let mut state = State::parse(waiting.as_bytes(), "n").unwrap();
        let request = Request {
            name: Name::parse("n").unwrap(),
            parallelism: 1,
            plan: Plan::new(Duration::from_secs(30)),
            owner: serde_json::from_str(&format!("{{{owner}}}")).unwrap(),
            queue: true,
            deadline: None,
        };
        let mut seen = watch::Heartbeats::default();
        seen.observe(&state);
        let saw_waiter = Moment::now();
        while Moment::now() <= saw_waiter {}
        let taken_at = Moment::now();
        let (look, _) = look_at(&mut state, &seen, &request, false);
        assert!(matches!(look, Look::Took(_)));
        seen.observe(&state);
        // An observer that counted from the waiter's beat would drop the holder early.
        assert!(seen.ends("me", 30_000) >= taken_at + Duration::from_secs(30));
    }
}
