//! Test harness: real lockrun processes against real stores, with every wait bounded.

pub mod cluster;
pub mod docs;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "s3")]
pub mod moto;
pub mod netns;
#[cfg(feature = "postgres")]
pub mod pgbouncer;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod pty;
#[cfg(feature = "s3")]
pub mod s3;
pub mod sentinel;
pub mod slow;
pub mod users;

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long any single wait in a test may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A lock store for one test: the backend flags plus whatever keeps it alive.
pub struct Store {
    pub kind: &'static str,
    args: Vec<OsString>,
    _keep: Box<dyn std::any::Any>,
}

impl Store {
    /// The file backend in a fresh directory.
    pub fn file() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let args = vec![
            "--backend".into(),
            "file".into(),
            "--dir".into(),
            dir.path().into(),
        ];
        Self {
            kind: "file",
            args,
            _keep: Box::new(dir),
        }
    }

    /// The file backend in `dir`, which the caller keeps.
    pub fn file_in(dir: &Path) -> Self {
        Self {
            kind: "file",
            args: vec![
                "--backend".into(),
                "file".into(),
                "--dir".into(),
                dir.into(),
            ],
            _keep: Box::new(()),
        }
    }

    /// The Redis backend on a `redis-server` of its own; `None` (after a loud
    /// notice) when redis-server is not installed, unless `CI=true`.
    pub fn redis() -> Option<Self> {
        RedisServer::start(&[]).map(|server| Self::on_redis(&Arc::new(server)))
    }

    /// The Redis backend on `server`, which the store keeps alive.
    pub fn on_redis(server: &Arc<RedisServer>) -> Self {
        Self::on_redis_at(&server.url(), Box::new(Arc::clone(server)))
    }

    /// The Redis backend at `url`, keeping `servers` alive.
    pub fn on_redis_at(url: &str, servers: Box<dyn std::any::Any>) -> Self {
        Self {
            kind: "redis",
            args: vec![
                "--backend".into(),
                "redis".into(),
                "--redis-url".into(),
                url.into(),
            ],
            _keep: servers,
        }
    }

    /// The PostgreSQL backend on a server of its own; `None` (after a loud
    /// notice) when PostgreSQL's server is not installed, unless `CI=true`.
    pub fn postgres() -> Option<Self> {
        postgres::PostgresServer::start().map(|server| Self::on_postgres(&Arc::new(server)))
    }

    /// The PostgreSQL backend on `server`, which the store keeps alive.
    pub fn on_postgres(server: &Arc<postgres::PostgresServer>) -> Self {
        Self::on_postgres_at(&server.url(), Box::new(Arc::clone(server)))
    }

    /// The PostgreSQL backend at `url` (a pgbouncer's), keeping `servers` alive.
    #[cfg(feature = "postgres")]
    pub fn on_postgres_at(url: &str, servers: Box<dyn std::any::Any>) -> Self {
        Self {
            kind: "postgres",
            args: vec![
                "--backend".into(),
                "postgres".into(),
                "--postgres-url".into(),
                url.into(),
            ],
            _keep: servers,
        }
    }

    /// The etcd backend on an etcd of its own; `None` (after a loud notice)
    /// when etcd is not installed, unless `CI=true`.
    #[cfg(feature = "etcd")]
    pub fn etcd() -> Option<Self> {
        let server = etcd::EtcdServer::start()?;
        let url = server.url().to_owned();
        Some(Self::on_etcd(&url, Box::new(server)))
    }

    /// The etcd backend at `endpoints`, keeping `servers` alive.
    #[cfg(feature = "etcd")]
    pub fn on_etcd(endpoints: &str, servers: Box<dyn std::any::Any>) -> Self {
        Self {
            kind: "etcd",
            args: vec![
                "--backend".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints.into(),
            ],
            _keep: servers,
        }
    }

    /// The S3 backend on the test process's SeaweedFS server, under a key
    /// prefix of its own; `None` (after a loud notice) when SeaweedFS is not
    /// installed, unless `CI=true`.
    #[cfg(feature = "s3")]
    pub fn s3() -> Option<Self> {
        let server = s3::SeaweedServer::shared()?;
        Some(Self {
            kind: "s3",
            args: server
                .args(&s3::fresh_prefix())
                .into_iter()
                .map(OsString::from)
                .collect(),
            _keep: Box::new(()),
        })
    }

    /// The SQLite backend on a fresh database file.
    pub fn sqlite() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let args = vec![
            "--backend".into(),
            "sqlite".into(),
            "--db".into(),
            dir.path().join("locks.sqlite3").into(),
        ];
        Self {
            kind: "sqlite",
            args,
            _keep: Box::new(dir),
        }
    }

    /// The lock directory of a file store.
    pub fn dir(&self) -> PathBuf {
        let at = self
            .args
            .iter()
            .position(|arg| arg == "--dir")
            .expect("a file store");
        PathBuf::from(&self.args[at + 1])
    }

    /// The backend flags, for commands built by hand.
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// `lockrun BACKEND-FLAGS` with no `LOCKRUN_*` variable leaking in from the test's environment.
    pub fn lockrun(&self) -> Command {
        let mut command = lockrun();
        command.args(&self.args);
        command
    }

    /// `lockrun BACKEND-FLAGS ARGS` as words, for a command line run by another program.
    pub fn argv(&self, args: &[&str]) -> Vec<String> {
        let mut words = vec![env!("CARGO_BIN_EXE_lockrun").to_owned()];
        words.extend(
            self.args
                .iter()
                .map(|arg| arg.to_string_lossy().into_owned()),
        );
        words.extend(args.iter().map(|arg| (*arg).to_owned()));
        words
    }

    /// `lockrun release BACKEND-FLAGS`.
    pub fn release(&self) -> Command {
        let mut command = lockrun();
        command.arg("release").args(&self.args);
        command
    }

    /// `lockrun status BACKEND-FLAGS`.
    pub fn status(&self) -> Command {
        let mut command = lockrun();
        command.arg("status").args(&self.args);
        command
    }
}

