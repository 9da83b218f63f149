//! What can go wrong talking to etcd, sorted into the network layer's kinds
//! (docs/guide.md: "When the server has trouble"), with etcd's own code kept for the
//! answers the backend acts on (a lease that is gone).

use std::{fmt, io};

use super::wire::ErrorBody;
use crate::backend::net::{Failure, Kind};

/// A failed call. Its text names endpoints only in their redacted form and
/// never holds a password or an auth token.
#[derive(Clone, Debug)]
pub struct Error {
    failure: Failure,
    /// etcd's gRPC status code, when the cluster answered with an error.
    code: Option<i32>,
}

impl Error {
    pub(super) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            failure: Failure::new(kind, message),
            code: None,
        }
    }

    /// A failure that no retry mends (a store of a newer lockrun).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(Kind::Permanent, message)
    }

    pub(super) fn with_code(mut self, code: i32) -> Self {
        self.code = Some(code);
        self
    }

    pub fn kind(&self) -> Kind {
        self.failure.kind()
    }

    /// etcd ended a watch itself (its revisions were compacted): a new look
    /// and a new watch are what it calls for.
    pub fn watch_cancelled(&self) -> bool {
        self.code == Some(code::CANCELLED)
    }

    /// The cluster answered that a lease is gone: expired or revoked (and so
    /// are its keys), or never granted.
    pub fn lease_not_found(&self) -> bool {
        self.code == Some(code::NOT_FOUND)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.failure.fmt(f)
    }
}

impl std::error::Error for Error {}

impl From<Error> for crate::error::Error {
    fn from(err: Error) -> Self {
        err.failure.into()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// gRPC status codes that etcd answers with.
pub(super) mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// What an error answer from etcd calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Remedy {
    /// Try another member, or later.
    Transient,
    /// The auth token expired or predates a change of users: authenticate again.
    StaleToken,
    Refused,
    Rejected,
}

/// Sorts an etcd error answer by its code and, where etcd's own client does
/// the same, by its message (etcd's errors are fixed strings).
pub(super) fn judge(code: i32, message: &str) -> Remedy {
    if message.contains("invalid auth token") || message.contains("revision of auth store is old") {
        return Remedy::StaleToken;
    }
    match code {
        code::CANCELLED
        | code::UNKNOWN
        | code::DEADLINE_EXCEEDED
        | code::RESOURCE_EXHAUSTED
        | code::ABORTED
        | code::UNAVAILABLE => Remedy::Transient,
        code::PERMISSION_DENIED | code::UNAUTHENTICATED => Remedy::Refused,
        code::INVALID_ARGUMENT
            if message.contains("authentication failed") || message.contains("user name") =>
        {
            Remedy::Refused
        }
        _ => Remedy::Rejected,
    }
}

/// Why one attempt on one member failed.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// The member could not be reached, or did not answer as etcd's gateway does.
    Io(io::Error),
    /// The member answered with an error.
    Answer { code: i32, message: String },
    /// The member is a server of another kind (docs/guide.md: "When the server has trouble").
    Foreign(String),
}

impl From<io::Error> for AttemptError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

impl AttemptError {
    /// The failure behind an answer that is not 200 OK.
    pub(super) fn from_reply(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(answer) => {
                let status = answer.into_status();
                Self::Answer {
                    code: status.code,
                    message: status.message,
                }
            }
            Err(_) => Self::Io(not_etcd(format!("HTTP status {status}"))),
        }
    }

    pub(super) fn verdict(&self) -> Remedy {
        match self {
            Self::Io(_) => Remedy::Transient,
            Self::Answer { code, message } => judge(*code, message),
            Self::Foreign(_) => Remedy::Refused,
        }
    }

    /// The failure as an error of `kind`, its text prefixed with `context`.
    pub(super) fn into_error(self, kind: Kind, context: &str) -> Error {
        let error = Error::new(kind, format!("{context}: {self}"));
        match self {
            Self::Answer { code, .. } => error.with_code(code),
            Self::Io(_) | Self::Foreign(_) => error,
        }
    }
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(err) => Failure::from_io(err).fmt(f),
            Self::Answer { message, .. } | Self::Foreign(message) => f.write_str(message),
        }
    }
}

