//! What went wrong talking to PostgreSQL, sorted by what lockrun does about
//! it (README: exit status): a bad `--postgres-url` is a usage error; a server
//! that cannot be reached or refuses lockrun at first contact ends lockrun with
//! 69 at once; trouble that passes (a lost connection, a restart, a
//! serialization failure) is ridden out once the server was reached, and a
//! server with too many clients even before.
//! Every message names the server redacted and has the password scrubbed out.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::target::Target;
use crate::error::{Error, Trouble as Passing};

/// What lockrun does about a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--postgres-url` or the environment is wrong: exit 64.
    Usage,
    /// The server cannot be reached: refused, no such host or socket, no
    /// connection in time, no answer to a call. Exit 69 at first contact;
    /// later, a restart or a network blip to ride out.
    Unreachable,
    /// The server answered but will not serve lockrun: a wrong password, no
    /// such user or database, a missing privilege, a certificate that does not
    /// verify, a schema that is not lockrun's. Exit 69.
    Refused,
    /// Trouble that passes: the connection was lost or ended by an
    /// administrator (`pg_terminate_backend`), the server is starting or
    /// shutting down, a serialization failure, deadlock, lock or statement
    /// timeout. Exit 69 at first contact; later, retried with backoff.
    Transient,
    /// The server is there but has no room for another connection ("too many
    /// clients", 53300), or accepted it but is too busy to start the session
    /// in time. Retried with backoff even at first contact: a fleet whose cron
    /// jobs all start in the same minute fills `max_connections` or the
    /// server's CPU for a moment, and that is no reason for their jobs to fail.
    Crowded,
    /// SQL the server rejected that lockrun should never have sent: a bug, exit 70.
    Internal,
}

/// A classified failure, with a one-line message that is safe to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: Kind,
    message: String,
}

impl Failure {
    pub(super) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub(super) fn usage(message: impl Into<String>) -> Self {
        Self::new(Kind::Usage, message)
    }

    /// Whether the backend should retry this once it has reached the server.
    pub fn passes(&self) -> bool {
        matches!(
            self.kind,
            Kind::Unreachable | Kind::Transient | Kind::Crowded
        )
    }

