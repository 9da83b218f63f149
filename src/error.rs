//! Errors that know the exit status they end lockrun with (README: "Exit status").

use std::io::Write;

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
    /// Trouble that may pass (a refused or lost connection, a restarting server,
    /// a locked database): ridden out until `--timeout`, and for a short while with
    /// `--no-wait` (docs/guide.md: "When the server has trouble"); then like `Unavailable`.
    #[error("{message}")]
    Trouble { message: String, kind: Trouble },
    /// The store does not exist yet, and only a run creates one: `status` then
    /// says that nothing is held; `release` has nothing to release.
    #[error("{0}")]
    Missing(String),
    /// A bug or an operating-system failure lockrun cannot attribute to the user.
    #[error("internal error: {0}")]
    Internal(String),
    /// lockrun's own output (`status`, `release`) could not be written: a full disk, a failing device.
    #[error("cannot write to {0}")]
    Output(String),
    /// No slot was acquired; carries the `--conflict-exit-code`.
    #[error("{message}")]
    Busy { message: String, exit_code: u8 },
    /// A lease held while waiting for a further name was lost: the command never ran.
    #[error("{0}")]
    LeaseLost(String),
    /// The command could not be executed (126) or was not found (127).
    #[error("{message}")]
    Spawn { message: String, exit_code: u8 },
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => status::USAGE,
            Self::Unavailable(_) | Self::Missing(_) | Self::Trouble { .. } => status::UNAVAILABLE,
            Self::Internal(_) => status::INTERNAL,
            Self::Output(_) => status::OUTPUT,
            Self::LeaseLost(_) => status::LEASE_LOST,
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

    /// A failure of the operating system that lockrun cannot put down to the
    /// user: the platform layer's I/O error, which says what was being done.
    #[allow(clippy::needless_pass_by_value)] // taken as `map_err` gives it
    pub fn system(err: std::io::Error) -> Self {
        Self::Internal(err.to_string())
    }

    pub fn internal(context: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Self::Internal(format!("{context}: {err}"))
    }
}

/// Makes a panic end lockrun with [`status::INTERNAL`] and one line on stderr,
/// rather than with SIGABRT (134), which a caller takes for a death by signal.
/// A command that is running is stopped by the watchdog, which sees lockrun go.
pub fn exit_internal_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = (payload.downcast_ref::<&str>().copied())
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic");
        let place = info.location().map_or(String::new(), |at| {
            format!(" ({}:{})", at.file(), at.line())
        });
        let line = crate::escape::escape_controls(&format!("internal error: {message}{place}"));
        let _ = writeln!(std::io::stderr(), "lockrun: {line}");
        std::process::exit(i32::from(status::INTERNAL));
    }));
}

/// What kind of passing trouble: the `reason` of a `retry` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// The server cannot be reached or is not serving (restarting, failing over).
    Unavailable,
    /// The store answered that it cannot do it now (a database locked by another
    /// process, a server starting up, too many clients, no leader).
    Transient,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the copy of this test binary that panics.
    const PANICKING: &str = "PANIC_HOOK_TEST_CHILD";

    #[test]
    fn a_panic_ends_lockrun_with_the_internal_error_status_and_one_line() {
        if std::env::var_os(PANICKING).is_some() {
            exit_internal_on_panic();
            panic!("a bug\nsaid on two lines");
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "error::tests::a_panic_ends_lockrun_with_the_internal_error_status_and_one_line",
                "--nocapture",
            ])
            .env(PANICKING, "1")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(i32::from(status::INTERNAL)));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|line| line.starts_with("lockrun:"))
            .collect();
        assert_eq!(ours.len(), 1, "{stderr}");
        assert!(
            ours[0]
                .starts_with("lockrun: internal error: a bug\\nsaid on two lines (src/error.rs:"),
            "{stderr}"
        );
    }
}
