//! PostgreSQL's failures sorted into the network layer's kinds (docs/guide.md: "When
//! the server has trouble"): a server that cannot be reached, is starting or
//! stopping, has too many clients or lost the connection is trouble to ride
//! out; a wrong password, a missing database or privilege, a certificate that
//! does not verify or a schema that is not lockrun's is permanent; SQL the
//! server rejects is a bug. Every message names the server redacted and has
//! the password scrubbed out.

use std::error::Error as _;
use std::io;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::target::Target;
use crate::backend::net::probe::Protocol;
use crate::backend::net::{Failure, Kind};

/// What went wrong in one exchange with the server.
#[derive(Debug)]
pub(super) enum CallError {
    Postgres(tokio_postgres::Error),
    /// No answer within this long: the connection is given up.
    TimedOut(Duration),
    /// Connected, but the server did not finish starting the session within
    /// this long: it is there, too busy for us for now.
    Unanswered(Duration),
    /// The connection had ended before or during the call.
    Lost,
    /// The server speaks this other protocol (docs/guide.md: "When the server has trouble").
    Foreign(Protocol),
}

impl From<tokio_postgres::Error> for CallError {
    fn from(err: tokio_postgres::Error) -> Self {
        Self::Postgres(err)
    }
}

/// `err` in `what` with `target`, sorted, as one redacted line.
pub(super) fn describe(target: &Target, what: &str, err: &CallError) -> Failure {
    let (kind, why) = sort(err);
    let message = format!("PostgreSQL at {target}: {what} failed: {why}");
    Failure::new(kind, target.scrub(&message))
}

fn sort(err: &CallError) -> (Kind, String) {
    let err = match err {
        CallError::TimedOut(within) => {
            return (Kind::Unreachable, format!("no answer within {within:?}"));
        }
        CallError::Unanswered(within) => {
            return (
                Kind::Transient,
                format!("connected, but the server did not answer within {within:?}"),
            );
        }
        CallError::Lost => return (Kind::Unreachable, "the connection was lost".into()),
        CallError::Foreign(other) => {
            return (
                Kind::Permanent,
                format!(
                    "the server speaks {}, not PostgreSQL: is the URL right?",
                    other.name()
                ),
            );
        }
        CallError::Postgres(err) => err,
    };
    if let Some(db) = err.as_db_error() {
        // The message alone: DETAIL and HINT lines would break the one-line rule.
        return (kind_of_state(db.code()), db.message().to_owned());
    }
    if let Some(tls) = rustls_error(err) {
        return (Kind::Permanent, format!("TLS: {tls}"));
    }
    // tokio-postgres shows only its own part; the cause says what happened.
    let text = std::iter::once(err.to_string())
        .chain(causes(err).map(ToString::to_string))
        .collect::<Vec<_>>()
        .join(": ");
    if text.contains("password missing") {
        return (
            Kind::Permanent,
            "the server asks for a password and none was given".into(),
        );
    }
    if text.starts_with("authentication error") || text.starts_with("error performing TLS") {
        return (Kind::Permanent, text);
    }
    if let Some(io) = io_error(err) {
        let failure = Failure::from_io(io);
        return (failure.kind(), failure.to_string());
    }
    if err.is_closed() {
        return (Kind::Unreachable, "the connection was lost".into());
    }
    (Kind::Bug, text)
}

/// The kind of a server error, by its SQLSTATE.
fn kind_of_state(code: &SqlState) -> Kind {
    let code = code.code();
    match code {
        // Too many clients; shutting down, crashed, starting up, pg_terminate_backend; a cancelled
        // statement (statement_timeout), a lock or idle-in-transaction timeout;
        // a standby that cannot take writes (after a failover).
        "53300" | "57P01" | "57P02" | "57P03" | "57014" | "55P03" | "25P03" | "25006" => {
            Kind::Transient
        }
        // The database was dropped; no such database, schema; no privilege.
        "57P04" | "3D000" | "3F000" | "42501" => Kind::Permanent,
        _ => match &code[..2] {
            // Connection exceptions, serialization failures and deadlocks,
            // insufficient resources (disk full, out of memory), I/O errors.
            "08" | "40" | "53" | "58" => Kind::Transient,
            // Authentication and authorization; a server lacking a feature.
            "28" | "0A" => Kind::Permanent,
            _ => Kind::Bug,
        },
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
            (SqlState::INVALID_PASSWORD, Kind::Permanent),
            (
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                Kind::Permanent,
            ),
            (SqlState::INVALID_CATALOG_NAME, Kind::Permanent),
            (SqlState::INSUFFICIENT_PRIVILEGE, Kind::Permanent),
            (SqlState::FEATURE_NOT_SUPPORTED, Kind::Permanent),
            (SqlState::ADMIN_SHUTDOWN, Kind::Transient),
            (SqlState::CRASH_SHUTDOWN, Kind::Transient),
            (SqlState::CANNOT_CONNECT_NOW, Kind::Transient),
            (SqlState::TOO_MANY_CONNECTIONS, Kind::Transient),
            (SqlState::T_R_SERIALIZATION_FAILURE, Kind::Transient),
            (SqlState::T_R_DEADLOCK_DETECTED, Kind::Transient),
            (SqlState::LOCK_NOT_AVAILABLE, Kind::Transient),
            (SqlState::QUERY_CANCELED, Kind::Transient),
            (SqlState::READ_ONLY_SQL_TRANSACTION, Kind::Transient),
            (SqlState::CONNECTION_FAILURE, Kind::Transient),
            (SqlState::DISK_FULL, Kind::Transient),
            (SqlState::SYNTAX_ERROR, Kind::Bug),
            (SqlState::UNIQUE_VIOLATION, Kind::Bug),
        ];
        for (state, kind) in cases {
            assert_eq!(kind_of_state(&state), kind, "{}", state.code());
        }
    }

    #[test]
    fn timeouts_and_lost_connections_pass() {
        let target = Target::parse_with("postgres://u:pw@h/d", &|_| None, &|| None).unwrap();
        let timed_out = describe(
            &target,
            "renew",
            &CallError::TimedOut(Duration::from_secs(2)),
        );
        assert_eq!(timed_out.kind(), Kind::Unreachable);
        assert_eq!(
            timed_out.to_string(),
            "PostgreSQL at postgres://u:***@h:5432/d: renew failed: no answer within 2s"
        );
        assert!(describe(&target, "renew", &CallError::Lost).is_transient());
    }
}
