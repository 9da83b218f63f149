//! A PostgreSQL server of a test's own: a fresh data directory on a free
//! loopback port, password (SCRAM) authentication on TCP and no trust
//! anywhere, no Unix socket. It can be killed like a crashed host and started
//! again on the same data, to test that a restart loses nothing.
//!
//! initdb runs once per PostgreSQL version (and server user): its result is
//! kept under cargo's target directory and copied for every server, which is
//! far cheaper than initdb. PostgreSQL refuses to run as root, so when the
//! tests run as root the server runs as `nobody` (or a system user made for it).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::{Gid, Pid, Uid, User};
use tempfile::TempDir;

use super::netns::{Host, Network};
use super::{PATIENCE, free_port, process_exists, wait_until};

/// The superuser initdb makes, the one the tests connect as.
pub const USER: &str = "lockrun";
/// Its password; tests check that no message repeats it.
pub const PASSWORD: &str = "pg-test-s3cret";
const DATABASE: &str = "postgres";
/// Settings for a throwaway server: nothing forced to disk (the data still
/// survives a killed server, in the kernel's cache, just not a crashed host),
/// little memory (the address to listen on is given at start). Commits stay synchronous, so a
/// committed row survives a SIGKILL.
const SETTINGS: &str = "
fsync = off
full_page_writes = off
shared_buffers = 16MB
unix_socket_directories = ''
";
/// Passwords on TCP from the server's own networks too (test hosts in network
/// namespaces); initdb allows only loopback.
const HBA: &str = "host all all samenet scram-sha-256\n";
/// Bumped when SETTINGS, HBA or the initdb flags change, so that an old template is not used.
const TEMPLATE_VERSION: u32 = 2;

/// Where the server binaries are, and who runs them.
struct Installation {
    bin: PathBuf,
    /// The uid and gid to run the server as, when the tests run as root.
    user: Option<(Uid, Gid)>,
    template: PathBuf,
}

pub struct PostgresServer {
    /// The address it listens on.
    host: String,
    port: u16,
    installation: &'static Installation,
    /// Holds `data/` and the server's log.
    dir: TempDir,
    child: Mutex<Option<Child>>,
    /// `-c NAME=VALUE` settings on its command line.
    settings: Vec<String>,
    /// The test host it runs on, else this one.
    host_of: Option<Host>,
}

impl PostgresServer {
    /// Starts a server. `None` after a loud notice when PostgreSQL's server
    /// binaries are missing; under `CI=true` that fails the test.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with `settings` (`max_connections=12`) on its command line.
    pub fn start_with(settings: &[&str]) -> Option<Self> {
        Self::launch(settings, None)
    }

    /// Starts a server on test host `host` of `network`, at its address on port 5432.
    pub fn start_on(network: &Network, host: usize) -> Option<Self> {
        Self::launch(&[], Some((network.host(host), Network::address(host))))
    }

    fn launch(settings: &[&str], host_of: Option<(Host, String)>) -> Option<Self> {
        let installation = installation()?;
        let dir = TempDir::new().expect("temp dir");
        let status = Command::new("cp")
            .arg("-a")
            .arg(&installation.template)
            .arg(dir.path().join("data"))
            .status()
            .expect("run cp");
        assert!(status.success(), "copy the template data directory");
        if let Some((uid, gid)) = installation.user {
            nix::unistd::chown(dir.path(), Some(uid), Some(gid)).expect("chown the server's dir");
        }
        let (host_of, host) = match host_of {
            Some((host_of, address)) => (Some(host_of), address),
            None => (None, "127.0.0.1".to_owned()),
        };
        let mut server = Self {
            host,
            port: if host_of.is_some() { 5432 } else { free_port() },
            installation,
            dir,
            child: Mutex::new(None),
            settings: settings.iter().map(|&setting| setting.to_owned()).collect(),
            host_of,
        };
        // Another process may take the free port before the server binds it: try again.
        for _ in 0..5 {
            if server.restart() {
                return Some(server);
            }
            server.port = free_port();
        }
        panic!("could not start postgres:\n{}", server.log());
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://lockrun:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_with(USER, PASSWORD)
    }

    /// The server's URL with another user and password.
    pub fn url_with(&self, user: &str, password: &str) -> String {
        format!(
            "postgres://{user}:{password}@{}:{}/{DATABASE}",
            self.host, self.port
        )
    }

