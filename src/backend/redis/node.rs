//! A connection to one Redis server (a single node, a Sentinel, a primary, a
//! Cluster node): connected lazily, every call (connecting, TLS, writing and
//! reading) under one deadline, dropped after any failure; and Redis's errors
//! sorted into the network layer's kinds.

use std::io;
use std::os::fd::RawFd;
use std::sync::Once;

use redis::{Connection, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError};

use crate::backend::net::{Deadline, Failure, Kind};
use crate::platform::alarm::{Alarm, next_descriptor, peer_port};

pub struct Node {
    info: ConnectionInfo,
    connection: Option<Connection>,
    /// The connection's TCP socket, when it could be told (for the alarm to shut down).
    socket: Option<RawFd>,
}

impl Node {
    pub fn new(info: ConnectionInfo) -> Self {
        install_crypto_provider();
        Self {
            info,
            connection: None,
            socket: None,
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

    /// Runs `call`, connecting first if need be, all by `deadline`. After any
    /// failure the connection is dropped (a late reply would be taken for the
    /// next call's), so the next call reconnects.
    ///
    /// The redis crate gives each read the socket's timeout afresh, so a
    /// server that trickles a byte at a time would never time out: an alarm at
    /// the deadline interrupts whatever system call the crate is in (EINTR,
    /// which it passes on) and shuts the socket down (rustls retries after
    /// EINTR), and the failure is reported as the timeout it is.
    pub fn call<T>(
        &mut self,
        deadline: Deadline,
        call: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let alarm = Alarm::after(deadline.io_timeout()).map_err(io::Error::from)?;
        let result = self.call_within(deadline, &alarm, call);
        // Before the connection (and its socket) may go.
        drop(alarm);
        if result.is_err() {
            self.connection = None;
            self.socket = None;
        }
        match result {
            // Interrupted, or cut off by the shutdown.
            Err(err) if deadline.has_passed() && err.is_io_error() => {
                Err(io::Error::from(io::ErrorKind::TimedOut).into())
            }
            other => other,
        }
    }

    fn call_within<T>(
        &mut self,
        deadline: Deadline,
        alarm: &Alarm,
        call: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        if self.connection.is_none() {
            // The socket gets the lowest free descriptor: anything there
            // while connecting (and the TLS handshake) is this call's own.
            let socket = next_descriptor();
            alarm.shut_down_when_ringing(socket);
            let connection = redis::Client::open(self.info.clone())?
                .get_connection_with_timeout(deadline.io_timeout())?;
            let port = match self.info.addr() {
                ConnectionAddr::Tcp(_, port) | ConnectionAddr::TcpTls { port, .. } => Some(*port),
                _ => None,
            };
            self.socket = socket.filter(|&socket| port.is_some() && peer_port(socket) == port);
            self.connection = Some(connection);
        }
        alarm.shut_down_when_ringing(self.socket);
        let connection = self.connection.as_mut().expect("connected above");
        connection.set_read_timeout(Some(deadline.io_timeout()))?;
        connection.set_write_timeout(Some(deadline.io_timeout()))?;
        call(connection)
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
