//! The connection to Redis: the URL (and its redacted form for messages),
//! connecting with a timeout, a timeout on every call, and reconnecting after
//! a failure; Redis's errors sorted into the network layer's kinds. Nothing
//! here ever prints the password.

use std::sync::Once;
use std::time::Duration;

use redis::{Connection, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError};

use crate::backend::net::{Failure, Kind, Secret};

pub struct Link {
    info: ConnectionInfo,
    /// The URL with its password replaced, for messages.
    shown: String,
    /// The password, so that no message built from a server or library error can repeat it.
    secret: Option<Secret>,
    connection: Option<Connection>,
}

impl Link {
    /// Parses `url`; connects lazily, on the first call.
    pub fn new(url: &str) -> Result<Self, Failure> {
        let shown = redact(url);
        let invalid = |why: String| {
            Failure::new(
                Kind::Permanent,
                format!(
                    "--redis-url {shown} is not a usable Redis URL ({why}); expected redis://[user:pass@]host:port[/db], rediss://... or redis+unix:///path"
                ),
            )
        };
        let parsed =
            redis::parse_redis_url(url).ok_or_else(|| invalid("cannot parse it".into()))?;
        let secret = parsed
            .password()
            .map(str::to_owned)
            .or_else(|| {
                parsed
                    .query_pairs()
                    .find(|(key, _)| key == "pass")
                    .map(|(_, value)| value.into_owned())
            })
            .filter(|secret| !secret.is_empty())
            .map(Secret::new);
        let info = parsed
            .into_connection_info()
            .map_err(|err| invalid(Secret::scrub_with(secret.as_ref(), &err.to_string())))?;
        // CLIENT SETINFO would cost a round trip on every connect.
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        install_crypto_provider();
        Ok(Self {
            info,
            shown,
            secret,
            connection: None,
        })
    }

    /// The server as messages show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs `call` on the connection with `timeout` for connecting, writing and
    /// reading. After any failure the connection is dropped (a late reply would
    /// be taken for the next call's), so the next call reconnects.
    pub fn call<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        call: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        self.try_call(timeout, call)
            .map_err(|err| self.error(what, &err))
    }

    /// Like [`Link::call`], for calls that can safely run twice: a connection
    /// that the server closed since the last call (a restart) is replaced
    /// once, and a call that lockrun's being stopped cut short is made again.
    pub fn call_idempotent<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut call: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        let reused = self.connection.is_some();
        match self.try_call(timeout, &mut call) {
            Err(err) if (reused && err.is_connection_dropped()) || interrupted(&err) => {
                self.call(what, timeout, call)
            }
            result => result.map_err(|err| self.error(what, &err)),
        }
    }

    /// Like [`Link::call_idempotent`], for a call that waits to be told
    /// something (BLPOP): `None` when lockrun's being stopped cut it short, so
    /// that the caller looks for itself at once (what it was told may have
    /// been lost with the connection).
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut call: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<Option<T>, Failure> {
        let reused = self.connection.is_some();
        match self.try_call(timeout, &mut call) {
            Err(err) if interrupted(&err) => Ok(None),
            Err(err) if reused && err.is_connection_dropped() => {
                self.call(what, timeout, call).map(Some)
            }
            result => result.map(Some).map_err(|err| self.error(what, &err)),
        }
    }

    fn try_call<T>(
        &mut self,
        timeout: Duration,
        call: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let timeout = timeout.max(Duration::from_millis(1));
        let connection = match &mut self.connection {
            Some(connection) => connection,
            slot @ None => slot.insert(
                redis::Client::open(self.info.clone())?.get_connection_with_timeout(timeout)?,
            ),
        };
        let result = connection
            .set_read_timeout(Some(timeout))
            .and_then(|()| connection.set_write_timeout(Some(timeout)))
            .and_then(|()| call(connection));
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// The error as the user should read it, sorted: trouble that may pass (the
    /// server unreachable, restarting, failing over) or a refusal that will not.
    fn error(&self, what: &str, err: &RedisError) -> Failure {
        let (kind, why) = sort(err);
        let message = format!("Redis at {}: {what} failed: {why}", self.shown);
        Failure::new(kind, Secret::scrub_with(self.secret.as_ref(), &message))
    }
}

/// What a Redis error calls for, and its words.
fn sort(err: &RedisError) -> (Kind, String) {
    match err.kind() {
        _ if err.is_timeout() => (Kind::Unreachable, "no answer in time".to_owned()),
        _ if err.is_connection_refusal() => (Kind::Unreachable, "connection refused".to_owned()),
        ErrorKind::AuthenticationFailed => (Kind::Permanent, "authentication failed".to_owned()),
        ErrorKind::Parse => (
            Kind::Permanent,
            "the server does not speak the Redis protocol".to_owned(),
        ),
        // Redis refuses a long command from a client that has not authenticated as a protocol error.
        _ if err.code() == Some("NOAUTH") || err.to_string().contains("unauthenticated") => {
            (Kind::Permanent, "the server requires a password".to_owned())
        }
        _ if err.code() == Some("WRONGPASS") => {
            (Kind::Permanent, "authentication failed".to_owned())
        }
        // Loading its data, a replica, no primary yet, a cluster moving slots, a busy script.
        _ if matches!(
            err.code(),
            Some("LOADING" | "READONLY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "BUSY")
        ) =>
        {
            (Kind::Transient, err.to_string())
        }
        // An unknown host and a certificate that does not verify say so only in their text.
        _ if err.is_connection_dropped() || err.is_io_error() => {
            Failure::sort_text(&err.to_string())
        }
        _ => (Kind::Permanent, err.to_string()),
    }
}

/// Whether a call was cut short by lockrun being stopped and continued
/// (Ctrl-Z and `fg`, a debugger): Linux ends a socket read that has a timeout
/// with EINTR then, whatever the signal handlers (signal(7)). The redis crate
/// keeps the I/O error's kind to itself; its text is what it shows.
fn interrupted(err: &RedisError) -> bool {
    let eintr = std::io::Error::from_raw_os_error(nix::libc::EINTR).to_string();
    err.is_io_error() && err.to_string().contains(&eintr)
}

/// rustls needs a process-wide crypto provider before the first TLS connect,
/// or it panics; lockrun uses ring.
fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Fails only when a provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `url` with any password (`user:pass@` or `?pass=`) replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(mut parsed) = redis::parse_redis_url(url) else {
        // Unparsable: show only the scheme, since the rest may hold a password.
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        return format!("{scheme}://...");
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query_pairs().any(|(key, _)| key == "pass") {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let value = if key == "pass" {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string().replace("%2A%2A%2A", "***")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_in_every_url_form() {
        assert_eq!(
            redact("redis://user:s3cret@example.com:6380/2"),
            "redis://user:***@example.com:6380/2"
        );
        assert_eq!(redact("rediss://:s3cret@h"), "rediss://:***@h");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("http://user:s3cret@x"), "http://...");
        assert!(!redact("not a url s3cret").contains("s3cret"));
    }

    #[test]
    fn a_bad_url_is_unavailable_at_once_without_the_secret() {
        let Err(err) = Link::new("redis://:s3cret@host:notaport") else {
            panic!("accepted a bad port");
        };
        assert_eq!(err.kind(), Kind::Permanent);
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
