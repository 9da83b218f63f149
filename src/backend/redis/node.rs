//! A connection to one Redis server (a single node, a Sentinel, a primary, a
//! Cluster node): connected lazily with a timeout, every call under a
//! timeout, dropped after any failure; and Redis's errors sorted into the
//! network layer's kinds.

use std::sync::Once;
use std::time::Duration;

use redis::{Connection, ConnectionInfo, ErrorKind, RedisError};

use crate::backend::net::{Failure, Kind};

pub struct Node {
    info: ConnectionInfo,
    connection: Option<Connection>,
}

impl Node {
    pub fn new(info: ConnectionInfo) -> Self {
        install_crypto_provider();
        Self {
            info,
            connection: None,
        }
    }

    pub fn is_connected(&self) -> bool {
        self.connection.is_some()
    }

    /// The server's host and port, and whether it is spoken to over TLS; `None` on a Unix socket.
    pub fn tcp_address(&self) -> Option<(&str, u16, bool)> {
        match self.info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Some((host, *port, false)),
            redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host, *port, true)),
            _ => None,
        }
    }

    /// Runs `call` with `timeout` for connecting, writing and reading. After
    /// any failure the connection is dropped (a late reply would be taken for
    /// the next call's), so the next call reconnects.
    pub fn call<T>(
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
}

/// What a Redis error calls for, and its words.
pub fn sort(err: &RedisError) -> (Kind, String) {
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
        _ if moved_on(err) || err.code() == Some("BUSY") => (Kind::Transient, err.to_string()),
        // An unknown host and a certificate that does not verify say so only in their text.
        _ if err.is_connection_dropped() || err.is_io_error() => {
            Failure::sort_text(&err.to_string())
        }
        _ => (Kind::Permanent, err.to_string()),
    }
}

/// Whether the server answered that it is not (or not yet, or no longer) the
/// one to serve this (docs/backends/redis.md: "Redis as deployed"): loading its data, a
/// replica, a primary that lost its own, a blocked call ended by a demotion,
/// a cluster that is down or moving a slot.
fn moved_on(err: &RedisError) -> bool {
    matches!(
        err.code(),
        Some(
            "LOADING"
                | "READONLY"
                | "MASTERDOWN"
                | "UNBLOCKED"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "MOVED"
                | "ASK"
        )
    )
}

/// Whether a call was cut short by lockrun being stopped and continued
/// (Ctrl-Z and `fg`, a debugger): Linux ends a socket read that has a timeout
/// with EINTR then, whatever the signal handlers (signal(7)). The redis crate
/// keeps the I/O error's kind to itself; its text is what it shows.
pub fn interrupted(err: &RedisError) -> bool {
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