    /// A connection for setting up and inspecting what a test needs.
    pub fn client(&self) -> postgres::Client {
        self.try_client().expect("connect to the test's postgres")
    }

    /// Transactions committed or rolled back in its database so far, as
    /// `pg_stat_database` counts them: a session's when it reports them (at its
    /// end, or at most once a second). Each call's own session adds one.
    pub fn transactions(&self) -> u64 {
        let row = self
            .client()
            .query_one(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database \
                 WHERE datname = current_database()",
                &[],
            )
            .expect("pg_stat_database");
        row.get::<_, i64>(0).unsigned_abs()
    }

    /// [`PostgresServer::client`], or why not (a full server).
    pub fn try_client(&self) -> Result<postgres::Client, postgres::Error> {
        postgres::Config::new()
            .host(&self.host)
            .port(self.port)
            .user(USER)
            .password(PASSWORD)
            .dbname(DATABASE)
            .connect_timeout(PATIENCE)
            .connect(postgres::NoTls)
    }

    /// Kills the server and all its processes at once, as a crash of its host
    /// would, but with the data kept. Every backend is a process group of its
    /// own, so the postmaster is stopped (it forks no more), its children are
    /// killed, then it is.
    pub fn kill(&self) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        let postmaster = child.id().cast_signed();
        let _ = signal::kill(Pid::from_raw(postmaster), Signal::SIGSTOP);
        let children = children_of(postmaster);
        for &pid in &children {
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
        for pid in children {
            wait_until("a killed backend to be gone", || !process_exists(pid));
        }
    }

    /// Shuts the server down as `pg_ctl stop -m MODE` does (the same signal to
    /// the postmaster), waiting until it has exited; [`PostgresServer::restart`]
    /// then starts it again on its data (after `Immediate`: crash recovery).
    pub fn stop(&self, mode: Shutdown) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        let signal = match mode {
            Shutdown::Fast => Signal::SIGINT,
            Shutdown::Immediate => Signal::SIGQUIT,
        };
        let _ = signal::kill(Pid::from_raw(child.id().cast_signed()), signal);
        let started = Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > PATIENCE {
                *self.child.lock().unwrap() = Some(child);
                self.kill();
                panic!("postgres did not shut down ({mode:?}):\n{}", self.log());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Ends every session of `application_name` with `pg_terminate_backend`,
    /// as an administrator would; how many there were.
    pub fn terminate_sessions(&self, application_name: &str) -> i64 {
        self.client()
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1",
                &[&application_name],
            )
            .expect("pg_terminate_backend")
            .get(0)
    }

    /// The address it listens on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The unprivileged user the server runs as when the tests run as root
    /// (PostgreSQL refuses root); `None` when the tests' own user runs it.
    pub fn run_as(&self) -> Option<(Uid, Gid)> {
        self.installation.user
    }

