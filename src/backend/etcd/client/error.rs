//! What can go wrong talking to etcd, sorted the way the backend has to act on it.

use std::{fmt, io};

use super::wire::ErrorBody;

/// How the backend should treat a failure (README: exit status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The endpoint list is malformed: a usage error (64).
    Usage,
    /// No endpoint could be reached or spoke etcd's v3 gateway: unavailable (69)
    /// at first contact, a reason to retry once lockrun has reached etcd.
    Unreachable,
    /// The cluster refuses us: wrong user or password, no permission (69 at once).
    Refused,
    /// An endpoint answered but could not serve the call now (no leader, request
    /// timed out, a member stopping, a watch cut off): retry.
    Transient,
    /// The cluster answered that this request is wrong (a lease or key that does
    /// not exist, a compacted revision): no retry will change that.
    Rejected,
}

/// A failed call. Its text names endpoints only in their redacted form and
/// never holds a password or an auth token.
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// etcd's gRPC status code, when the cluster answered with an error.
    code: Option<i32>,
}

impl Error {
    pub(super) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            code: None,
        }
    }

    pub(super) fn with_code(mut self, code: i32) -> Self {
        self.code = Some(code);
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The cluster answered that a lease is gone: expired or revoked (and so
    /// are its keys), or never granted.
    pub fn lease_not_found(&self) -> bool {
        self.code == Some(code::NOT_FOUND)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

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
pub(super) enum Verdict {
    /// Try another member, or later.
    Transient,
    /// The auth token expired or predates a change of users: authenticate again.
    StaleToken,
    Refused,
    Rejected,
}

/// Sorts an etcd error answer by its code and, where etcd's own client does
/// the same, by its message (etcd's errors are fixed strings).
pub(super) fn judge(code: i32, message: &str) -> Verdict {
    if message.contains("invalid auth token") || message.contains("revision of auth store is old") {
        return Verdict::StaleToken;
    }
    match code {
        code::CANCELLED
        | code::UNKNOWN
        | code::DEADLINE_EXCEEDED
        | code::RESOURCE_EXHAUSTED
        | code::ABORTED
        | code::UNAVAILABLE => Verdict::Transient,
        code::PERMISSION_DENIED | code::UNAUTHENTICATED => Verdict::Refused,
        code::INVALID_ARGUMENT
            if message.contains("authentication failed") || message.contains("user name") =>
        {
            Verdict::Refused
        }
        _ => Verdict::Rejected,
    }
}

/// Why one attempt on one member failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The member could not be reached, or did not answer as etcd's gateway does.
    Io(io::Error),
    /// The member answered with an error.
    Answer { code: i32, message: String },
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

impl Failure {
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

    pub(super) fn verdict(&self) -> Verdict {
        match self {
            Self::Io(_) => Verdict::Transient,
            Self::Answer { code, message } => judge(*code, message),
        }
    }

    /// The failure as an error of `kind`, its text prefixed with `context`.
    pub(super) fn into_error(self, kind: ErrorKind, context: &str) -> Error {
        let error = Error::new(kind, format!("{context}: {self}"));
        match self {
            Self::Answer { code, .. } => error.with_code(code),
            Self::Io(_) => error,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(err) => f.write_str(&describe(err)),
            Self::Answer { message, .. } => f.write_str(message),
        }
    }
}

impl Verdict {
    /// The kind of error this verdict leaves the caller with.
    pub(super) fn kind(self) -> ErrorKind {
        match self {
            Self::Transient => ErrorKind::Transient,
            Self::StaleToken | Self::Refused => ErrorKind::Refused,
            Self::Rejected => ErrorKind::Rejected,
        }
    }
}

/// An I/O failure in words a user can act on.
fn describe(err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "no answer in time".to_owned(),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => "connection closed".to_owned(),
        _ => err.to_string(),
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
    /// The latest answer of an earlier round: a member that answered was
    /// reached, so a last round cut short by the deadline does not make the
    /// cluster unreachable, and its answer says more than a timeout.
    earlier_answer: Option<String>,
}

impl Tally {
    pub(super) fn add(&mut self, member: &str, failure: &Failure) {
        let said = format!("{member}: {failure}");
        match failure {
            Failure::Answer { .. } => self.answer = Some(said.clone()),
            Failure::Io(err) => self.silent |= err.kind() == io::ErrorKind::TimedOut,
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
    }

    /// The call's error: transient once any member has answered, else unreachable.
    pub(super) fn into_error(self, what: &str) -> Error {
        let before = match (&self.answer, &self.earlier_answer) {
            (None, Some(answer)) => format!(" (before that, {answer})"),
            _ => String::new(),
        };
        let kind = if self.answer.is_some() || self.earlier_answer.is_some() {
            ErrorKind::Transient
        } else {
            ErrorKind::Unreachable
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

    fn no_leader() -> Failure {
        Failure::Answer {
            code: code::UNAVAILABLE,
            message: "etcdserver: no leader".into(),
        }
    }

    fn silence() -> Failure {
        Failure::Io(io::ErrorKind::TimedOut.into())
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
        assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
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
            &Failure::Io(io::ErrorKind::ConnectionRefused.into()),
        );
        assert!(!tally.worth_another_round());
        let err = tally.into_error("range");
        assert_eq!(err.kind(), ErrorKind::Unreachable, "{err}");
        assert_eq!(
            err.to_string(),
            "etcd: range failed: http://127.0.0.1:2379: connection refused"
        );
    }
}
