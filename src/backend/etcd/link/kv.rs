//! What the client asks of etcd's key-value store: ranges read oldest first
//! (by create revision: the waiting line's order) and transactions, which
//! check conditions and then put, read or run a nested transaction, all at
//! one revision.

use super::wire::{
    Compare, CompareValue, KeyValue, Keys, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// The keys a range found, oldest first, and the revision it read them at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    /// The store's revision when it was read: a watch from one past it misses nothing.
    pub revision: i64,
}

/// One step of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    /// Puts a key, attached to a lease (0: none).
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    /// Reads every key of a range, oldest first; its listing is in the outcome.
    Range(Keys),
    /// Reads the keys of a range created at this revision or before, oldest first.
    RangeUpTo(Keys, i64),
    /// Runs a transaction inside this one.
    Txn(Txn),
}

/// Conditions, then the operations to run when all of them hold and those to
/// run when one does not.
#[derive(Clone, Debug, Default)]
pub struct Txn(TxnRequest);

/// What a transaction did.
#[derive(Clone, Debug)]
pub struct TxnOutcome {
    /// Whether every condition held.
    pub succeeded: bool,
    /// The revision after the transaction.
    pub revision: i64,
    /// The listings of the ranges that ran, in order (not those of nested transactions).
    pub listings: Vec<Listing>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds when the key does not exist, or, for a range, none of its keys does.
    #[must_use]
    pub fn if_absent(self, keys: Keys) -> Self {
        self.when(keys, "CREATE", CompareValue::CreateRevision(0))
    }

    /// Holds when `key` exists and is attached to `lease`.
    #[must_use]
    pub fn if_leased(self, key: &[u8], lease: i64) -> Self {
        self.when(Keys::one(key), "LEASE", CompareValue::GrantedLease(lease))
    }

    #[must_use]
    pub fn then(mut self, op: Op) -> Self {
        self.0.success.push(op.into_request());
        self
    }

    #[must_use]
    pub fn otherwise(mut self, op: Op) -> Self {
        self.0.failure.push(op.into_request());
        self
    }

    pub(super) fn request(&self) -> &TxnRequest {
        &self.0
    }

    fn when(mut self, keys: Keys, target: &'static str, value: CompareValue) -> Self {
        self.0.compare.push(Compare {
            keys,
            target,
            result: "EQUAL",
            value,
        });
        self
    }
}

impl Op {
    pub fn put(key: &[u8], value: &[u8], lease: i64) -> Self {
        Self::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        }
    }

    fn into_request(self) -> RequestOp {
        match self {
            Self::Put { key, value, lease } => RequestOp::Put(PutRequest { key, value, lease }),
            Self::Range(keys) => RequestOp::Range(RangeRequest::oldest_first(keys)),
            Self::RangeUpTo(keys, revision) => RequestOp::Range(RangeRequest {
                max_create_revision: revision,
                ..RangeRequest::oldest_first(keys)
            }),
            Self::Txn(txn) => RequestOp::Txn(txn.0),
        }
    }
}
