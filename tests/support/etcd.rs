//! etcd servers of the tests' own: one member, or a cluster of three, on free
//! loopback ports with data in temp dirs (never the system's 2379/2380). A
//! member can be killed (SIGKILL) and restarted with its data. One member is
//! up in 0.1 to 0.5 s and three in about 0.6 s: short heartbeats and
//! elections, small snapshots and backend quota, members started in turn.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{PATIENCE, free_port, wait_until};

/// A certificate and key the member serves `https://` with.
#[derive(Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One etcd process and everything it needs to be started again.
struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    /// Plain HTTP `/health`, also for a member that serves its clients over TLS.
    metrics_port: u16,
    initial_cluster: String,
    data_dir: PathBuf,
    log: PathBuf,
    tls: Option<Tls>,
    /// More flags for etcd.
    flags: Vec<String>,
    child: Mutex<Option<Child>>,
}

impl Member {
    fn new(name: &str, dir: &Path, tls: Option<Tls>, flags: &[&str]) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        Self {
            name: name.to_owned(),
            client_url: format!("{scheme}://127.0.0.1:{}", free_port()),
            initial_cluster: format!("{name}={peer_url}"),
            peer_url,
            metrics_port: free_port(),
            data_dir: dir.join(format!("{name}.etcd")),
            log: dir.join(format!("{name}.log")),
            tls,
            flags: flags.iter().map(|&flag| flag.to_owned()).collect(),
            child: Mutex::new(None),
        }
    }

    fn spawn(&self) {
        let mut command = Command::new("etcd");
        command
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &self.client_url])
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.initial_cluster])
            .arg("--listen-metrics-urls")
            .arg(format!("http://127.0.0.1:{}", self.metrics_port))
            // Fast elections, yet slow enough that a busy 2-core machine keeps its leader.
            .args(["--heartbeat-interval", "25", "--election-timeout", "250"])
            .args(["--snapshot-count", "1000"])
            .args(["--quota-backend-bytes", &(64 << 20).to_string()])
            .args(["--logger", "zap", "--log-outputs"])
            .arg(&self.log)
            .args(&self.flags);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        *self.child.lock().unwrap() = Some(child);
    }

    fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to the member's process (SIGSTOP: it freezes, as in a
    /// VM pause or a long GC; SIGCONT: it goes on).
    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = self.child.lock().unwrap().as_ref() {
            super::signal(child.id(), signal);
        }
    }

    fn exited(&self) -> bool {
        self.child
            .lock()
            .unwrap()
            .as_mut()
            .is_none_or(|child| child.try_wait().ok().flatten().is_some())
    }

    /// Whether the member has a leader and serves (etcd's `/health`). Asked
    /// again rather than waited for: a check that came too early can hang for
    /// a second, the next one answers at once.
    fn healthy(&self) -> bool {
        let patience = Duration::from_millis(100);
        request(self.metrics_port, "GET", "/health", "", patience)
            .is_some_and(|(status, body)| status == 200 && body.contains(r#""health":"true""#))
    }

    fn serves_peers(&self) -> bool {
        let patience = Duration::from_millis(100);
        request(port_of(&self.peer_url), "GET", "/members", "", patience).is_some()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `members` and waits until each has a leader. False when one exits
/// first (another process took its port) or none is elected in time.
fn start_all(members: &[Member]) -> bool {
    for member in members {
        member.spawn();
        // A new member asks the others whether it joined before, and waits a
        // second for each one that has bound its peer port but does not serve
        // yet: starting them one after another saves up to two seconds.
        let started = Instant::now();
        while !member.serves_peers() {
            if member.exited() || started.elapsed() > PATIENCE {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
    wait_healthy(members)
}

fn wait_healthy(members: &[Member]) -> bool {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        if members.iter().any(Member::exited) {
            return false;
        }
        if members.iter().all(Member::healthy) {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Whether etcd can be run (see [`super::program_installed`]).
pub fn installed() -> bool {
    super::program_installed("etcd", "etcd")
}

/// Members on fresh ports and data dirs, started; tried again on other ports
/// when a port was taken. `None` when etcd is not installed.
fn start_members(
    names: &[&str],
    tls: Option<&Tls>,
    flags: &[&str],
) -> Option<(TempDir, Vec<Member>)> {
    if !installed() {
        return None;
    }
    for _ in 0..5 {
        let dir = TempDir::new().expect("temp dir");
        let mut members: Vec<Member> = names
            .iter()
            .map(|name| Member::new(name, dir.path(), tls.cloned(), flags))
            .collect();
        // Each member knows its own `name=peer-url`; all of them need the whole list.
        let initial_cluster = members
            .iter()
            .map(|member| member.initial_cluster.clone())
            .collect::<Vec<_>>()
            .join(",");
        for member in &mut members {
            member.initial_cluster.clone_from(&initial_cluster);
        }
        if start_all(&members) {
            return Some((dir, members));
        }
        let failed = members.iter().find(|member| member.exited());
        eprintln!(
            "etcd did not start, trying other ports: {}",
            failed.unwrap_or(&members[0]).log_tail()
        );
    }
    panic!("could not start etcd");
}

/// A single-member etcd; killed when dropped.
pub struct EtcdServer {
    member: Member,
    _dir: TempDir,
}

impl EtcdServer {
    /// `None` (after a loud notice) when etcd is not installed, unless `CI=true`.
    pub fn start() -> Option<Self> {
        Self::start_with(None, &[])
    }

    /// A member that serves its clients over TLS when given `tls`, started with more `flags`.
    pub fn start_with(tls: Option<&Tls>, flags: &[&str]) -> Option<Self> {
        let (dir, mut members) = start_members(&["solo"], tls, flags)?;
        Some(Self {
            member: members.pop().expect("one member"),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> &str {
        &self.member.client_url
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        port_of(&self.member.client_url)
    }

    /// Kills the server at once (SIGKILL).
    pub fn kill(&self) {
        self.member.kill();
    }

    /// Starts the server again on its ports, with its data; waits until it serves.
    pub fn restart(&self) {
        self.member.kill();
        assert!(
            start_all(std::slice::from_ref(&self.member)),
            "etcd did not restart: {}",
            self.member.log_tail()
        );
    }

    /// How many calls of each kind (`LeaseGrant`, `Txn`, ...) the server has
    /// begun since it started, gRPC streams included, from its metrics.
    pub fn calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.metrics()
            .lines()
            .filter_map(|line| line.strip_prefix("grpc_server_started_total{"))
            .filter_map(|line| {
                let (labels, count) = line.split_once("} ")?;
                let method = labels
                    .split(',')
                    .find_map(|label| label.strip_prefix("grpc_method=\"")?.strip_suffix('"'))?;
                Some((method.to_owned(), count.trim().parse().ok()?))
            })
            .filter(|&(_, count)| count > 0)
            .collect()
    }

    /// Its metrics, in Prometheus's text format.
    pub fn metrics(&self) -> String {
        let (_, metrics) = request(self.member.metrics_port, "GET", "/metrics", "", PATIENCE)
            .expect("etcd's metrics");
        metrics
    }

    /// Turns auth on: a root user, and `user` with `password` allowed to read
    /// and write every key, through the gateway as an operator would.
    pub fn enable_auth(&self, user: &str, password: &str) {
        let port = self.port();
        let all_keys = r#""key":"AA==","range_end":"AA==""#;
        for (path, body) in [
            (
                "/v3/auth/user/add",
                r#"{"name":"root","password":"root-pw"}"#.to_owned(),
            ),
            (
                "/v3/auth/user/grant",
                r#"{"user":"root","role":"root"}"#.to_owned(),
            ),
            ("/v3/auth/role/add", r#"{"name":"locks"}"#.to_owned()),
            (
                "/v3/auth/role/grant",
                format!(r#"{{"name":"locks","perm":{{"permType":"READWRITE",{all_keys}}}}}"#),
            ),
            (
                "/v3/auth/user/add",
                format!(r#"{{"name":"{user}","password":"{password}"}}"#),
            ),
            (
                "/v3/auth/user/grant",
                format!(r#"{{"user":"{user}","role":"locks"}}"#),
            ),
            ("/v3/auth/enable", "{}".to_owned()),
        ] {
            let answer = request(port, "POST", path, &body, PATIENCE);
            assert!(
                answer.as_ref().is_some_and(|(status, _)| *status == 200),
                "{path}: {answer:?}"
            );
        }
    }
}

/// Three etcd members on loopback; any one can be killed and restarted.
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// `None` (after a loud notice) when etcd is not installed, unless `CI=true`.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// A cluster whose members get more `flags`, which win over the harness's
    /// own (`--election-timeout 1000`: etcd's default, for elections as long as in production).
    pub fn start_with(flags: &[&str]) -> Option<Self> {
        let (dir, members) = start_members(&["m0", "m1", "m2"], None, flags)?;
        Some(Self { members, _dir: dir })
    }

    /// Every member's client URL, comma-separated, `first` first.
    pub fn endpoints(&self, first: usize) -> String {
        let mut urls: Vec<&str> = self
            .members
            .iter()
            .map(|member| member.client_url.as_str())
            .collect();
        urls.rotate_left(first);
        urls.join(",")
    }

    /// The member that leads the cluster now, as its members see it.
    pub fn leader(&self) -> usize {
        let status = |member: &Member| -> Option<(String, String)> {
            let port = port_of(&member.client_url);
            let (_, body) = request(port, "POST", "/v3/maintenance/status", "{}", PATIENCE)?;
            let status: serde_json::Value = serde_json::from_str(&body).ok()?;
            let id = status["header"]["member_id"].as_str()?.to_owned();
            Some((id, status["leader"].as_str()?.to_owned()))
        };
        let mut leader = None;
        wait_until("the cluster to agree on a leader", || {
            leader = self
                .members
                .iter()
                .position(|member| status(member).is_some_and(|(id, leader)| id == leader));
            leader.is_some()
        });
        leader.expect("found above")
    }

    pub fn kill(&self, member: usize) {
        self.members[member].kill();
    }

    /// Freezes a member (SIGSTOP): it neither answers nor leads, nor knows it.
    pub fn pause(&self, member: usize) {
        self.members[member].signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a paused member go on (SIGCONT); waits until it has a leader again.
    pub fn resume(&self, member: usize) {
        let member = &self.members[member];
        member.signal(nix::sys::signal::Signal::SIGCONT);
        assert!(
            wait_healthy(std::slice::from_ref(member)),
            "etcd member {} did not come back: {}",
            member.name,
            member.log_tail()
        );
    }

    /// Starts a killed member again with its data; waits until it has a leader.
    pub fn restart(&self, member: usize) {
        let member = &self.members[member];
        member.kill();
        assert!(
            start_all(std::slice::from_ref(member)),
            "etcd member {} did not restart: {}",
            member.name,
            member.log_tail()
        );
    }
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a URL with a port")
}

/// One plain HTTP/1.0 request to a loopback port (so the answer ends when the
/// connection closes): its status and body, `None` when nothing answered within `patience`.
fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    patience: Duration,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(patience)).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}
