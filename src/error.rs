//! Errors that know the exit status they end lockrun with (README: "Exit status").

/// Exit statuses of lockrun's own.
pub mod status {
    pub const USAGE: u8 = 64;
    pub const UNAVAILABLE: u8 = 69;
    pub const INTERNAL: u8 = 70;
    /// `EX_IOERR` in sysexits.h: lockrun's own output could not be written.
    pub const OUTPUT: u8 = 74;
    pub const LEASE_LOST: u8 = 76;
    pub const MAX_RUNTIME: u8 = 124;
    pub const CANNOT_EXECUTE: u8 = 126;
    pub const NOT_FOUND: u8 = 127;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag, value or name.
    #[error("{0}")]
    Usage(String),
    /// The backend cannot be used: server unreachable, auth refused, file unusable.
    #[error("{0}")]
    Unavailable(String),
    /// Trouble that may pass (a lost connection, a restarting server, a locked
    /// database): waited out once the backend has answered, else like `Unavailable`.
    #[error("{message}")]
    Trouble { message: String, kind: Trouble },
    /// A bug or an operating-system failure lockrun cannot attribute to the user.
    #[error("internal error: {0}")]
    Internal(String),
    /// lockrun's own output (`status`, `release`) could not be written: a full disk, a failing device.
    #[error("cannot write to {0}")]
    Output(String),
    /// No slot was acquired; carries the `--conflict-exit-code`.
    #[error("{message}")]
    Busy { message: String, exit_code: u8 },
    /// The command could not be executed (126) or was not found (127).
    #[error("{message}")]
    Spawn { message: String, exit_code: u8 },
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => status::USAGE,
            Self::Unavailable(_) | Self::Trouble { .. } => status::UNAVAILABLE,
            Self::Internal(_) => status::INTERNAL,
            Self::Output(_) => status::OUTPUT,
            Self::Busy { exit_code, .. } | Self::Spawn { exit_code, .. } => *exit_code,
        }
    }

    pub fn unavailable(context: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Self::Unavailable(format!("{context}: {err}"))
    }

    pub fn trouble(kind: Trouble, message: impl Into<String>) -> Self {
        Self::Trouble {
            message: message.into(),
            kind,
        }
    }

    /// A failed write to `stream`, said as the system says it ("No space left on device").
    pub fn output(stream: &str, err: &std::io::Error) -> Self {
        let reason = err.raw_os_error().map_or_else(
            || err.to_string(),
            |code| nix::errno::Errno::from_raw(code).desc().to_owned(),
        );
        Self::Output(format!("{stream}: {reason}"))
    }

    /// Whether this is trouble worth waiting out before the store ever answered a look:
    /// only a server that is there but full, never one that cannot be reached.
    pub fn passes_at_first_contact(&self) -> bool {
        matches!(
            self,
            Self::Trouble {
                kind: Trouble::Crowded,
                ..
            }
        )
    }

    pub fn internal(context: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Self::Internal(format!("{context}: {err}"))
    }
}

/// What kind of passing trouble: the `reason` of a `retry` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// The server cannot be reached or is not serving (restarting, failing over).
    Unavailable,
    /// The store answered but could not do it now (a database locked by another process).
    Busy,
    /// The server is up but has no room for another client now (PostgreSQL's "too many
    /// clients"): waited out even at first contact, as when a whole fleet starts at once.
    Crowded,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
