//! Where a word of the command line carries a password, so that lockrun can
//! blank it in its own argv once the line is read, as curl and mysql do
//! (docs/operating.md: "Passwords"): `ps` shows every user every process's arguments.

use std::ops::Range;

/// The byte ranges of `word` that are passwords: the password of each
/// `scheme://user:password@host` in it (a URL, or each URL of a list), and
/// the value of each `password=` (a conninfo string, a URL's query).
pub fn spans(word: &[u8]) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    // Each URL of a list; a Sentinel or Cluster URL's hosts after the first
    // are pieces of their own, without a password.
    let mut piece_start = 0;
    for piece in word.split(|&byte| byte == b',') {
        if let Some(scheme_end) = find(piece, b"://") {
            let start = scheme_end + 3;
            let end = piece[start..]
                .iter()
                .position(|byte| b"/?#".contains(byte))
                .map_or(piece.len(), |offset| start + offset);
            let authority = &piece[start..end];
            if let Some(at_sign) = authority.iter().rposition(|&byte| byte == b'@')
                && let Some(colon) = authority[..at_sign].iter().position(|&byte| byte == b':')
                && colon + 1 < at_sign
            {
                let offset = piece_start + start;
                found.push(offset + colon + 1..offset + at_sign);
            }
        }
        piece_start += piece.len() + 1;
    }
    let mut at = 0;
    while let Some(offset) = find(&word[at..], b"password=") {
        let start = at + offset + b"password=".len();
        let end = word[start..]
            .iter()
            .position(|byte| b"&; ".contains(byte))
            .map_or(word.len(), |offset| start + offset);
        if end > start {
            found.push(start..end);
        }
        at = end.max(start);
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blanked(word: &str) -> String {
        let mut bytes = word.as_bytes().to_vec();
        for span in spans(&bytes) {
            bytes[span].fill(b'*');
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn passwords_in_urls_lists_and_conninfo_are_found() {
        assert_eq!(
            blanked("redis://u:hunter2@h:6379/0"),
            "redis://u:*******@h:6379/0"
        );
        assert_eq!(
            blanked("--redis-url=rediss://:pw@h"),
            "--redis-url=rediss://:**@h"
        );
        assert_eq!(
            blanked("redis+sentinel://u:p@a:1,b:2/main"),
            "redis+sentinel://u:*@a:1,b:2/main"
        );
        assert_eq!(
            blanked("http://u:a@a:1,https://v:bb@b:2"),
            "http://u:*@a:1,https://v:**@b:2"
        );
        assert_eq!(
            blanked("postgres://u:s3cret@h/db?sslmode=require&password=x"),
            "postgres://u:******@h/db?sslmode=require&password=*"
        );
        assert_eq!(
            blanked("host=h user=u password=pw dbname=d"),
            "host=h user=u password=** dbname=d"
        );
    }

    #[test]
    fn words_without_passwords_stay_as_they_are() {
        for word in [
            "redis://h:6379",
            "redis://u@h",
            "http://a:1,http://b:2",
            "--name",
            "backup",
            "postgres:///db",
        ] {
            assert_eq!(blanked(word), word);
        }
    }
}