    /// (Re)starts the server on its data and port (after a kill: crash
    /// recovery); true once it accepts connections.
    pub fn restart(&self) -> bool {
        self.kill();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("open the server log");
        let postgres = self.installation.bin.join("postgres");
        let mut command = match (&self.host_of, self.installation.user) {
            (None, _) => Command::new(postgres),
            // `ip netns exec` needs root: the server's user is taken on the way in.
            (Some(host), Some((uid, gid))) => {
                let mut command = host.command("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "--"])
                    .arg(postgres);
                command
            }
            (Some(host), None) => host.command(postgres),
        };
        command
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", &format!("listen_addresses={}", self.host)])
            .args(self.settings.iter().flat_map(|setting| ["-c", setting]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let (None, Some((uid, gid))) = (&self.host_of, self.installation.user) {
            command.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let child = command.spawn().expect("spawn postgres");
        let pid = child.id();
        *self.child.lock().unwrap() = Some(child);
        super::answers_before_exiting(&self.child, || self.is_ready(pid))
    }

    /// Turns TLS on with the certificate and key that [`write_certificates`]
    /// wrote to `dir`, and restarts the server.
    ///
    /// [`write_certificates`]: super::write_certificates
    pub fn use_tls(&self, dir: &Path) {
        for (from, to) in [("server.pem", "server.crt"), ("server.key", "server.key")] {
            let to = self.data().join(to);
            fs::copy(dir.join(from), &to).expect("copy the certificate or key");
            // The server refuses a key that others can read.
            fs::set_permissions(&to, fs::Permissions::from_mode(0o600)).expect("chmod");
            if let Some((uid, gid)) = self.installation.user {
                nix::unistd::chown(&to, Some(uid), Some(gid)).expect("chown");
            }
        }
        File::options()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .and_then(|mut conf| conf.write_all(b"ssl = on\n"))
            .expect("turn TLS on");
        assert!(self.restart(), "restart with TLS:\n{}", self.log());
    }

    /// The server log, for a failing test's message.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Whether postmaster `pid` says it accepts connections: the eighth line of postmaster.pid.
    fn is_ready(&self, pid: u32) -> bool {
        let Ok(status) = fs::read_to_string(self.data().join("postmaster.pid")) else {
            return false;
        };
        let lines: Vec<&str> = status.lines().collect();
        lines.first() == Some(&pid.to_string().as_str())
            && lines.get(7).is_some_and(|line| line.trim() == "ready")
    }
}

impl Drop for PostgresServer {
    /// Stops the server the fastest way (SIGQUIT: immediate shutdown), killing it if it lingers.
    fn drop(&mut self) {
        if let Some(child) = self.child.lock().unwrap().as_mut() {
            let _ = signal::kill(Pid::from_raw(child.id().cast_signed()), Signal::SIGQUIT);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(5) {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                thread::sleep(Duration::from_millis(5));
            }
        }
        self.kill();
    }
}

/// How [`PostgresServer::stop`] shuts the server down, after `pg_ctl stop -m`.
#[derive(Clone, Copy, Debug)]
pub enum Shutdown {
    /// SIGINT: sessions are ended, a checkpoint is written.
    Fast,
    /// SIGQUIT: every process quits at once; the next start recovers.
    Immediate,
}

/// The processes whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            // Field 4 of /proc/PID/stat, after the parenthesized command name.
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// The installation, found (and its template made) once per test process;
/// `None` when PostgreSQL is not installed.
fn installation() -> Option<&'static Installation> {
    static INSTALLATION: OnceLock<Option<Installation>> = OnceLock::new();
    let installation = INSTALLATION.get_or_init(|| {
        let bin = server_binaries()?;
        let user = server_user();
        let template = template(&bin, user);
        Some(Installation {
            bin,
            user,
            template,
        })
    });
    if installation.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL's initdb and postgres are not installed; CI must run the PostgreSQL tests"
        );
        eprintln!(
            "\n*** SKIPPED: PostgreSQL's server (initdb, postgres) is not installed, so this PostgreSQL test did not run ***\n"
        );
    }
    installation.as_ref()
}

/// The directory of `initdb` and `postgres`: where `initdb` on PATH really
/// is, else Debian's /usr/lib/postgresql/VERSION/bin, the newest version.
fn server_binaries() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
            .and_then(|initdb| fs::canonicalize(initdb).ok())
            .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
    });
    let debian = || {
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    };
    on_path
        .or_else(debian)
        .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
}

/// Who runs the server: `nobody` (or a system user made for it) when the
/// tests run as root, since PostgreSQL refuses root; the tests' own user otherwise.
fn server_user() -> Option<(Uid, Gid)> {
    const MADE: &str = "lockrun-postgres";
    if !Uid::effective().is_root() {
        return None;
    }
    let find = |name| User::from_name(name).ok().flatten();
    let user = find("nobody").or_else(|| find(MADE)).unwrap_or_else(|| {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                MADE,
            ])
            .status()
            .expect("run useradd");
        assert!(status.success(), "useradd {MADE}");
        find(MADE).expect("the user just made")
    });
    Some((user.uid, user.gid))
}