impl Remedy {
    /// The kind of error this verdict leaves the caller with: a refusal or
    /// a rejected request is no trouble that waiting could fix.
    pub(super) fn kind(self) -> Kind {
        match self {
            Self::Transient => Kind::Transient,
            Self::StaleToken | Self::Refused | Self::Rejected => Kind::Permanent,
        }
    }
}

/// The error for an answer that etcd's gateway would not give.
pub(super) fn not_etcd(why: impl fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an etcd v3 gateway: {why}"),
    )
}

/// What one call has heard from the members, round after round over them:
/// whether another round is worth it and, at the end, the error to report.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// This round's failures, as "member: failure".
    round: Vec<String>,
    /// This round's latest answer, as "member: answer".
    answer: Option<String>,
    /// A member did not answer in time this round.
    silent: bool,
    /// This round's failures that no retry can fix (an unknown host, a
    /// certificate that does not verify).
    hopeless: usize,
    /// The latest answer of an earlier round: a member that answered was
    /// reached, so a last round cut short by the deadline does not make the
    /// cluster unreachable, and its answer says more than a timeout.
    earlier_answer: Option<String>,
}

impl Tally {
    pub(super) fn add(&mut self, member: &str, failure: &AttemptError) {
        let said = format!("{member}: {failure}");
        match failure {
            AttemptError::Answer { .. } | AttemptError::Foreign(_) => {
                self.answer = Some(said.clone());
            }
            AttemptError::Io(err) => {
                self.silent |= err.kind() == io::ErrorKind::TimedOut;
                self.hopeless += usize::from(Failure::from_io(err).kind() == Kind::Permanent);
            }
        }
        self.round.push(said);
    }

    /// Another round may succeed: a member answered (an election may end)
    /// or was slow; not when every member refused the connection.
    pub(super) fn worth_another_round(&self) -> bool {
        self.answer.is_some() || self.silent
    }

    pub(super) fn next_round(&mut self) {
        self.earlier_answer = self.answer.take().or(self.earlier_answer.take());
        self.round.clear();
        self.silent = false;
        self.hopeless = 0;
    }

    /// The call's error: transient once any member has answered, permanent
    /// when no member could ever be reached, else unreachable.
    pub(super) fn into_error(self, what: &str) -> Error {
        let before = match (&self.answer, &self.earlier_answer) {
            (None, Some(answer)) => format!(" (before that, {answer})"),
            _ => String::new(),
        };
        let kind = if self.answer.is_some() || self.earlier_answer.is_some() {
            Kind::Transient
        } else if self.hopeless == self.round.len() {
            Kind::Permanent
        } else {
            Kind::Unreachable
        };
        Error::new(
            kind,
            format!("etcd: {what} failed: {}{before}", self.round.join("; ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBER: &str = "http://127.0.0.1:2379";

    fn no_leader() -> AttemptError {
        AttemptError::Answer {
            code: code::UNAVAILABLE,
            message: "etcdserver: no leader".into(),
        }
    }

    fn silence() -> AttemptError {
        AttemptError::Io(io::ErrorKind::TimedOut.into())
    }

    #[test]
    fn a_member_that_answered_before_a_last_round_cut_short_leaves_the_trouble_transient() {
        let mut tally = Tally::default();
        tally.add(MEMBER, &no_leader());
        tally.add("http://127.0.0.1:2381", &silence());
        assert!(tally.worth_another_round());
        tally.next_round();
        tally.add(MEMBER, &silence());
        let err = tally.into_error("range");
        assert_eq!(err.kind(), Kind::Transient, "{err}");
        assert_eq!(
            err.to_string(),
            "etcd: range failed: http://127.0.0.1:2379: no answer in time \
             (before that, http://127.0.0.1:2379: etcdserver: no leader)"
        );
    }

    #[test]
    fn members_never_reached_leave_the_cluster_unreachable() {
        let mut tally = Tally::default();
        tally.add(MEMBER, &silence());
        tally.next_round();
        tally.add(
            MEMBER,
            &AttemptError::Io(io::ErrorKind::ConnectionRefused.into()),
        );
        assert!(!tally.worth_another_round());
        let err = tally.into_error("range");
        assert_eq!(err.kind(), Kind::Unreachable, "{err}");
        assert_eq!(
            err.to_string(),
            "etcd: range failed: http://127.0.0.1:2379: connection refused"
        );
    }
}