/// A store for a shared test, or `None` when its server is missing (the test then passes as skipped).
pub trait MaybeStore {
    fn into_store(self) -> Option<Store>;
}

impl MaybeStore for Store {
    fn into_store(self) -> Option<Store> {
        Some(self)
    }
}

impl MaybeStore for Option<Store> {
    fn into_store(self) -> Option<Store> {
        self
    }
}

/// A `redis-server` of the test's own on a free loopback port, without
/// persistence; killed when dropped. It can be killed and restarted (empty)
/// on the same port to test what lockrun does when Redis fails.
pub struct RedisServer {
    port: u16,
    extra: Vec<String>,
    dir: TempDir,
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a server with `extra` arguments (`--requirepass x`). `None` after
    /// a loud notice when redis-server is not on PATH; under `CI=true` that fails the test.
    pub fn start(extra: &[&str]) -> Option<Self> {
        Self::installed()?;
        let extra: Vec<String> = extra.iter().map(|&arg| arg.to_owned()).collect();
        // Another process may take the free port before redis-server binds it: try again.
        for _ in 0..5 {
            let port = free_port();
            let server = Self {
                port,
                extra: extra.clone(),
                dir: TempDir::new().expect("temp dir"),
                child: Mutex::new(None),
            };
            if server.restart() {
                return Some(server);
            }
        }
        panic!("could not start redis-server");
    }