/// A data directory made by initdb with the tests' user and settings, made
/// once and kept under cargo's target directory for later runs.
fn template(bin: &Path, user: Option<(Uid, Gid)>) -> PathBuf {
    let version = Command::new(bin.join("initdb"))
        .arg("--version")
        .output()
        .expect("run initdb --version");
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version.split_whitespace().nth(2).unwrap_or("unknown");
    let uid = user.map_or(Uid::effective(), |(uid, _)| uid);
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("postgres-{version}-uid{uid}-v{TEMPLATE_VERSION}"));
    if kept.join("PG_VERSION").is_file() {
        return kept;
    }
    // initdb runs as the server user, so in a directory that user can reach.
    let staging = TempDir::new().expect("temp dir");
    if let Some((uid, gid)) = user {
        nix::unistd::chown(staging.path(), Some(uid), Some(gid)).expect("chown the staging dir");
    }
    let password_file = staging.path().join("password");
    fs::write(&password_file, PASSWORD).expect("write the password file");
    let data = staging.path().join("data");
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        // 1 MB WAL segments instead of 16: the template copies faster.
        .args([
            "--no-sync",
            "--no-instructions",
            "--auth=scram-sha-256",
            "--wal-segsize=1",
        ])
        .args(["--username", USER, "--encoding=UTF8", "--locale=C"])
        .arg(format!("--pwfile={}", password_file.display()))
        .stdout(Stdio::null());
    if let Some((uid, gid)) = user {
        nix::unistd::chown(&password_file, Some(uid), Some(gid)).expect("chown the password file");
        initdb.uid(uid.as_raw()).gid(gid.as_raw());
    }
    let output = initdb.output().expect("run initdb");
    assert!(
        output.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    File::options()
        .append(true)
        .open(data.join("postgresql.conf"))
        .and_then(|mut conf| conf.write_all(SETTINGS.as_bytes()))
        .expect("append the test settings");
    File::options()
        .append(true)
        .open(data.join("pg_hba.conf"))
        .and_then(|mut hba| hba.write_all(HBA.as_bytes()))
        .expect("append the test's pg_hba line");
    // Copied next to its final place, then renamed: a concurrent test process
    // sees the whole template or none.
    fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).expect("create the target's tmp dir");
    let copy = TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(copy.path().join("data"))
        .status()
        .expect("run cp");
    assert!(status.success(), "copy the new template");
    let kept_now = fs::rename(copy.path().join("data"), &kept).is_ok();
    assert!(
        kept_now || kept.join("PG_VERSION").is_file(),
        "could not keep the template at {}",
        kept.display()
    );
    kept
}

/// A TCP proxy in front of a test server that counts round trips and can
/// drop the server's notifications, as a transaction-pooling pgbouncer loses
/// them, or lose an answer (see [`Proxy::losing_answer`]). It reads the
/// server's messages, so its clients must not use TLS (`sslmode=disable`: a
/// TLS request's one-byte answer has no message frame).
pub struct Proxy {
    port: u16,
    /// Times a client spoke after the server had: round trips, connecting included.
    turns: Arc<AtomicUsize>,
    /// The command tags of the answer it lost (see [`Proxy::losing_answer`]).
    lost: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// A proxy to `server`; it forwards notifications only with `notify`.
    pub fn start(server: &PostgresServer, notify: bool) -> Self {
        Self::relaying(server, notify, None)
    }

    /// A proxy to `server` that lets the first connection's `turn`-th turn
    /// (round trip) be done but never answered: it takes in the server's
    /// whole answer, then cuts the connection; and it cuts the next
    /// connection at once. As a server that commits and then fails over, or a
    /// network that loses the answer and then the next attempt.
    pub fn losing_answer(server: &PostgresServer, turn: usize) -> Self {
        Self::relaying(server, true, Some(turn))
    }

    fn relaying(server: &PostgresServer, notify: bool, lose: Option<usize>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's port").port();
        let upstream = (server.host.clone(), server.port);
        let turns = Arc::new(AtomicUsize::new(0));
        let lost_tags = Arc::new(Mutex::new(Vec::new()));
        let (counted, losing) = (Arc::clone(&turns), Arc::clone(&lost_tags));
        thread::spawn(move || {
            for (connection, client) in listener.incoming().map_while(Result::ok).enumerate() {
                if lose.is_some() && connection == 1 {
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream.clone()) else {
                    continue;
                };
                let lose = lose.filter(|_| connection == 0);
                let lose = lose.map(|turn| (turn, Arc::clone(&losing)));
                relay(client, server, notify, lose, Arc::clone(&counted));
            }
        });
        Self {
            port,
            turns,
            lost: lost_tags,
        }
    }

    /// The command tags of the answer the proxy lost (`COMMIT` among them
    /// when a transaction was made), once it has cut that connection.
    pub fn lost_answer(&self) -> Vec<String> {
        self.lost.lock().unwrap().clone()
    }

