//! What went wrong talking to a lock server, sorted by what lockrun does about
//! it (docs/guide.md: "When the server has trouble"): trouble that may pass is ridden
//! out with backoff, from the first contact on; what waiting cannot fix ends
//! lockrun with 69 at once.

use std::fmt;
use std::io;

use crate::error::{Error, Trouble};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Waiting cannot fix it: a bad URL, a host name that does not exist, a
    /// refused password or permission, a TLS verification failure, a store
    /// that is not lockrun's. Exit 69 at once.
    Permanent,
    /// The server could not be reached, or did not answer in time, or the
    /// connection was lost: ridden out (a `retry` with reason `unavailable`).
    Unreachable,
    /// The server answered that it cannot serve now: starting up or shutting
    /// down, no leader, too many clients, a read-only replica, a busy script.
    /// Ridden out (reason `transient-error`).
    Transient,
    /// The server rejected what lockrun sent it: a bug (70).
    Bug,
}

/// A sorted failure, with a one-line message that is safe to show: it names
/// the server only redacted and carries no secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    kind: Kind,
    message: String,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether waiting may fix it.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, Kind::Unreachable | Kind::Transient)
    }

    /// An I/O failure on the way to a server or back, sorted, in words a user can act on.
    pub fn from_io(err: &io::Error) -> Self {
        let (kind, why) = match err.kind() {
            io::ErrorKind::ConnectionRefused => (Kind::Unreachable, "connection refused".into()),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                (Kind::Unreachable, "no answer in time".into())
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected => (Kind::Unreachable, "connection closed".into()),
            _ => Self::sort_text(&err.to_string()),
        };
        Self::new(kind, why)
    }

    /// Sorts a failure that a library reports only as text: an unknown host and
    /// a certificate that does not verify are permanent; anything else on the
    /// way to the server is taken to be trouble that may pass.
    pub fn sort_text(text: &str) -> (Kind, String) {
        if is_unknown_host(text) {
            (Kind::Permanent, format!("unknown host ({text})"))
        } else if is_tls_verification(text) {
            (Kind::Permanent, format!("TLS: {text}"))
        } else {
            (Kind::Unreachable, text.to_owned())
        }
    }
}

/// getaddrinfo(3)'s answers for a name that does not exist (`EAI_NONAME`,
/// `EAI_NODATA`), not its "temporary failure" (`EAI_AGAIN`), which may pass.
fn is_unknown_host(text: &str) -> bool {
    [
        "Name or service not known",
        "No address associated with hostname",
        "nodename nor servname provided",
        "the host name has no address",
    ]
    .iter()
    .any(|answer| text.contains(answer))
}

/// rustls's words for a peer whose certificate or name does not verify.
fn is_tls_verification(text: &str) -> bool {
    ["invalid peer certificate", "certificate verify failed"]
        .iter()
        .any(|answer| text.contains(answer))
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Self {
        match failure.kind {
            Kind::Permanent => Error::Unavailable(failure.message),
            Kind::Unreachable => Error::trouble(Trouble::Unavailable, failure.message),
            Kind::Transient => Error::trouble(Trouble::Transient, failure.message),
            Kind::Bug => Error::Internal(failure.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_host_is_permanent_but_a_resolver_hiccup_passes() {
        let unknown =
            io::Error::other("failed to lookup address information: Name or service not known");
        assert_eq!(Failure::from_io(&unknown).kind(), Kind::Permanent);
        let hiccup = io::Error::other(
            "failed to lookup address information: Temporary failure in name resolution",
        );
        assert!(Failure::from_io(&hiccup).is_transient());
    }

    #[test]
    fn refused_and_silent_servers_are_ridden_out() {
        for kind in [io::ErrorKind::ConnectionRefused, io::ErrorKind::TimedOut] {
            let failure = Failure::from_io(&kind.into());
            assert_eq!(failure.kind(), Kind::Unreachable, "{failure}");
            assert_eq!(Error::from(failure).exit_code(), 69);
        }
    }

    #[test]
    fn a_certificate_that_does_not_verify_is_permanent() {
        let tls = io::Error::new(
            io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let failure = Failure::from_io(&tls);
        assert_eq!(failure.kind(), Kind::Permanent);
        assert!(matches!(Error::from(failure), Error::Unavailable(_)));
    }
}
