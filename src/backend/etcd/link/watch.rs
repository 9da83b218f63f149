//! A watch: one POST to `/v3/watch` whose answer never ends, a JSON message
//! per line, each a batch of events (or a progress note). It has a connection
//! of its own, so the client's other calls (a waiter's lease keep-alives) go
//! on beside it; closing the connection cancels the watch on the server.
//!
//! Dead members: the request asks for a member with a leader, so a member cut
//! off from the others cancels the watch within a few election timeouts, and
//! TCP keepalive probes end it when the member vanishes from the network.
//! Either way the caller gets an error and watches again on another member.

use super::error::{AttemptError, Error, Result, code, not_etcd};
use super::wire::{WatchEvent, WatchResponse, decode_streamed};
use crate::backend::net::http::{Connection, MAX_BODY};
use crate::backend::net::{Deadline, Kind};

pub struct Watch {
    connection: Connection,
    /// The member, as messages show it.
    endpoint: String,
    /// Body bytes received and not yet split into messages.
    pending: Vec<u8>,
    /// How many of the pending bytes are known to hold no line's end.
    searched: usize,
    /// The store's revision when the member confirmed the watch.
    created_at: i64,
}

impl Watch {
    /// Sends the watch request `body` on `connection` and waits, by `deadline`,
    /// for the member to confirm it.
    pub(super) fn start(
        mut connection: Connection,
        endpoint: String,
        headers: &[(&str, &str)],
        body: &[u8],
        deadline: Deadline,
    ) -> Result<Self, AttemptError> {
        let status = connection.post("/v3/watch", headers, body, deadline)?;
        if status != 200 {
            let reply = connection.read_to_end(deadline)?;
            return Err(AttemptError::from_reply(status, &reply));
        }
        let mut watch = Self {
            connection,
            endpoint,
            pending: Vec::new(),
            searched: 0,
            created_at: 0,
        };
        let created = watch.message(deadline)?;
        watch.created_at = created.header.revision;
        if !created.created {
            return Err(AttemptError::Io(not_etcd("the watch was not confirmed")));
        }
        // etcd refuses a watch by cancelling it in the same answer, with the
        // gRPC error in words: "rpc error: code = Unauthenticated desc = ...".
        if created.canceled {
            let reason = created.cancel_reason;
            let code = [
                ("Unauthenticated", code::UNAUTHENTICATED),
                ("PermissionDenied", code::PERMISSION_DENIED),
                ("InvalidArgument", code::INVALID_ARGUMENT),
            ]
            .into_iter()
            .find(|(name, _)| reason.contains(&format!("code = {name} ")))
            .map_or(code::OUT_OF_RANGE, |(_, code)| code);
            return Err(AttemptError::Answer {
                code,
                message: reason,
            });
        }
        Ok(watch)
    }

    /// The store's revision when the member confirmed the watch: a watch
    /// from now sees every change after it.
    pub fn created_at(&self) -> i64 {
        self.created_at
    }

    /// The next batch of events, waiting for one until `until`; empty when
    /// none came by then (progress notes are skipped). After an error the
    /// watch is over: read the keys anew and watch again (on any member).
    pub fn next(&mut self, until: Deadline) -> Result<Vec<WatchEvent>> {
        loop {
            let response = match self.message(until) {
                Ok(response) => response,
                Err(AttemptError::Io(err))
                    if err.kind() == std::io::ErrorKind::TimedOut && until.has_passed() =>
                {
                    return Ok(Vec::new());
                }
                Err(failure) => {
                    let kind = failure.verdict().kind();
                    return Err(failure.into_error(kind, &self.context()));
                }
            };
            if response.canceled {
                let why = match response.compact_revision {
                    0 => response.cancel_reason,
                    compacted => format!("revisions up to {compacted} were compacted"),
                };
                return Err(Error::new(
                    Kind::Permanent,
                    format!("{}: cancelled by etcd: {why}", self.context()),
                )
                .with_code(code::CANCELLED));
            }
            if !response.events.is_empty() {
                return Ok(response.events);
            }
        }
    }

    /// Reads the next message by `until`.
    fn message(&mut self, until: Deadline) -> Result<WatchResponse, AttemptError> {
        loop {
            // Only what came since the last look: a long message is read in many pieces.
            let newline = self.pending[self.searched..]
                .iter()
                .position(|&byte| byte == b'\n')
                .map(|offset| self.searched + offset);
            // After a line is taken, what follows it has not been searched yet.
            self.searched = newline.map_or(self.pending.len(), |_| 0);
            if let Some(end) = newline {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                if line.trim_ascii().is_empty() {
                    continue;
                }
                return decode_streamed(&line);
            }
            if self.pending.len() > MAX_BODY {
                return Err(AttemptError::Io(not_etcd("a watch message too long")));
            }
            if !self.connection.read_body(&mut self.pending, until)? {
                return Err(AttemptError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    fn context(&self) -> String {
        format!("etcd at {}: watch failed", self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpListener;
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::backend::etcd::link::Endpoints;
    use crate::backend::net::http::tests::accept_request;

    /// A member that confirms the watch, then sends a message that never ends.
    fn endless_message() -> Connection {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let mut socket = accept_request(&listener);
            let created = b"{\"result\":{\"header\":{\"revision\":\"1\"},\"created\":true}}\n";
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                created.len()
            );
            let _ = socket.write_all(created);
            let _ = socket.write_all(b"\r\n");
            let piece = vec![b' '; 1 << 20];
            // Until the client hangs up.
            while write!(socket, "{:x}\r\n", piece.len())
                .and_then(|()| socket.write_all(&piece))
                .and_then(|()| socket.write_all(b"\r\n"))
                .is_ok()
            {}
        });
        let endpoints = Endpoints::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let deadline = Deadline::after(Duration::from_secs(5));
        Connection::open(&endpoints.members[0].address, None, deadline).unwrap()
    }

    #[test]
    fn a_message_longer_than_the_bound_ends_the_watch() {
        let deadline = Deadline::after(Duration::from_secs(5));
        let mut watch = Watch::start(endless_message(), "m".into(), &[], b"{}", deadline)
            .unwrap_or_else(|_| panic!("the watch is confirmed"));
        let err = watch
            .next(Deadline::after(Duration::from_secs(30)))
            .expect_err("no message that long");
        assert!(err.to_string().contains("too long"), "{err}");
    }
}