    /// lockrun's error for this failure: trouble that passes is for the
    /// waiting loop to wait out (once the server answered, or when it is
    /// only full), and ends lockrun with 69 anywhere else.
    pub fn into_error(self) -> Error {
        match self.kind {
            Kind::Usage => Error::Usage(self.message),
            Kind::Internal => Error::Internal(self.message),
            Kind::Refused => Error::Unavailable(self.message),
            Kind::Unreachable => Error::trouble(Passing::Unavailable, self.message),
            Kind::Transient => Error::trouble(Passing::Busy, self.message),
            Kind::Crowded => Error::trouble(Passing::Crowded, self.message),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What went wrong in one exchange with the server.
#[derive(Debug)]
pub(super) enum Trouble {
    Postgres(tokio_postgres::Error),
    /// No answer within this long: the connection is given up.
    TimedOut(Duration),
    /// Connected, but the server did not finish starting the session within
    /// this long: it is there, too busy for us for now.
    Unanswered(Duration),
    /// The connection had ended before or during the call.
    Lost,
}

impl From<tokio_postgres::Error> for Trouble {
    fn from(err: tokio_postgres::Error) -> Self {
        Self::Postgres(err)
    }
}

/// `trouble` in `what` with `target`, classified, as one redacted line.
pub(super) fn describe(target: &Target, what: &str, trouble: &Trouble) -> Failure {
    let (kind, why) = classify(trouble);
    let message = format!("PostgreSQL at {target}: {what} failed: {why}");
    Failure::new(kind, target.scrub(&message))
}

fn classify(trouble: &Trouble) -> (Kind, String) {
    let err = match trouble {
        Trouble::TimedOut(within) => {
            return (Kind::Unreachable, format!("no answer within {within:?}"));
        }
        Trouble::Unanswered(within) => {
            return (
                Kind::Crowded,
                format!("connected, but the server did not answer within {within:?}"),
            );
        }
        Trouble::Lost => return (Kind::Transient, "the connection was lost".into()),
        Trouble::Postgres(err) => err,
    };
    if let Some(db) = err.as_db_error() {
        // The message alone: DETAIL and HINT lines would break the one-line rule.
        return (kind_of_state(db.code()), db.message().to_owned());
    }
    if let Some(tls) = rustls_error(err) {
        return (Kind::Refused, format!("TLS: {tls}"));
    }
    // tokio-postgres shows only its own part; the cause says what happened.
    let text = std::iter::once(err.to_string())
        .chain(causes(err).map(ToString::to_string))
        .collect::<Vec<_>>()
        .join(": ");
    if text.contains("password missing") {
        return (
            Kind::Refused,
            "the server asks for a password and none was given".into(),
        );
    }
    if text.starts_with("authentication error") || text.starts_with("error performing TLS") {
        return (Kind::Refused, text);
    }
    if let Some(io) = io_error(err) {
        let connecting = text.starts_with("error connecting");
        return (kind_of_io(io, connecting), io.to_string());
    }
    if err.is_closed() {
        return (Kind::Transient, "the connection was lost".into());
    }
    (Kind::Internal, text)
}

/// The kind of a server error, by its SQLSTATE.
fn kind_of_state(code: &SqlState) -> Kind {
    let code = code.code();
    match code {
        "53300" => Kind::Crowded,
        // Shutting down, crashed, starting up, pg_terminate_backend; a cancelled
        // statement (statement_timeout), a lock or idle-in-transaction timeout;
        // a standby that cannot take writes (after a failover).
        "57P01" | "57P02" | "57P03" | "57014" | "55P03" | "25P03" | "25006" => Kind::Transient,
        // The database was dropped; no such database, schema; no privilege.
        "57P04" | "3D000" | "3F000" | "42501" => Kind::Refused,
        _ => match &code[..2] {
            // Connection exceptions, serialization failures and deadlocks,
            // insufficient resources (disk full, out of memory), I/O errors.
            "08" | "40" | "53" | "58" => Kind::Transient,
            // Authentication and authorization; a server lacking a feature.
            "28" | "0A" => Kind::Refused,
            _ => Kind::Internal,
        },
    }
}

fn kind_of_io(err: &io::Error, connecting: bool) -> Kind {
    use io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable, NotFound,
        TimedOut,
    };
    match err.kind() {
        ConnectionRefused | NotFound | TimedOut | HostUnreachable | NetworkUnreachable
        | AddrNotAvailable => Kind::Unreachable,
        // Name resolution and the like fail before any byte was exchanged.
        _ if connecting => Kind::Unreachable,
        _ => Kind::Transient,
    }
}

/// The first I/O error in `err`'s chain of causes.
fn io_error(err: &tokio_postgres::Error) -> Option<&io::Error> {
    causes(err).find_map(|cause| cause.downcast_ref::<io::Error>())
}

/// The TLS error, when the handshake failed (rustls's error travels inside an I/O error).
fn rustls_error(err: &tokio_postgres::Error) -> Option<&rustls::Error> {
    causes(err).find_map(|cause| {
        cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })
}

fn causes(err: &tokio_postgres::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(err.source(), |&cause| cause.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_sorted_by_sqlstate() {
        let cases = [
            (SqlState::INVALID_PASSWORD, Kind::Refused),
            (SqlState::INVALID_AUTHORIZATION_SPECIFICATION, Kind::Refused),
            (SqlState::INVALID_CATALOG_NAME, Kind::Refused),
            (SqlState::INSUFFICIENT_PRIVILEGE, Kind::Refused),
            (SqlState::FEATURE_NOT_SUPPORTED, Kind::Refused),
            (SqlState::ADMIN_SHUTDOWN, Kind::Transient),
            (SqlState::CRASH_SHUTDOWN, Kind::Transient),
            (SqlState::CANNOT_CONNECT_NOW, Kind::Transient),
            (SqlState::TOO_MANY_CONNECTIONS, Kind::Crowded),
            (SqlState::T_R_SERIALIZATION_FAILURE, Kind::Transient),
            (SqlState::T_R_DEADLOCK_DETECTED, Kind::Transient),
            (SqlState::LOCK_NOT_AVAILABLE, Kind::Transient),
            (SqlState::QUERY_CANCELED, Kind::Transient),
            (SqlState::READ_ONLY_SQL_TRANSACTION, Kind::Transient),
            (SqlState::CONNECTION_FAILURE, Kind::Transient),
            (SqlState::DISK_FULL, Kind::Transient),
            (SqlState::SYNTAX_ERROR, Kind::Internal),
            (SqlState::UNIQUE_VIOLATION, Kind::Internal),
        ];
        for (state, kind) in cases {
            assert_eq!(kind_of_state(&state), kind, "{}", state.code());
        }
    }

    #[test]
    fn socket_errors_are_unreachable_while_connecting_and_transient_after() {
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(kind_of_io(&reset, false), Kind::Transient);
        assert_eq!(kind_of_io(&reset, true), Kind::Unreachable);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(kind_of_io(&refused, false), Kind::Unreachable);
    }

    #[test]
    fn timeouts_and_lost_connections_pass_and_usage_errors_do_not() {
        let target = Target::parse_with("postgres://u:pw@h/d", &|_| None, &|| None).unwrap();
        let timed_out = describe(&target, "renew", &Trouble::TimedOut(Duration::from_secs(2)));
        assert_eq!(timed_out.kind, Kind::Unreachable);
        assert!(timed_out.passes());
        assert_eq!(
            timed_out.to_string(),
            "PostgreSQL at postgres://u:***@h:5432/d: renew failed: no answer within 2s"
        );
        assert!(describe(&target, "renew", &Trouble::Lost).passes());
        assert_eq!(timed_out.into_error().exit_code(), 69);
        let usage = Failure::usage("--postgres-url: bad");
        assert!(!usage.passes());
        assert_eq!(usage.into_error().exit_code(), 64);
    }
}
