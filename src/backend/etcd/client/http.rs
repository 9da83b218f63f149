//! A small blocking HTTP/1.1 client, just what etcd's JSON gateway needs: a
//! POST with a JSON body over TCP or TLS (rustls with ring), a response framed
//! by `Content-Length` or chunked, and a deadline on every connect, read and
//! write. A body can be read as it arrives, since a watch is one endless response.
//! No threads and no runtime: everything happens in the caller's system calls.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use socket2::{SockRef, TcpKeepalive};

use super::endpoint::Endpoint;
use super::error::not_etcd;
use crate::backend::net::Deadline;

/// Longest response head or chunk-size line we accept from a server.
const MAX_LINE: usize = 16 * 1024;
/// Longest body of a single answer (a listing of many keys still fits).
const MAX_BODY: usize = 64 * 1024 * 1024;
/// A silent peer is declared dead after about 5 s + 3 × 1 s without an answer to
/// TCP keepalive probes: this is what ends a watch on a member that vanished
/// from the network without closing the connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 3;

/// The client side of TLS: the system's trusted roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` point elsewhere, as for `rediss://`) and ring as the crypto
/// provider, passed explicitly rather than installed process-wide.
pub fn tls_config() -> io::Result<Arc<ClientConfig>> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(io::Error::other(format!(
            "no trusted root certificates ({why}); SSL_CERT_FILE can name a file of them"
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Self::Plain(socket) => socket,
            Self::Tls(stream) => &stream.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(socket) => socket.read(buf),
            Self::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(socket) => socket.write(buf),
            Self::Tls(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(socket) => socket.flush(),
            Self::Tls(stream) => stream.flush(),
        }
    }
}

/// Where the reader is in the current response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// `Content-Length`: this many bytes are left.
    Length(usize),
    /// Chunked, before a chunk-size line.
    ChunkSize,
    /// Chunked, inside a chunk with this many bytes left.
    ChunkData(usize),
    /// Chunked, before the CRLF that ends a chunk's data.
    ChunkEnd,
    /// Chunked, after the last chunk: trailer lines up to an empty one.
    Trailer,
    /// Neither: the body ends when the server closes the connection.
    UntilClose,
    Done,
}

/// One connection to one endpoint, reused for one request after another.
pub struct Connection {
    stream: Stream,
    authority: String,
    /// Bytes received and not yet taken.
    received: Vec<u8>,
    body: Body,
    /// Whether the server lets the connection carry another request.
    reusable: bool,
}

impl Connection {
    /// Connects to the first of the endpoint's addresses that answers, and
    /// completes the TLS handshake for `https://`, all by `deadline`.
    pub fn open(
        endpoint: &Endpoint,
        tls: Option<&Arc<ClientConfig>>,
        deadline: Deadline,
    ) -> io::Result<Self> {
        let socket = connect(&endpoint.host, endpoint.port, deadline)?;
        socket.set_nodelay(true)?;
        SockRef::from(&socket).set_tcp_keepalive(
            &TcpKeepalive::new()
                .with_time(KEEPALIVE_IDLE)
                .with_interval(KEEPALIVE_INTERVAL)
                .with_retries(KEEPALIVE_PROBES),
        )?;
        let stream = match (&endpoint.tls, tls) {
            (Some(name), Some(config)) => {
                let session = ClientConnection::new(Arc::clone(config), name.clone())
                    .map_err(io::Error::other)?;
                let mut stream = StreamOwned::new(session, socket);
                set_timeouts(&stream.sock, deadline)?;
                while stream.conn.is_handshaking() {
                    stream.conn.complete_io(&mut stream.sock)?;
                }
                Stream::Tls(Box::new(stream))
            }
            _ => Stream::Plain(socket),
        };
        Ok(Self {
            stream,
            authority: endpoint.authority.clone(),
            received: Vec::new(),
            body: Body::Done,
            reusable: true,
        })
    }

    /// Whether another request may follow on this connection: the last
    /// response was read to its end and the server did not close it.
    pub fn reusable(&self) -> bool {
        self.reusable && self.body == Body::Done
    }

    /// Sends `POST path` with a JSON body and reads the response's head; returns
    /// its status. The body is then read with [`Connection::read_body`].
    pub fn post(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        deadline: Deadline,
    ) -> io::Result<u16> {
        let mut request = Vec::with_capacity(512 + body.len());
        write!(
            request,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.authority,
            body.len()
        )?;
        for (name, value) in headers {
            write!(request, "{name}: {value}\r\n")?;
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body);
        set_timeouts(self.stream.socket(), deadline)?;
        self.stream.write_all(&request)?;
        self.stream.flush()?;
        self.read_head(deadline)
    }

