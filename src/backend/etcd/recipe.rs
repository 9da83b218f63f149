//! The transactions that change a name's keys. Each is one round trip that
//! reads the name's keys afterwards, so that its outcome is also the next
//! look; each checks what an earlier try of it would have changed, so that
//! the client may send it twice (docs/backends/etcd.md: "etcd backend").

use super::json;
use super::keys::NameKeys;
use super::link::{Keys, Op, Txn};
use super::look::{Holding, Record};

/// Takes slot 0 for the owner of `lease` if the line is empty; else, with
/// `waiting`, puts its place at the end of the line unless it is there. Under
/// a prefix a newer lockrun wrote it changes nothing, and its first listing
/// (of the failure) holds that lockrun's format key; the first claim under a
/// prefix puts our format key. No round trip of its own: the format costs a compare.
pub fn claim(keys: &NameKeys, lease: i64, holding: &Holding, waiting: Option<&Record>) -> Txn {
    let place = keys.place(lease);
    let slot = keys.slot(0);
    let format = keys.format();
    let claim = Txn::new()
        .if_absent(format.newer())
        .if_absent(keys.line())
        .if_absent(Keys::one(&slot))
        .then(Op::Txn(
            Txn::new()
                .if_absent(Keys::one(&format.ours()))
                .then(Op::put(&format.ours(), b"", 0)),
        ))
        .then(Op::put(&place, &json(holding), lease))
        .then(Op::put(&slot, token(holding), lease))
        .then(Op::Range(keys.all()));
    let claim = claim.otherwise(Op::Range(format.newer()));
    let claim = match waiting {
        Some(waiting) => claim.otherwise(Op::Txn(
            Txn::new()
                .if_absent(format.newer())
                .if_absent(Keys::one(&place))
                .then(Op::put(&place, &json(waiting), lease)),
        )),
        None => claim,
    };
    claim.otherwise(Op::Range(keys.all()))
}

/// Takes `holding.slot` if it is free and the place of the owner of `lease`
/// is still on it. The look that let the place in needs no compare: places
/// are only added behind it and deleted ahead of it, and a place's mode never
/// changes, so a place let in stays in; the slot key is what another look
/// can take first.
pub fn take(keys: &NameKeys, lease: i64, holding: &Holding) -> Txn {
    let place = keys.place(lease);
    let slot = keys.slot(holding.slot);
    Txn::new()
        .if_absent(Keys::one(&slot))
        .if_leased(&place, lease)
        .then(Op::put(&slot, token(holding), lease))
        .then(Op::put(&place, &json(holding), lease))
        .then(Op::Range(keys.all()))
        .otherwise(Op::Range(keys.all()))
}

/// Says in the place of the owner of `lease`, if it is still on that lease,
/// that it holds `holding.slot`, which it took by being the oldest place with
/// one slot; its slot key too, unless someone else's is there.
pub fn record(keys: &NameKeys, lease: i64, holding: &Holding) -> Txn {
    let place = keys.place(lease);
    let slot = keys.slot(holding.slot);
    Txn::new()
        .if_leased(&place, lease)
        .then(Op::put(&place, &json(holding), lease))
        .then(Op::Txn(
            Txn::new()
                .if_absent(Keys::one(&slot))
                .then(Op::put(&slot, token(holding), lease)),
        ))
}

/// Moves a holder's place and slot from `lease` to `kept`, keeping the place's
/// create revision (its place in line), if they are still on `lease`.
pub fn keep(keys: &NameKeys, lease: i64, kept: i64, holding: &Holding) -> Txn {
    let place = keys.place(lease);
    Txn::new()
        .if_leased(&place, lease)
        .then(Op::put(&place, &json(holding), kept))
        .then(Op::put(&keys.slot(holding.slot), token(holding), kept))
}

/// A slot key holds its holder's token.
fn token(holding: &Holding) -> &[u8] {
    holding.holder.owner.token.as_bytes()
}
