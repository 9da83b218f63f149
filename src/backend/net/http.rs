//! A small blocking HTTP/1.1 client, just what etcd's JSON gateway and S3
//! need: a request with a body over TCP or TLS (rustls with ring), a response
//! framed by `Content-Length` or chunked, and a deadline on every connect, read
//! and write. A body can be read as it arrives, since an etcd watch is one
//! endless response. No threads and no runtime: everything happens in the
//! caller's system calls.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use socket2::{SockRef, TcpKeepalive};
use url::{Host, Url};

use rustls::pki_types::ServerName;

use crate::backend::net::Deadline;

/// Longest response head or chunk-size line we accept from a server.
const MAX_LINE: usize = 16 * 1024;
/// Longest body of a single answer (a listing of many keys still fits), and
/// of a single message of a watch.
pub const MAX_BODY: usize = 64 * 1024 * 1024;
/// A silent peer is declared dead after about 5 s + 3 × 1 s without an answer to
/// TCP keepalive probes: this is what ends a watch on a member that vanished
/// from the network without closing the connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 3;

/// Where a server is: what [`Connection::open`] needs of an endpoint.
#[derive(Clone, Debug)]
pub struct Address {
    /// Host (without IPv6 brackets) and port, for name resolution.
    pub host: String,
    pub port: u16,
    /// `host:port` as the `Host` header wants it.
    pub authority: String,
    /// The name the server's certificate must carry; `None` for plain `http://`.
    pub tls: Option<ServerName<'static>>,
}

impl Address {
    /// Where `url` (`http://` or `https://`, checked by the caller) points,
    /// with `default_port` when it names none; `Err` says why it cannot be used.
    pub fn of_url(url: &Url, default_port: u16) -> Result<Self, &'static str> {
        let (host, server_name) = match url.host() {
            Some(Host::Domain(domain)) => (
                domain.to_owned(),
                ServerName::try_from(domain.to_owned()).ok(),
            ),
            Some(Host::Ipv4(ip)) => (ip.to_string(), Some(ServerName::from(ip))),
            Some(Host::Ipv6(ip)) => (ip.to_string(), Some(ServerName::from(ip))),
            None => return Err("it names no host"),
        };
        let server_name = server_name.ok_or("the host is not a valid name")?;
        let port = url.port().unwrap_or(default_port);
        Ok(Self {
            host,
            port,
            authority: format!("{}:{port}", url.host_str().unwrap_or_default()),
            tls: (url.scheme() == "https").then_some(server_name),
        })
    }
}

/// The request target of `url`: its path and query.
pub fn target_of(url: &Url) -> String {
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    }
}

/// An answer that is not HTTP as this client reads it.
fn malformed(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an HTTP answer: {why}"),
    )
}

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

/// A socket whose every read and write gets only what is left of `deadline`:
/// rustls reads a handshake in as many reads as the peer sends pieces.
struct Bounded<'s> {
    socket: &'s TcpStream,
    deadline: Deadline,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        set_timeouts(self.socket, self.deadline)?;
        self.socket.read(buf)
    }
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        set_timeouts(self.socket, self.deadline)?;
        self.socket.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
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
    /// The current response's `ETag`, if it has one.
    etag: Option<String>,
}

impl Connection {
    /// Connects to the first of the endpoint's addresses that answers, and
    /// completes the TLS handshake for `https://`, all by `deadline`.
    pub fn open(
        endpoint: &Address,
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
                let mut bounded = Bounded {
                    socket: &stream.sock,
                    deadline,
                };
                while stream.conn.is_handshaking() {
                    stream.conn.complete_io(&mut bounded)?;
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
            etag: None,
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
        let mut with_type = vec![("Content-Type", "application/json")];
        with_type.extend_from_slice(headers);
        self.send("POST", path, &with_type, body, deadline)
    }

    /// Sends `method target` with `headers` and `body` (a `Content-Length` is
    /// added) and reads the response's head; returns its status.
    pub fn send(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        deadline: Deadline,
    ) -> io::Result<u16> {
        let mut request = Vec::with_capacity(512 + body.len());
        write!(
            request,
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.authority,
            body.len()
        )?;
        for (name, value) in headers {
            write!(request, "{name}: {value}\r\n")?;
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body);
        self.write_all_by(&request, deadline)?;
        self.read_head(deadline)
    }

    /// The `ETag` header of the last response, quotes included, if it had one.
    pub fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// Writes all of `bytes` by `deadline`: each write gets only what is left of it.
    fn write_all_by(&mut self, mut bytes: &[u8], deadline: Deadline) -> io::Result<()> {
        while !bytes.is_empty() {
            set_timeouts(self.stream.socket(), deadline)?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Err(err) => return Err(err),
            }
        }
        set_timeouts(self.stream.socket(), deadline)?;
        self.stream.flush()
    }