    /// The whole body of the current response.
    pub fn read_to_end(&mut self, deadline: Deadline) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while self.read_body(&mut body, deadline)? {
            if body.len() > MAX_BODY {
                return Err(not_etcd("the answer is too long"));
            }
        }
        Ok(body)
    }

    /// Appends the body bytes that are there, waiting until some arrive or
    /// `deadline` passes (an error of kind `TimedOut`, after which reading can
    /// go on). Returns false once the body has ended.
    pub fn read_body(&mut self, out: &mut Vec<u8>, deadline: Deadline) -> io::Result<bool> {
        loop {
            match self.body {
                Body::Done => return Ok(false),
                Body::Length(0) => self.body = Body::Done,
                Body::Length(left) | Body::ChunkData(left) => {
                    if self.received.is_empty() {
                        self.fill(deadline)?;
                    }
                    let taken = left.min(self.received.len());
                    out.extend(self.received.drain(..taken));
                    self.body = match self.body {
                        Body::Length(_) => Body::Length(left - taken),
                        _ if taken == left => Body::ChunkEnd,
                        _ => Body::ChunkData(left - taken),
                    };
                    return Ok(true);
                }
                Body::ChunkSize => {
                    let line = self.take_line(deadline)?;
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size, 16)
                        .map_err(|_| not_etcd("a bad chunk size"))?;
                    self.body = if size == 0 {
                        Body::Trailer
                    } else {
                        Body::ChunkData(size)
                    };
                }
                Body::ChunkEnd => {
                    if !self.take_line(deadline)?.is_empty() {
                        return Err(not_etcd("a chunk longer than its size"));
                    }
                    self.body = Body::ChunkSize;
                }
                Body::Trailer => {
                    if self.take_line(deadline)?.is_empty() {
                        self.body = Body::Done;
                    }
                }
                Body::UntilClose => {
                    if self.received.is_empty() {
                        match self.fill(deadline) {
                            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                                self.body = Body::Done;
                                continue;
                            }
                            other => other?,
                        }
                    }
                    out.append(&mut self.received);
                    return Ok(true);
                }
            }
        }
    }

    fn read_head(&mut self, deadline: Deadline) -> io::Result<u16> {
        let status_line = self.take_line(deadline)?;
        let mut words = status_line.split(' ');
        let version = words.next().unwrap_or_default();
        let status = words
            .next()
            .and_then(|code| code.parse().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .ok_or_else(|| not_etcd("not an HTTP response"))?;
        let (mut length, mut chunked) = (None, false);
        self.reusable = version == "HTTP/1.1";
        loop {
            let line = self.take_line(deadline)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(not_etcd("a malformed header"));
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = Some(
                        value
                            .parse()
                            .map_err(|_| not_etcd("a bad Content-Length"))?,
                    );
                }
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                "connection" => self.reusable &= !value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        self.body = match (chunked, length) {
            (true, _) => Body::ChunkSize,
            (false, Some(length)) => Body::Length(length),
            (false, None) => {
                self.reusable = false;
                Body::UntilClose
            }
        };
        Ok(status)
    }

    /// Takes one CRLF-terminated line (without the CRLF), reading as needed.
    /// Nothing is taken until the whole line is there, so a read that times
    /// out can be repeated.
    fn take_line(&mut self, deadline: Deadline) -> io::Result<String> {
        loop {
            if let Some(end) = self.received.windows(2).position(|pair| pair == b"\r\n") {
                let line: Vec<u8> = self.received.drain(..end + 2).take(end).collect();
                return String::from_utf8(line).map_err(|_| not_etcd("a line that is not text"));
            }
            if self.received.len() > MAX_LINE {
                return Err(not_etcd("a line too long"));
            }
            self.fill(deadline)?;
        }
    }

    /// Reads what the server sent next, by `deadline`.
    fn fill(&mut self, deadline: Deadline) -> io::Result<()> {
        let mut buffer = [0; 16 * 1024];
        loop {
            set_timeouts(self.stream.socket(), deadline)?;
            match self.stream.read(&mut buffer) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.received.extend_from_slice(&buffer[..n]);
                    return Ok(());
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Err(err) => return Err(err),
            }
        }
    }
}

fn connect(host: &str, port: u16, deadline: Deadline) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host name has no address");
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, left(deadline)?) {
            Ok(socket) => return Ok(socket),
            Err(err) => last = err,
        }
    }
    Err(last)
}

/// Bounds the next blocking read or write by `deadline`.
fn set_timeouts(socket: &TcpStream, deadline: Deadline) -> io::Result<()> {
    let left = left(deadline)?;
    socket.set_read_timeout(Some(left))?;
    socket.set_write_timeout(Some(left))
}

/// Time left until `deadline`; `TimedOut` when none is.
fn left(deadline: Deadline) -> io::Result<Duration> {
    let left = deadline.remaining();
    if left.is_zero() {
        Err(io::ErrorKind::TimedOut.into())
    } else {
        Ok(left)
    }
}
