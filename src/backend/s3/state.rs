//! A name's state object (docs/backends/s3.md: "S3 backend"): one JSON document that holds
//! everything about the name, so that one compare-and-swap decides every
//! change. It carries its format version, a sequence number and a fresh nonce
//! per write (two writes never have the same body, hence never the same
//! ETag), the fence counter, the slots and the waiting line. Every entry has
//! a heartbeat counter its owner bumps and the TTL it asked for: whoever sees
//! a counter unchanged for that long on its own clock may drop the entry.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::backend::record::{HolderRecord, WaiterRecord};
use crate::backend::{Entry, Mode, Owner, newer_format};
use crate::error::Error;
use crate::escape::escape_controls;

/// The format this lockrun writes; a newer one is refused (69), not misread.
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub seq: u64,
    pub nonce: String,
    /// The last fence given out for this name.
    pub fence: u64,
    #[serde(default)]
    pub holders: Vec<Holder>,
    /// The waiting line, first come first.
    #[serde(default)]
    pub line: Vec<Waiter>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Holder {
    pub slot: u32,
    #[serde(flatten)]
    pub record: HolderRecord,
    pub beat: u64,
    /// How long the holder may stay silent (its TTL, or for a slot kept by
    /// `--min-hold` what was left of the keep), in milliseconds.
    pub ttl_ms: u64,
    /// Released with `--min-hold`: no process stands behind it any more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Waiter {
    #[serde(flatten)]
    pub record: WaiterRecord,
    pub beat: u64,
    pub ttl_ms: u64,
}

/// Why an object read is no state document this lockrun can use; `shown`
/// (escaped by the caller) in the message.
#[derive(Debug)]
pub enum Unfit {
    /// No lockrun state object at all: some other file under the prefix.
    NotOurs(String),
    /// A newer lockrun's.
    Newer(String),
}

impl From<Unfit> for Error {
    fn from(unfit: Unfit) -> Self {
        match unfit {
            Unfit::NotOurs(message) | Unfit::Newer(message) => Error::Unavailable(message),
        }
    }
}

impl State {
    /// The document read from the store, refused when it is not one of ours
    /// or of a newer format.
    pub fn parse(body: &[u8], shown: &str) -> Result<Self, Unfit> {
        let state: Self = serde_json::from_slice(body).map_err(|err| {
            // serde quotes some of what it could not read as it is (an unknown
            // variant): text from the store, escaped.
            let why = escape_controls(&err.to_string());
            Unfit::NotOurs(format!("{shown} is not a lockrun state object ({why})"))
        })?;
        if state.format > FORMAT {
            return Err(Unfit::Newer(newer_format(
                shown,
                "object format",
                state.format,
                FORMAT,
            )));
        }
        Ok(state)
    }

    /// The body of the next write: sequence + 1 and a fresh nonce.
    pub fn next_body(&mut self) -> Vec<u8> {
        self.format = FORMAT;
        self.seq += 1;
        self.nonce = nonce();
        serde_json::to_vec(self).expect("a state is plain data that always serializes")
    }

    pub fn holder(&self, token: &str) -> Option<&Holder> {
        self.holders
            .iter()
            .find(|holder| holder.record.owner.token == token)
    }

    pub fn holder_mut(&mut self, token: &str) -> Option<&mut Holder> {
        self.holders
            .iter_mut()
            .find(|holder| holder.record.owner.token == token)
    }

    /// Our place in line, from 0.
    pub fn place_of(&self, token: &str) -> Option<usize> {
        self.line
            .iter()
            .position(|waiter| waiter.record.owner.token == token)
    }

    /// Takes `token`'s waiter out of the line, as it becomes a holder; the
    /// beat that holder starts with. It is one past the waiter's, so that an
    /// observer that saw the waiter (heartbeats are kept by token) counts the
    /// holder's silence from the take, not from when the waiter last beat.
    pub fn leave_line(&mut self, token: &str) -> u64 {
        let waited = self.place_of(token).map(|at| self.line.remove(at).beat);
        waited.map_or(0, |beat| beat + 1)
    }

    /// Takes the entries of `token` out (a holder only if not kept); whether any was.
    pub fn drop_owner(&mut self, token: &str) -> bool {
        let before = self.holders.len() + self.line.len();
        self.holders
            .retain(|holder| holder.kept || holder.record.owner.token != token);
        self.line
            .retain(|waiter| waiter.record.owner.token != token);
        before != self.holders.len() + self.line.len()
    }

    /// The lowest slot number below `capacity` that no holder has.
    pub fn lowest_free(&self, capacity: u32) -> Option<u32> {
        (0..capacity).find(|slot| self.holders.iter().all(|holder| holder.slot != *slot))
    }

    pub fn holder_modes(&self) -> impl Iterator<Item = Mode> + '_ {
        self.holders.iter().map(|holder| holder.record.owner.mode)
    }

    /// Every owner with its heartbeat and silence allowance.
    pub fn beats(&self) -> impl Iterator<Item = (&Owner, u64, u64)> + '_ {
        let holders = self
            .holders
            .iter()
            .map(|holder| (&holder.record.owner, holder.beat, holder.ttl_ms));
        let waiters = self
            .line
            .iter()
            .map(|waiter| (&waiter.record.owner, waiter.beat, waiter.ttl_ms));
        holders.chain(waiters)
    }

    /// The holders, as `status` lists them (not those whose processes are
    /// known to be gone); `expires_at` at the latest (a fresh observer's
    /// view: one TTL from now).
    pub fn holder_entries(&self, now_ms: u64) -> impl Iterator<Item = Entry> + '_ {
        let live = |holder: &&Holder| holder.kept || !holder.record.owner.process.is_gone();
        self.holders.iter().filter(live).map(move |holder| {
            let entry = holder.record.entry(holder.slot);
            match holder.record.kept_until {
                Some(_) => entry,
                None => entry.expiring(Some(now_ms + holder.ttl_ms)),
            }
        })
    }
}

/// 16 random bytes in hex.
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the kernel's random numbers");
    bytes.iter().fold(String::new(), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_has_its_own_body_and_newer_formats_are_refused() {
        let mut state = State::default();
        let first = state.next_body();
        let second = state.next_body();
        assert_ne!(first, second);
        let read = State::parse(&second, "x").unwrap();
        assert_eq!((read.format, read.seq), (FORMAT, 2));
        let newer = br#"{"format": 99, "seq": 1, "nonce": "n", "fence": 0}"#;
        let err = Error::from(State::parse(newer, "s3://b/n.lock.json").unwrap_err());
        assert_eq!(err.exit_code(), 69);
        assert!(err.to_string().contains("newer lockrun"), "{err}");
        assert!(State::parse(b"<html>", "x").is_err());
    }
}