    /// `Some` when redis-server is on PATH; `None` after a loud notice when it
    /// is not, unless `CI=true`, where that fails the test.
    pub fn installed() -> Option<()> {
        program_installed("redis-server", "Redis").then_some(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, without a password.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection for inspecting the server, with the password of `--requirepass`.
    pub fn client(&self) -> redis::Connection {
        self.try_client()
            .expect("connect to the test's redis-server")
    }

    /// [`RedisServer::client`], or why not (a server changing its role may drop it).
    pub fn try_client(&self) -> redis::RedisResult<redis::Connection> {
        let url = match self.extra.iter().position(|arg| arg == "--requirepass") {
            Some(i) => format!("redis://:{}@127.0.0.1:{}", self.extra[i + 1], self.port),
            None => self.url(),
        };
        redis::Client::open(url).and_then(|client| client.get_connection_with_timeout(PATIENCE))
    }

    /// Calls per command so far, from `INFO commandstats` (commands that scripts
    /// run counted too; INFO and PING, which the harness itself sends, left out).
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.client())
            .expect("INFO commandstats");
        info.lines()
            .filter_map(|line| {
                // cmdstat_evalsha:calls=3,usec=...
                let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats.strip_prefix("calls=")?.split(',').next()?;
                Some((command.to_owned(), calls.parse().ok()?))
            })
            .filter(|(command, _)| !matches!(command.as_str(), "info" | "ping"))
            .collect()
    }

    /// The server process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// Kills the server at once (SIGKILL: no chance to save anything).
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts the server, empty, on its port; true once it answers PING.
    pub fn restart(&self) -> bool {
        self.restart_with(&[])
    }

    /// Like [`RedisServer::restart`], with `more` arguments this time (`--replicaof HOST PORT`).
    pub fn restart_with(&self, more: &[&str]) -> bool {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .args(&self.extra)
            .args(more)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id();
        *self.child.lock().unwrap() = Some(child);
        // Another test's server may have had the port first: ours then fails to bind.
        answers_before_exiting(&self.child, || self.answers_ping())
            && self.server_pid() == Some(pid)
    }

    /// The pid of the server answering on our port.
    fn server_pid(&self) -> Option<u32> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.client())
            .ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))?
            .trim()
            .parse()
            .ok()
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 64];
        // A server with a password answers -NOAUTH: it is up all the same.
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read(&mut reply).is_ok_and(|n| {
                reply[..n].starts_with(b"+PONG") || reply[..n].starts_with(b"-NOAUTH")
            })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA and a server certificate for localhost, as PEM files in `dir`:
/// `ca.pem`, `server.pem`, `server.key`.
pub fn write_certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free port")
        .port()
}

/// The lockrun binary with a clean environment for its own variables.
pub fn lockrun() -> Command {
    without_lockrun_variables(Command::new(env!("CARGO_BIN_EXE_lockrun")))
}

/// A program (`lockrun` itself unless the caller adds another: `sh -c ...`,
/// with `$lockrun` set) in a mount namespace of its own where the test's
/// directories `run_lock` and `var_tmp` stand in for `/run/lock` and
/// `/var/tmp`, where the default lock directories are, so that a test of them
/// never touches the machine's. `None`, after saying why, where this process
/// may not make one (it is not root, or lacks `CAP_SYS_ADMIN`).
pub fn with_default_dirs_in(run_lock: &Path, var_tmp: &Path) -> Option<Command> {
    let unshare = ["--mount", "--propagation", "private"];
    let allowed = Command::new("unshare")
        .args(unshare)
        .arg("true")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !allowed {
        eprintln!(
            "\n*** SKIPPED: no private mount namespace for the default lock directories \
             (unshare --mount needs root), so this test did not run ***\n"
        );
        return None;
    }
    let mut command = Command::new("unshare");
    command
        .args(unshare)
        .args([
            "--",
            "sh",
            "-c",
            "mount --bind \"$1\" /run/lock && mount --bind \"$2\" /var/tmp || exit 125; shift 2; exec \"$@\"",
            "sh",
        ])
        .arg(run_lock)
        .arg(var_tmp)
        .env("lockrun", env!("CARGO_BIN_EXE_lockrun"));
    Some(without_lockrun_variables(command))
}

/// `lockrun` in a pid namespace of its own, where its pid means nothing to a
/// lockrun outside it, as on another host; `None`, after saying why, where this
/// process may not make one.
pub fn lockrun_in_a_pid_namespace() -> Option<Command> {
    let mut command = in_a_pid_namespace()?;
    command.arg(env!("CARGO_BIN_EXE_lockrun"));
    Some(command)
}

