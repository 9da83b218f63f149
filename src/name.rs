//! Lock names (README: "Usage"): 1 to 200 bytes of UTF-8 without control characters.

use std::fmt::{self, Write};

pub const MAX_LEN: usize = 200;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Name(String);

impl Name {
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("the lock name is empty".into());
        }
        if text.len() > MAX_LEN {
            return Err(format!(
                "the lock name is {} bytes long; at most {MAX_LEN} are allowed",
                text.len()
            ));
        }
        if text.chars().any(char::is_control) {
            return Err("the lock name contains a control character".into());
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A form of the name that is unique to it and safe wherever a name is
    /// used as part of something else: as a file name it can never leave its
    /// directory, and as part of a key or a pattern it can never reach another
    /// name's keys (no `/`, `{`, `}`, `:`, `*`, `?`, `[`). `[A-Za-z0-9_-]` and
    /// inner dots stay, every other byte becomes `%XX`. A stem too long for a
    /// file name keeps its start and ends in `~` and a 128-bit hash of the
    /// whole name (`~` never appears in a short stem).
    pub fn stem(&self) -> String {
        let stem = self.escaped();
        if stem.len() <= MAX_STEM {
            return stem;
        }
        let mut cut = KEPT_PREFIX;
        while let Some(pos) = stem[..cut].rfind('%').filter(|pos| pos + 3 > cut) {
            cut = pos;
        }
        format!("{}~{:032x}", &stem[..cut], fnv1a_128(self.0.as_bytes()))
    }

    fn escaped(&self) -> String {
        let mut stem = String::with_capacity(self.0.len());
        for (i, byte) in self.0.bytes().enumerate() {
            let keep = byte.is_ascii_alphanumeric()
                || byte == b'_'
                || byte == b'-'
                || (byte == b'.' && i > 0);
            if keep {
                stem.push(byte as char);
            } else {
                let _ = write!(stem, "%{byte:02X}");
            }
        }
        stem
    }
}

/// Stems stay well below the 255-byte file-name limit, leaving room for `.N.lock`.
const MAX_STEM: usize = 200;
const KEPT_PREFIX: usize = 160;

pub(crate) fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u128::from(*byte)).wrapping_mul(PRIME)
    })
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_unicode_names() {
        assert!(Name::parse("backup").is_ok());
        assert!(Name::parse("ci/deploy prod").is_ok());
        assert!(Name::parse("sauvegarde-été").is_ok());
        assert!(Name::parse(&"x".repeat(200)).is_ok());
    }

    #[test]
    fn rejects_bad_names() {
        assert!(Name::parse("").is_err());
        assert!(Name::parse(&"x".repeat(201)).is_err());
        assert!(Name::parse("a\nb").is_err());
        assert!(Name::parse("a\u{7f}").is_err());
    }

    #[test]
    fn stems_stay_in_the_directory() {
        let stem = |s: &str| Name::parse(s).unwrap().stem();
        assert_eq!(stem("backup"), "backup");
        assert_eq!(stem("../etc/passwd"), "%2E.%2Fetc%2Fpasswd");
        assert_eq!(stem(".."), "%2E.");
        assert_eq!(stem("a%2F"), "a%252F");
        for name in ["..", ".", "a/b", "/abs", "x/../../y"] {
            let s = stem(name);
            assert!(
                !s.contains('/') && s != ".." && s != "." && !s.starts_with('.'),
                "{name} -> {s}"
            );
        }
    }

    #[test]
    fn long_stems_are_shortened_and_stay_distinct() {
        let a = Name::parse(&"é".repeat(100)).unwrap().stem();
        let b = Name::parse(&format!("{}e", "é".repeat(99))).unwrap().stem();
        assert!(a.len() <= MAX_STEM && b.len() <= MAX_STEM, "{a}");
        assert_ne!(a, b);
        assert!(a.contains('~') && !a.contains('/'));
        assert!(
            !a[..a.find('~').unwrap()].ends_with('%'),
            "no escape is cut in half: {a}"
        );
    }
}
