//! A password or token: shown by no `Debug` and no message. Text that came
//! from a server or a library passes through [`Secret::scrub`] before it is shown.

use std::fmt;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the wire only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with the secret, as given and as a URL would carry it, replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_owned();
        }
        let encoded = utf8_percent_encode(&self.0, NON_ALPHANUMERIC).to_string();
        text.replace(&self.0, "***").replace(&encoded, "***")
    }

    /// [`Secret::scrub`] when there is a secret.
    pub fn scrub_with(secret: Option<&Self>, text: &str) -> String {
        secret.map_or_else(|| text.to_owned(), |secret| secret.scrub(text))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neither_debug_nor_scrubbed_text_shows_it() {
        let secret = Secret::new("p@ss/word");
        assert_eq!(format!("{secret:?}"), "***");
        assert_eq!(
            secret.scrub("auth p@ss/word failed for p%40ss%2Fword"),
            "auth *** failed for ***"
        );
        assert_eq!(Secret::new("").scrub("text"), "text");
    }
}