/// A program the caller adds, as PID 1 of a pid namespace of its own (with
/// `$lockrun` set), as in a container; `None`, after saying why, where this
/// process may not make one.
pub fn in_a_pid_namespace() -> Option<Command> {
    let namespace = ["--pid", "--fork", "--kill-child", "--mount-proc"];
    let probe = Command::new("unshare").args(namespace).arg("true").output();
    if !probe.is_ok_and(|output| output.status.success()) {
        eprintln!("SKIPPED: unshare(1) cannot make a pid namespace here (it needs privileges)");
        return None;
    }
    let mut command = Command::new("unshare");
    command
        .args(namespace)
        .env("lockrun", env!("CARGO_BIN_EXE_lockrun"));
    Some(without_lockrun_variables(command))
}

/// `command` without the `LOCKRUN_*` and `AWS_*` variables of the test's
/// environment, and without stdin; with the identity of the tests' S3 server.
pub fn without_lockrun_variables(mut command: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("LOCKRUN_") || key_text.starts_with("AWS_") {
            command.env_remove(key);
        }
    }
    #[cfg(feature = "s3")]
    command
        .env("AWS_ACCESS_KEY_ID", s3::KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET)
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent");
    command.stdin(Stdio::null());
    command
}

/// A process a test started. If the test ends without waiting for it (a failed
/// assertion), it is killed, so no lockrun outlives its test holding a lock:
/// SIGKILL ends lockrun, and lockrun's watchdog ends the command's group.
pub struct Running(Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `Command::spawn` for tests: the process is killed if the test forgets it.
pub trait Start {
    fn start(&mut self) -> Running;
}

impl Start for Command {
    fn start(&mut self) -> Running {
        Running(self.spawn().expect("spawn a test process"))
    }
}

/// A scratch directory for markers and logs the commands write.
pub struct Scratch(TempDir);

impl Scratch {
    pub fn new() -> Self {
        Self(TempDir::new().expect("temp dir"))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    pub fn dir(&self) -> &Path {
        self.0.path()
    }

    /// The lines of a log file (empty when it does not exist).
    pub fn lines(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.path(name))
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// A file a neighbour put in a lock directory with `content`, locked as a live
/// holder's or waiter's is for as long as the returned file is kept.
pub fn planted_lock(path: &Path, content: &str) -> fs::File {
    fs::write(path, content).expect("plant a lock file");
    let file = fs::File::open(path).expect("open the planted file");
    file.lock().expect("lock the planted file");
    file
}

/// Runs to completion within `PATIENCE`, capturing output.
pub fn run(command: &mut Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockrun");
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    if let Ok(output) = receiver.recv_timeout(PATIENCE) {
        output.expect("wait for lockrun")
    } else {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
        panic!("lockrun (pid {pid}) did not finish within {PATIENCE:?}");
    }
}

/// Waits for a spawned child within `limit`; kills it and fails the test otherwise.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn wait(child: &mut Child) -> ExitStatus {
    wait_within(child, PATIENCE)
}

/// Waits for a spawned child within `PATIENCE` and collects what it wrote to its piped stdout/stderr.
pub fn finish(mut child: Running) -> Output {
    let status = wait(&mut child);
    let mut output = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Some(mut pipe) = child.stdout.take() {
        pipe.read_to_end(&mut output.stdout).expect("read stdout");
    }
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_end(&mut output.stderr).expect("read stderr");
    }
    output
}

/// Waits until `condition` holds, failing the test after `PATIENCE`.
pub fn wait_until(what: &str, condition: impl FnMut() -> bool) {
    wait_until_within(what, PATIENCE, condition);
}

/// The pids of `name`'s waiters in line order, as `status --json` lists them.
pub fn waiting_pids(store: &Store, name: &str) -> Vec<u64> {
    let output = run(store.status().args([name, "--json"]));
    assert_status(&output, 0);
    let entries: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    entries
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["state"] == "waiting")
        .map(|entry| entry["pid"].as_u64().unwrap())
        .collect()
}

