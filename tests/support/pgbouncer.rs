//! A pgbouncer of a test's own (Debian's package: `pgbouncer` on PATH, else
//! /usr/sbin/pgbouncer) on a free loopback port, in front of the test's own
//! PostgreSQL server, in transaction or session pooling. Clients log in to it
//! as to the server (SCRAM, the same user and password, from an auth file
//! that holds them); it logs in to the server with them. pgbouncer refuses to
//! run as root, so when the tests run as root it runs as the PostgreSQL
//! server's user. Killed when dropped.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use tempfile::TempDir;

use super::postgres::{PASSWORD, PostgresServer, USER};
use super::{PATIENCE, free_port, program_installed};

const DATABASE: &str = "postgres";

/// How pgbouncer lends its server connections to its clients.
#[derive(Clone, Copy, Debug)]
pub enum PoolMode {
    /// A server connection for each transaction: `LISTEN` is lost.
    Transaction,
    /// The same, each server session reset (`DISCARD ALL`) after every
    /// transaction: what one transaction prepared, the next never finds.
    TransactionReset,
    /// A server connection for each client's whole session.
    Session,
}

impl PoolMode {
    fn setting(self) -> &'static str {
        match self {
            Self::Transaction | Self::TransactionReset => "transaction",
            Self::Session => "session",
        }
    }

    fn resets_always(self) -> u8 {
        u8::from(matches!(self, Self::TransactionReset))
    }
}

pub struct Pgbouncer {
    port: u16,
    dir: TempDir,
    child: Mutex<Option<Child>>,
    _server: Arc<PostgresServer>,
}

/// Where pgbouncer is: on PATH, else where Debian puts it (not on a user's PATH).
fn program() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbouncer"))
            .find(|program| program.is_file())
    });
    on_path.or_else(|| {
        let debian = PathBuf::from("/usr/sbin/pgbouncer");
        debian.is_file().then_some(debian)
    })
}

impl Pgbouncer {
    /// A pgbouncer in front of `server` with `mode` pooling. `None` after a loud
    /// notice when pgbouncer is not installed; under `CI=true` that fails the test.
    pub fn start(server: &Arc<PostgresServer>, mode: PoolMode) -> Option<Self> {
        let Some(program) = program() else {
            program_installed("pgbouncer", "pgbouncer");
            return None;
        };
        let secret: String = server
            .client()
            .query_one(
                "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
                &[&USER],
            )
            .expect("the user's SCRAM secret")
            .get(0);
        // Another process may take the free port before pgbouncer binds it: try again.
        for _ in 0..5 {
            let bouncer = Self {
                port: free_port(),
                dir: TempDir::new().expect("temp dir"),
                child: Mutex::new(None),
                _server: Arc::clone(server),
            };
            // The auth file holds the server's SCRAM secret, as a deployment's
            // should: pgbouncer checks each client's proof with it and logs in to
            // the server with the client's keys. With the password there instead it
            // hashes it 4096 times for every client on its one thread (2.7 ms a
            // client on the 2-core machine: 2.7 s of a herd of 1000).
            let auth = bouncer.dir.path().join("users.txt");
            fs::write(&auth, format!("\"{USER}\" \"{secret}\"\n"))
                .expect("write pgbouncer's auth file");
            if let Some((uid, gid)) = server.run_as() {
                for path in [bouncer.dir.path(), &auth] {
                    nix::unistd::chown(path, Some(uid), Some(gid))
                        .expect("chown pgbouncer's files");
                }
            }
            // A herd connects at once: past the default listen_backlog of 128 the
            // kernel drops connections, each then waiting a second or more for TCP to retry.
            let config = bouncer.dir.path().join("pgbouncer.ini");
            fs::write(
                &config,
                format!(
                    "[databases]\n\
                     {DATABASE} = host={host} port={port} dbname={DATABASE}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {listen}\n\
                     unix_socket_dir =\n\
                     auth_type = scram-sha-256\n\
                     auth_file = {auth}\n\
                     pool_mode = {mode}\n\
                     server_reset_query_always = {reset}\n\
                     max_client_conn = 5000\n\
                     listen_backlog = 4096\n\
                     default_pool_size = 20\n\
                     ignore_startup_parameters = extra_float_digits\n\
                     logfile = {log}\n",
                    host = server.host(),
                    port = server.port(),
                    listen = bouncer.port,
                    auth = auth.display(),
                    mode = mode.setting(),
                    reset = mode.resets_always(),
                    log = bouncer.log_path().display(),
                ),
            )
            .expect("write pgbouncer.ini");
            let mut command = Command::new(&program);
            command
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = server.run_as() {
                command.uid(uid.as_raw()).gid(gid.as_raw());
            }
            // A thousand clients need a descriptor each: as many as this process may have.
            // SAFETY: between fork and exec the closure makes only the two async-signal-safe
            // system calls getrlimit and setrlimit, and allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    use nix::sys::resource::{Resource, getrlimit, setrlimit};
                    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
                    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
                    Ok(())
                });
            }
            let child = command.spawn().expect("spawn pgbouncer");
            *bouncer.child.lock().unwrap() = Some(child);
            if super::answers_before_exiting(&bouncer.child, || bouncer.answers()) {
                return Some(bouncer);
            }
            eprintln!(
                "pgbouncer did not start, trying another port:\n{}",
                bouncer.log()
            );
        }
        panic!("could not start pgbouncer");
    }

    /// The server's URL through pgbouncer.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// pgbouncer's log, for a failing test's message.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    /// Whether a client can log in through it and run a query.
    fn answers(&self) -> bool {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user(USER)
            .password(PASSWORD)
            .dbname(DATABASE)
            .connect_timeout(PATIENCE.min(std::time::Duration::from_secs(2)))
            .connect(postgres::NoTls)
            .and_then(|mut client| client.simple_query("SELECT 1"))
            .is_ok()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
