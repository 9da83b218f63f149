//! What a server speaks, asked when it closed a fresh connection without a
//! word or kept silent at lockrun's first request (docs/guide.md: "When the server has trouble"). Those are also what a restarting server behind a proxy
//! does, which waiting fixes; a server of another kind is not, and a short
//! probe on fresh connections tells them apart: each kind answers its own
//! greeting at once, and is asked only about the kinds that may be there.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::Deadline;

/// How long one probe waits for its answer: a server answers a greeting of
/// its own protocol at once.
const PROBE_WITHIN: Duration = Duration::from_millis(300);

/// A kind of server lockrun can tell by its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Redis (or Valkey), spoken in plain text.
    Redis,
    PostgreSql,
    /// An HTTP server, such as etcd's gateway.
    Http,
}

impl Protocol {
    /// As a message names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "Redis (without TLS)",
            Self::PostgreSql => "PostgreSQL",
            Self::Http => "HTTP",
        }
    }

    /// What lockrun sends to ask.
    fn greeting(self) -> &'static [u8] {
        match self {
            Self::Redis => b"PING\r\n",
            // An SSLRequest: any PostgreSQL server answers it with one byte, 'S' or 'N'.
            Self::PostgreSql => &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f],
            Self::Http => b"GET / HTTP/1.0\r\n\r\n",
        }
    }

    /// Whether `answer`, the first bytes back, is this kind's.
    fn answered(self, answer: &[u8]) -> bool {
        match self {
            // A reply or an error (-NOAUTH, -ERR ...), whole.
            Self::Redis => matches!(answer.first(), Some(b'+' | b'-')) && answer.ends_with(b"\r\n"),
            Self::PostgreSql => matches!(answer, [b'S' | b'N']),
            Self::Http => answer.starts_with(b"HTTP/"),
        }
    }
}

/// Which of `candidates` the server at `host`:`port` speaks, asked in that
/// order, each on a fresh connection, within `deadline`; `None` when none
/// answered as its kind does (it may be the right server, in trouble).
pub fn identify(
    host: &str,
    port: u16,
    candidates: &[Protocol],
    deadline: Deadline,
) -> Option<Protocol> {
    let address = (host, port).to_socket_addrs().ok()?.next()?;
    candidates.iter().copied().find(|&protocol| {
        let within = PROBE_WITHIN.min(deadline.remaining());
        if within.is_zero() {
            return false;
        }
        let Ok(mut stream) = TcpStream::connect_timeout(&address, within) else {
            return false;
        };
        let mut answer = [0u8; 64];
        let read = stream
            .set_read_timeout(Some(within))
            .and_then(|()| stream.set_write_timeout(Some(within)))
            .and_then(|()| stream.write_all(protocol.greeting()))
            .and_then(|()| stream.read(&mut answer));
        read.is_ok_and(|read| protocol.answered(&answer[..read]))
    })
}
