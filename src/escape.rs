//! Text from outside lockrun made safe for one line of a terminal (README:
//! "Who holds a lock"). A leaf: it imports nothing of the crate, so that the error type
//! and the report can both use it.

/// `text` with its control characters escaped (`\n`, `\u{1b}`): text taken
/// from a store (a name, a host, a command line) may hold anything, and must
/// neither split a line nor reach a terminal as an escape sequence.
pub fn escape_controls(text: &str) -> String {
    text.chars()
        .fold(String::with_capacity(text.len()), |mut out, c| {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_controls("a\nb\u{1b}[2Jé"), "a\\nb\\u{1b}[2Jé");
    }
}
