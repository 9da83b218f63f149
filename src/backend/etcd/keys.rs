//! Key names. A name's keys live under `/PREFIX/STEM/`, where STEM is the
//! name's escaped stem, which holds no `/`: so no name's keys or ranges can
//! reach another name's, and the real name is in every record.
//! - `/PREFIX/STEM/line/LEASE`: a waiter's or holder's place in line, attached
//!   to its lease (LEASE in hex); its create revision orders the line and is
//!   the holder's fence;
//! - `/PREFIX/STEM/slot/N`: slot N taken, attached to its holder's lease, so
//!   that two holders never take one slot;
//! - `/PREFIX/.format/N` (N in ten digits, without lease): the format of the
//!   keys under the prefix, put by the first claim there; no stem starts with a dot.

use super::link::Keys;
use crate::backend::newer_format;
use crate::name::Name;

/// The format of the keys under a prefix, bumped when they change in a way an
/// older lockrun would misread.
pub const FORMAT: u32 = 1;

/// The format keys under a prefix: `/PREFIX/.format/`.
pub struct FormatKeys {
    base: String,
}

impl FormatKeys {
    /// Ours, which the first claim under the prefix puts.
    pub fn ours(&self) -> Vec<u8> {
        format!("{}{FORMAT:010}", self.base).into_bytes()
    }

    /// Those of every newer format: a claim is made only when there are none.
    pub fn newer(&self) -> Keys {
        Keys {
            key: format!("{}{:010}", self.base, FORMAT + 1).into_bytes(),
            range_end: Keys::prefix(self.base.as_bytes()).range_end,
        }
    }

    /// Why the keys are refused, given the newer format key found under [`FormatKeys::newer`].
    pub fn refusal(&self, newer: &[u8]) -> String {
        let found = std::str::from_utf8(newer.strip_prefix(self.base.as_bytes()).unwrap_or(newer))
            .ok()
            .and_then(|found| found.parse::<u64>().ok())
            .map_or_else(|| "unknown".to_owned(), |found| found.to_string());
        let prefix = &self.base[..self.base.len() - ".format/".len()];
        newer_format(
            &format!("the etcd keys under {prefix}"),
            "key format",
            found,
            FORMAT,
        )
    }
}

/// The keys of one name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NameKeys {
    /// `/PREFIX/STEM/`
    base: String,
}

/// What a key under a name's base is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Place,
    Slot(u32),
}

impl NameKeys {
    pub fn new(prefix: &str, name: &Name) -> Self {
        Self {
            base: format!("/{prefix}/{}/", name.stem()),
        }
    }

    /// The format keys of the prefix the name's keys are under.
    pub fn format(&self) -> FormatKeys {
        let stem_at = self.base[..self.base.len() - 1]
            .rfind('/')
            .map_or(0, |at| at + 1);
        FormatKeys {
            base: format!("{}.format/", &self.base[..stem_at]),
        }
    }

    /// Every key of the name: places and slots.
    pub fn all(&self) -> Keys {
        Keys::prefix(self.base.as_bytes())
    }

    /// The waiting line: every place.
    pub fn line(&self) -> Keys {
        Keys::prefix(format!("{}line/", self.base).as_bytes())
    }

    /// The slots taken.
    pub fn slots(&self) -> Keys {
        Keys::prefix(format!("{}slot/", self.base).as_bytes())
    }

    /// The place of the owner of `lease`.
    pub fn place(&self, lease: i64) -> Vec<u8> {
        format!("{}line/{lease:016x}", self.base).into_bytes()
    }

    pub fn slot(&self, slot: u32) -> Vec<u8> {
        format!("{}slot/{slot}", self.base).into_bytes()
    }

    /// What `key` is, if it is one of this name's.
    pub fn kind(&self, key: &[u8]) -> Option<KeyKind> {
        let rest = key.strip_prefix(self.base.as_bytes())?;
        if rest.starts_with(b"line/") {
            return Some(KeyKind::Place);
        }
        let slot = std::str::from_utf8(rest.strip_prefix(b"slot/")?).ok()?;
        slot.parse().ok().map(KeyKind::Slot)
    }
}

/// Every key under `prefix`: the keys of every name.
pub fn every_name(prefix: &str) -> Keys {
    Keys::prefix(format!("/{prefix}/").as_bytes())
}

/// The keys of the name whose key `key` (under `prefix`) is.
pub fn owner_of(prefix: &str, key: &[u8]) -> Option<NameKeys> {
    let rest = key.strip_prefix(format!("/{prefix}/").as_bytes())?;
    let stem = std::str::from_utf8(&rest[..rest.iter().position(|&byte| byte == b'/')?]).ok()?;
    Some(NameKeys {
        base: format!("/{prefix}/{stem}/"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_name_reaches_another_names_keys() {
        let name = Name::parse("nightly/line/x").unwrap();
        let keys = NameKeys::new("app", &name);
        let place = keys.place(0x1f);
        assert_eq!(place, b"/app/nightly%2Fline%2Fx/line/000000000000001f");
        assert_eq!(keys.kind(&place), Some(KeyKind::Place));
        assert_eq!(keys.kind(&keys.slot(3)), Some(KeyKind::Slot(3)));
        let short = NameKeys::new("app", &Name::parse("nightly").unwrap());
        assert_eq!(short.kind(&place), None);
        assert!(!place.starts_with(&short.all().key));
        let of = owner_of("app", &place).unwrap();
        assert_eq!(of.kind(&place), Some(KeyKind::Place));
        assert!(owner_of("ap", &place).is_none());
    }
}