    /// The whole body of the current response, up to [`MAX_BODY`].
    pub fn read_to_end(&mut self, deadline: Deadline) -> io::Result<Vec<u8>> {
        self.read_up_to(MAX_BODY, deadline)
    }

    /// The whole body of the current response, refused when longer than
    /// `limit` bytes: a server, or something posing as one, cannot make us
    /// hold more.
    pub fn read_up_to(&mut self, limit: usize, deadline: Deadline) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while self.read_body(&mut body, deadline)? {
            if body.len() > limit {
                return Err(malformed("the answer is too long"));
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
                        .map_err(|_| malformed("a bad chunk size"))?;
                    self.body = if size == 0 {
                        Body::Trailer
                    } else {
                        Body::ChunkData(size)
                    };
                }
                Body::ChunkEnd => {
                    if !self.take_line(deadline)?.is_empty() {
                        return Err(malformed("a chunk longer than its size"));
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
            .ok_or_else(|| malformed("not an HTTP response"))?;
        let (mut length, mut chunked) = (None, false);
        self.reusable = version == "HTTP/1.1";
        self.etag = None;
        loop {
            let line = self.take_line(deadline)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(malformed("a malformed header"));
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = Some(
                        value
                            .parse()
                            .map_err(|_| malformed("a bad Content-Length"))?,
                    );
                }
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                "connection" => self.reusable &= !value.eq_ignore_ascii_case("close"),
                "etag" => self.etag = Some(value.to_owned()),
                _ => {}
            }
        }
        // RFC 9112 6.3: these answers never have a body, whatever their head says.
        let bodiless = matches!(status, 100..=199 | 204 | 304);
        self.body = match (chunked, length) {
            _ if bodiless => Body::Done,
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
                return String::from_utf8(line).map_err(|_| malformed("a line that is not text"));
            }
            if self.received.len() > MAX_LINE {
                return Err(malformed("a line too long"));
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

#[cfg(test)]
pub(crate) mod tests {
    //! The framing against a real socket: a server thread writes each answer
    //! in the pieces given, each sent on its own, so that the client's reads
    //! end wherever a piece ends (mid-line, mid-chunk, mid-body).

    use std::io::BufRead;
    use std::net::TcpListener;
    use std::thread;

    use super::*;
    use crate::platform::clock::Moment;

    const PATIENCE: Duration = Duration::from_secs(5);

    /// Accepts one connection on `listener` and reads its request, head and
    /// body: the test server's side, ready for its answer.
    pub(crate) fn accept_request(listener: &TcpListener) -> TcpStream {
        accept_and_read(listener).0
    }

    /// [`accept_request`], with the request read (head and body) as text.
    pub(crate) fn accept_and_read(listener: &TcpListener) -> (TcpStream, String) {
        let (socket, _) = listener.accept().unwrap();
        let mut reader = io::BufReader::new(socket.try_clone().unwrap());
        let mut request = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(value) = line.strip_prefix("Content-Length: ") {
                length = value.trim().parse().unwrap();
            }
            request.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        request.push_str(&String::from_utf8_lossy(&body));
        (socket, request)
    }

    /// A connection to a one-shot server that reads one request, then sends
    /// `pieces` one at a time and closes, or with `hold` keeps the connection
    /// open and silent until the client lets it go.
    fn serving(pieces: &[&[u8]], hold: bool) -> Connection {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|piece| piece.to_vec()).collect();
        thread::spawn(move || {
            let mut socket = accept_request(&listener);
            socket.set_nodelay(true).unwrap();
            for piece in pieces {
                socket.write_all(&piece).unwrap();
                // Each piece leaves in its own segment, for a read of its own.
                thread::sleep(Duration::from_millis(5));
            }
            if hold {
                let _ = socket.read_to_end(&mut Vec::new());
            }
        });
        let address = Address {
            host: "127.0.0.1".into(),
            port,
            authority: format!("127.0.0.1:{port}"),
            tls: None,
        };
        Connection::open(&address, None, Deadline::after(PATIENCE)).unwrap()
    }

    /// The status and whole body of the answer `pieces` make up.
    fn answer(pieces: &[&[u8]]) -> (io::Result<(u16, Vec<u8>)>, Connection) {
        let mut connection = serving(pieces, false);
        let deadline = Deadline::after(PATIENCE);
        let result = connection
            .post("/v3/kv/range", &[], b"{}", deadline)
            .and_then(|status| Ok((status, connection.read_to_end(deadline)?)));
        (result, connection)
    }

    fn refused(pieces: &[&[u8]], why: &str) {
        let err = answer(pieces).0.expect_err("a malformed answer");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }

    #[test]
    fn a_body_of_a_given_length_split_anywhere() {
        let (result, connection) = answer(&[
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"ngth: 11\r\n",
            b"\r\nhello",
            b" world",
        ]);
        assert_eq!(result.unwrap(), (200, b"hello world".to_vec()));
        assert!(connection.reusable());
    }

    #[test]
    fn chunks_split_mid_size_and_mid_data_with_extensions_and_trailers() {
        let (result, connection) = answer(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"5;name=va",
            b"lue\r\nhel",
            b"lo\r\n6\r\n wor",
            b"ld\r\n0\r\nTrailer: x\r",
            b"\n\r\n",
        ]);
        assert_eq!(result.unwrap(), (200, b"hello world".to_vec()));
        assert!(connection.reusable());
    }

    #[test]
    fn a_body_without_length_is_read_until_close_and_ends_the_connection() {
        let (result, connection) = answer(&[b"HTTP/1.1 200 OK\r\n\r\n{\"a\":", b"1}"]);
        assert_eq!(result.unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert!(!connection.reusable());
    }

    #[test]
    fn a_304_has_no_body_whatever_its_head_says_and_its_etag_is_kept() {
        let (result, connection) =
            answer(&[b"HTTP/1.1 304 Not Modified\r\nETag: \"abc\"\r\nContent-Length: 10\r\n\r\n"]);
        assert_eq!(result.unwrap(), (304, Vec::new()));
        assert_eq!(connection.etag(), Some("\"abc\""));
        assert!(connection.reusable());
    }

    #[test]
    fn connection_close_and_http_1_0_are_not_reused() {
        let (result, connection) =
            answer(&[b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"]);
        assert_eq!(result.unwrap().0, 200);
        assert!(!connection.reusable());
        let (result, connection) = answer(&[b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"]);
        assert_eq!(result.unwrap().0, 200);
        assert!(!connection.reusable());
    }

    #[test]
    fn malformed_heads_and_chunks_are_refused() {
        refused(&[b"SSH-2.0-OpenSSH_9.2\r\n"], "not an HTTP response");
        refused(&[b"HTTP/1.1 OK\r\n\r\n"], "not an HTTP response");
        refused(
            &[b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"],
            "a malformed header",
        );
        refused(
            &[b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n"],
            "a bad Content-Length",
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        refused(&[chunked, b"zz\r\n"], "a bad chunk size");
        refused(&[chunked, b"2\r\nabc\r\n"], "a chunk longer than its size");
        refused(&[&vec![b'x'; MAX_LINE + 2]], "a line too long");
    }

    #[test]
    fn an_answer_cut_short_is_an_unexpected_end_and_silence_a_timeout() {
        let err = answer(&[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"])
            .0
            .expect_err("cut short");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        let mut connection = serving(&[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"], true);
        let status = connection.post("/", &[], b"{}", Deadline::after(PATIENCE));
        assert_eq!(status.unwrap(), 200);
        let started = Moment::now();
        let err = connection
            .read_to_end(Deadline::after(Duration::from_millis(100)))
            .expect_err("no body comes");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(Moment::now() - started < Duration::from_secs(2));
    }
}