    /// The server's URL through the proxy, without TLS.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}?sslmode=disable",
            self.port
        )
    }

    pub fn turns(&self) -> usize {
        self.turns.load(Ordering::SeqCst)
    }
}

/// Copies bytes both ways between a client and the server, message by
/// message from the server (dropping notifications unless `notify`), and
/// counts the client's turns: it speaks after the server did, with every
/// answer it had asked for come. A transaction sent at once may reach the
/// server in pieces that it starts answering before the last: the later
/// pieces are the same turn. The answer to the `lose`-th turn is taken in
/// and not passed on (its command tags kept), and the connection then cut.
fn relay(
    client: TcpStream,
    server: TcpStream,
    notify: bool,
    lose: Option<(usize, Arc<Mutex<Vec<String>>>)>,
    turns: Arc<AtomicUsize>,
) {
    let answered = Arc::new(AtomicBool::new(true));
    // This connection's turns so far.
    let own_turns = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&own_turns);
    // `ReadyForQuery` messages asked for (a Query or a Sync each) and not come yet.
    let unanswered = Arc::new(AtomicUsize::new(0));
    let (mut from_client, mut to_server) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (heard, asked) = (Arc::clone(&answered), Arc::clone(&unanswered));
    thread::spawn(move || {
        let mut requests = Requests::default();
        let mut buffer = vec![0u8; 65536];
        while let Ok(read) = from_client.read(&mut buffer) {
            if read == 0 {
                break;
            }
            if asked.load(Ordering::SeqCst) == 0 && heard.swap(false, Ordering::SeqCst) {
                turns.fetch_add(1, Ordering::SeqCst);
                counted.fetch_add(1, Ordering::SeqCst);
            }
            // Counted before the server can answer them.
            asked.fetch_add(requests.answers_asked(&buffer[..read]), Ordering::SeqCst);
            if to_server.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(std::net::Shutdown::Write);
    });
    let (mut from_server, mut to_client) = (server, client);
    thread::spawn(move || {
        let mut header = [0u8; 5];
        while from_server.read_exact(&mut header).is_ok() {
            let length = u32::from_be_bytes(header[1..].try_into().unwrap()) as usize;
            let mut body = vec![0u8; length.saturating_sub(4)];
            if from_server.read_exact(&mut body).is_err() {
                break;
            }
            // 'Z': `ReadyForQuery`.
            if header[0] == b'Z' {
                let _ = unanswered
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            }
            if let Some((_, lost)) = lose
                .as_ref()
                .filter(|(turn, _)| own_turns.load(Ordering::SeqCst) == *turn)
            {
                // 'C': `CommandComplete`, its tag a C string.
                if header[0] == b'C' {
                    let tag = body.split(|byte| *byte == 0).next().unwrap_or_default();
                    lost.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(tag).into_owned());
                }
                if unanswered.load(Ordering::SeqCst) == 0 {
                    let _ = from_server.shutdown(std::net::Shutdown::Both);
                    break;
                }
                continue;
            }
            answered.store(true, Ordering::SeqCst);
            // 'A': NotificationResponse.
            if header[0] == b'A' && !notify {
                continue;
            }
            if to_client
                .write_all(&header)
                .and_then(|()| to_client.write_all(&body))
                .is_err()
            {
                break;
            }
        }
        let _ = to_client.shutdown(std::net::Shutdown::Both);
    });
}

/// The client's side of the protocol, read as it comes: the startup
/// message (no type byte), then typed messages.
#[derive(Default)]
struct Requests {
    started: bool,
    unread: Vec<u8>,
}

impl Requests {
    /// How many `ReadyForQuery` answers the whole messages in `bytes` (and the
    /// rest of the ones before) ask for: one per Query ('Q') and Sync ('S').
    fn answers_asked(&mut self, bytes: &[u8]) -> usize {
        self.unread.extend_from_slice(bytes);
        let mut asked = 0;
        loop {
            let typed = usize::from(self.started);
            let Some(length) = self.unread.get(typed..typed + 4) else {
                return asked;
            };
            let whole = typed + u32::from_be_bytes(length.try_into().unwrap()) as usize;
            if self.unread.len() < whole {
                return asked;
            }
            if self.started && matches!(self.unread[0], b'Q' | b'S') {
                asked += 1;
            }
            self.started = true;
            self.unread.drain(..whole);
        }
    }
}