/// The pids of the processes blocked on `path`'s lock, from /proc/locks.
pub fn blocked_on(path: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;

    let inode = fs::metadata(path).expect("the locked file").ino();
    let suffix = format!(":{inode} ");
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("->") && line.contains(&suffix))
        // `1: -> FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF`
        .filter_map(|line| line.split_whitespace().nth(5)?.parse().ok())
        .collect()
}

/// Waits until `condition` holds, failing the test after `limit`.
pub fn wait_until_within(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the child's piped stderr until a line contains `needle`; the rest is drained in the background.
pub fn wait_for_stderr(child: &mut Child, needle: &str) {
    let stderr = child.stderr.take().expect("stderr piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let started = Instant::now();
    loop {
        let left = PATIENCE.saturating_sub(started.elapsed());
        match receiver.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(err) => panic!("no {needle:?} on stderr within {PATIENCE:?}: {err}"),
        }
    }
}

pub fn wait_for_file(path: &Path) {
    wait_until(&format!("{} to appear", path.display()), || path.exists());
}

/// Reads a pid a command wrote to `path`, once it is there.
pub fn read_pid(path: &Path) -> i32 {
    let mut pid = None;
    wait_until(&format!("a pid in {}", path.display()), || {
        pid = fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        pid.is_some()
    });
    pid.expect("set above")
}

pub fn process_exists(pid: i32) -> bool {
    // A zombie is as good as gone: it runs no code. Field 3 of /proc/PID/stat is its state.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

pub fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), signal);
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts lockrun's exit status, showing its stderr when it differs.
pub fn assert_status(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stderr: {}",
        stderr(output)
    );
}

/// Asserts a usage error (exit 64, one line on stderr) and returns that line.
pub fn usage_line(output: &Output) -> String {
    assert_status(output, 64);
    let err = stderr(output);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    err.trim_end().to_owned()
}

/// The pid of `lockrun`'s watchdog (`lr-watchdog`, its child), once it is there.
pub fn watchdog_of(lockrun: u32) -> u32 {
    let mut watchdog = None;
    wait_until("lockrun's watchdog", || {
        watchdog = fs::read_dir("/proc").unwrap().flatten().find_map(|entry| {
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let parent: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (comm == "lr-watchdog" && parent == lockrun)
                .then(|| entry.file_name().to_string_lossy().parse::<u32>().ok())?
        });
        watchdog.is_some()
    });
    watchdog.expect("found")
}

/// A process's state letter from `/proc/PID/stat` (`R`, `S`, `T` for stopped, `Z`...).
pub fn process_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Whether `program` can be run; a loud notice when not, and under `CI=true`
/// a failure: CI must run the tests of every backend (`what`).
pub fn program_installed(program: &str, what: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        skipped(&format!("{program} is not on PATH"), what);
    }
    found
}

/// Says loudly that a `what` test did not run, and why; under `CI=true`, fails.
fn skipped(why: &str, what: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}; CI must run the {what} tests"
    );
    eprintln!("\n*** SKIPPED: {why}, so this {what} test did not run ***\n");
}

/// Whether strace can trace here (ptrace may be denied); a loud notice when
/// not, and under `CI=true` a failure: CI must run the tests that need it (`what`).
pub fn strace_traces(what: &str) -> bool {
    if !program_installed("strace", what) {
        return false;
    }
    let traces = Command::new("strace")
        .args(["-o", "/dev/null", "true"])
        .status()
        .is_ok_and(|status| status.success());
    if !traces {
        skipped("strace cannot trace here (ptrace denied?)", what);
    }
    traces
}

/// Waits (up to `PATIENCE`) for a server just started as `child` to answer;
/// false as soon as it exits.
pub fn answers_before_exiting(
    child: &Mutex<Option<Child>>,
    mut answers: impl FnMut() -> bool,
) -> bool {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        if answers() {
            return true;
        }
        let exited = child
            .lock()
            .unwrap()
            .as_mut()
            .is_none_or(|child| child.try_wait().ok().flatten().is_some());
        if exited {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    false
}
