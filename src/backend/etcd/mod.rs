//! The etcd backend (docs/backends/etcd.md: "etcd backend"): etcd's own lock recipe on the
//! seam. Each waiter and holder has a lease and a place in line, a key
//! attached to that lease whose create revision orders the line; the oldest
//! places that the rule lets in hold the slots (the N oldest with `-p N`, or
//! the sharers up to the first exclusive run: `look`), each taking a slot
//! key of its own, and a waiter watches what must change for it to move up
//! ([`watching`]).

mod keys;
pub mod link;
mod look;
mod recipe;
mod slot;
mod waiter;
mod watching;

/// The format of the keys under the prefix (`/PREFIX/.format/N`); a newer one is refused.
pub const FORMAT: super::Format = super::Format {
    backend: "etcd",
    kind: "key format",
    writes: keys::FORMAT,
    reads_from: 1,
};

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::SystemTime;

use super::record::{HolderRecord, sort, waiting};
use super::{Abilities, Attempt, Common, Entry, Owner, Request, Store, Waited, Wakeup};
use crate::error::{Error, Result};
use crate::identity::epoch_millis;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::timing::FREE_CALL;
use keys::NameKeys;
use link::{Client, Endpoints};
use look::{Holding, LineView, Record};
use waiter::Waiter;

/// Its command-line options (a group of their own is not needed: clap flattens them).
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Options {
    /// etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS
    #[arg(
        long,
        env = "LOCKRUN_ETCD_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_name = "URL,...",
        hide_env_values = true
    )]
    pub etcd_endpoints: String,
}

impl Options {
    pub fn open(&self, common: &Common) -> Result<Box<dyn Store>> {
        let endpoints = Endpoints::parse(&self.etcd_endpoints)?;
        let location = format!("etcd at {endpoints}");
        let client = Rc::new(RefCell::new(Client::new(endpoints)));
        Ok(Box::new(EtcdStore {
            waiter: Waiter::new(Rc::clone(&client)),
            client,
            prefix: common.prefix.to_owned(),
            location,
        }))
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("records are plain data that always serialize")
}

struct EtcdStore {
    client: Rc<RefCell<Client>>,
    prefix: String,
    /// The endpoints, passwords redacted.
    location: String,
    waiter: Waiter,
}

impl EtcdStore {
    /// The holders, then (with `waiters`) the waiters in line order, of `name`
    /// or of every name, with when each one's lease ends: a call per entry.
    fn entries(&mut self, name: Option<&Name>, waiters: bool) -> Result<Vec<Entry>> {
        let mut client = self.client.borrow_mut();
        let range = match name {
            Some(name) => NameKeys::new(&self.prefix, name).all(),
            None => keys::every_name(&self.prefix),
        };
        let listing = client.range(&range, FREE_CALL)?;
        // Each name's keys, in create order.
        let mut names: BTreeMap<NameKeys, link::Listing> = BTreeMap::new();
        for kv in listing.kvs {
            if let Some(keys) = keys::owner_of(&self.prefix, &kv.key) {
                names
                    .entry(keys)
                    .or_insert_with(|| link::Listing {
                        kvs: Vec::new(),
                        revision: listing.revision,
                    })
                    .kvs
                    .push(kv);
            }
        }
        let now = now_millis();
        let mut entries = Vec::new();
        for (keys, listing) in names {
            let look = LineView::new(&keys, listing);
            // When each place's lease ends; one gone since the range took the place with it.
            let mut ends = HashMap::new();
            for place in look.places.iter().filter(|place| waiters || place.holds()) {
                if let Some(left) = client.lease_time_to_live(place.lease, FREE_CALL)? {
                    ends.insert(place.lease, now + left.as_millis() as u64);
                }
            }
            let end = |lease: i64| ends.get(&lease).copied();
            entries.extend(
                look.holders()
                    .filter_map(|(entry, lease)| Some(entry.expiring(Some(end(lease)?)))),
            );
            if !waiters {
                continue;
            }
            entries.extend(waiting(look.waiters().filter_map(|(waiter, lease)| {
                Some((
                    waiter.name.as_str(),
                    &waiter.owner,
                    waiter.since,
                    Some(end(lease)?),
                ))
            })));
        }
        sort(&mut entries);
        Ok(entries)
    }
}

impl Store for EtcdStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn abilities(&self) -> Abilities {
        Abilities {
            wakeup: Wakeup::Watches,
            ..Abilities::LEASES_THAT_TELL
        }
    }

    fn attempt(&mut self, request: &Request) -> Result<Attempt> {
        let keys = NameKeys::new(&self.prefix, &request.name);
        Ok(self.waiter.attempt(&keys, request)?)
    }

    fn evict(&mut self, request: &Request, owners: &[Owner]) -> Result<()> {
        let within = FREE_CALL;
        let keys = NameKeys::new(&self.prefix, &request.name);
        let mut client = self.client.borrow_mut();
        let look = LineView::new(&keys, client.range(&keys.all(), within)?);
        // Revoking a dead owner's lease deletes its place and slot at once;
        // a place kept by --min-hold has no process to judge by.
        for place in look.places.iter().filter(|place| !place.kept()) {
            if place
                .owner()
                .is_some_and(|owner| owners.iter().any(|dead| dead.token == owner.token))
            {
                client.lease_revoke(place.lease, within)?;
            }
        }
        Ok(())
    }

    fn wait(&mut self, _request: &Request, until: Moment) -> Result<Waited> {
        Ok(Waited::told(self.waiter.wait(until)?))
    }

    fn leave(&mut self, _request: &Request) -> Result<()> {
        Ok(self.waiter.leave(FREE_CALL)?)
    }

    fn list(&mut self, name: Option<&Name>) -> Result<Vec<Entry>> {
        self.entries(name, true)
    }

    fn holders(&mut self, name: &Name) -> Result<Vec<Entry>> {
        self.entries(Some(name), false)
    }

    fn break_slots(&mut self, name: &Name, slot: Option<u32>) -> Result<Vec<Entry>> {
        let keys = NameKeys::new(&self.prefix, name);
        let mut client = self.client.borrow_mut();
        // Keys of a newer lockrun are left alone (docs/operating.md: "Upgrading").
        let format = keys.format();
        if let Some(newer) = client.range(&format.newer(), FREE_CALL)?.kvs.first() {
            return Err(Error::Unavailable(format.refusal(&newer.key)));
        }
        let look = LineView::new(&keys, client.range(&keys.all(), FREE_CALL)?);
        let mut broken = Vec::new();
        for place in &look.places {
            let Some(Record::Holding(holding)) = place.record() else {
                continue;
            };
            if slot.is_none_or(|slot| slot == holding.slot)
                && client.lease_revoke(place.lease, FREE_CALL)?
            {
                broken.push(
                    holding
                        .holder
                        .entry(holding.slot)
                        .fenced(place.revision as u64),
                );
            }
        }
        Ok(broken)
    }
}

/// Our record as the holder of `slot`.
fn holding(request: &Request, slot: u32) -> Holding {
    Holding {
        slot,
        holder: HolderRecord {
            name: request.name.to_string(),
            owner: request.owner.clone(),
            acquired_at: now_millis(),
            fence: 0,
            kept_until: None,
            kept_on: None,
        },
    }
}

fn now_millis() -> u64 {
    epoch_millis(SystemTime::now())
}
