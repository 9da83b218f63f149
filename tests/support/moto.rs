//! moto's S3 server (`PyPI`'s `moto[server]`; `.ci/run` installs it into
//! `target/venv-moto`): AWS's own answers and error codes, for single
//! requests. Its conditional writes are not atomic under concurrency, so it
//! proves nothing about races: the SeaweedFS tests do that.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// How long moto may take to serve (a second or two on an idle machine).
const START_PATIENCE: Duration = Duration::from_secs(60);

pub struct MotoServer {
    pub endpoint: String,
    port: u16,
    child: Child,
}

/// Where `moto_server` is: `LOCKRUN_TEST_MOTO`, the venv `.ci/run` makes, else `PATH`.
fn moto_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LOCKRUN_TEST_MOTO") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venv-moto/bin/moto_server");
    if venv.exists() {
        return Some(venv);
    }
    super::program_installed("moto_server", "moto (pip install 'moto[server]')")
        .then(|| PathBuf::from("moto_server"))
}

impl MotoServer {
    /// A server of the caller's own on a free loopback port; `None` (after a
    /// loud notice) when moto is missing, unless `CI=true`.
    pub fn start() -> Option<Self> {
        let program = moto_server()?;
        let port = free_port();
        let child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let server = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            child,
        };
        let since = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                since.elapsed() < START_PATIENCE,
                "moto_server did not serve"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// Makes `bucket` (moto checks no signature, so an unsigned PUT does).
    pub fn create_bucket(&self, bucket: &str) {
        let mut socket = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        write!(
            socket,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("send");
        let mut answer = String::new();
        socket.read_to_string(&mut answer).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
