//! A Redis deployment managed by Sentinel, of the test's own: a primary, one
//! replica (or more) and three Sentinels, on free loopback ports with their files in
//! temporary directories; killed when dropped. It fails over on demand
//! (`SENTINEL FAILOVER`) or when its primary is killed with SIGKILL.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tempfile::TempDir;

use super::{
    PATIENCE, RedisServer, Store, answers_before_exiting, free_port, wait_until, wait_until_within,
};

/// The primary's name as the Sentinels know it.
pub const PRIMARY: &str = "main";
/// How long a replica may take to be in sync after a failover.
const RESYNC: Duration = Duration::from_secs(60);
/// How long a Sentinel waits for a silent primary before it calls it down.
const DOWN_AFTER_MS: u32 = 1500;

pub struct SentinelDeployment {
    servers: Vec<Arc<RedisServer>>,
    sentinels: Vec<Sentinel>,
    password: Option<String>,
}

struct Sentinel {
    port: u16,
    child: Mutex<Option<Child>>,
    _dir: TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl SentinelDeployment {
    /// Starts the servers and the Sentinels, all with `password` if given, and
    /// waits until every Sentinel knows the replica and the other Sentinels.
    /// `None` after a loud notice when redis-server or redis-sentinel is missing.
    pub fn start(password: Option<&str>) -> Option<Self> {
        Self::start_with_replicas(password, 1)
    }

    /// Like [`SentinelDeployment::start`], with `replicas` replicas.
    pub fn start_with_replicas(password: Option<&str>, replicas: usize) -> Option<Self> {
        RedisServer::installed()?;
        super::program_installed("redis-sentinel", "Redis Sentinel").then_some(())?;
        let mut args: Vec<&str> = password
            .map(|password| vec!["--requirepass", password, "--masterauth", password])
            .unwrap_or_default();
        // A replica's full sync starts at once, not after Redis's default 5 s
        // wait for more replicas: a failover's remaining replica catches up in
        // well under a second, so what a test measures is lockrun's part.
        args.extend(["--repl-diskless-sync-delay", "0"]);
        let primary = Arc::new(RedisServer::start(&args)?);
        let port = primary.port().to_string();
        let replica_args = [&args[..], &["--replicaof", "127.0.0.1", &port]].concat();
        let mut servers = vec![primary];
        for _ in 0..replicas {
            servers.push(Arc::new(RedisServer::start(&replica_args)?));
        }
        let sentinels = (0..3)
            .map(|_| Sentinel::start(servers[0].port(), password))
            .collect();
        let deployment = Self {
            servers,
            sentinels,
            password: password.map(str::to_owned),
        };
        wait_until("the Sentinels to know each other and the replicas", || {
            deployment.sentinels.iter().all(|sentinel| {
                let known = |what: &str| {
                    deployment
                        .ask(sentinel, &["SENTINEL", what, PRIMARY])
                        .map_or(0, |value| match value {
                            redis::Value::Array(items) => items.len(),
                            _ => 0,
                        })
                };
                known("SENTINELS") == 2 && known("REPLICAS") == replicas
            })
        });
        deployment.wait_for_replication();
        Some(deployment)
    }

    /// `redis+sentinel://[:PASSWORD@]HOST:PORT,.../main`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port))
            .collect();
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |password| format!(":{password}@"));
        format!("redis+sentinel://{auth}{}/{PRIMARY}", hosts.join(","))
    }

    /// The Redis backend on this deployment, which the store keeps alive.
    pub fn store(self: &Arc<Self>) -> Store {
        Store {
            kind: "redis",
            args: vec![
                "--backend".into(),
                "redis".into(),
                "--redis-url".into(),
                self.url().into(),
            ],
            _keep: Box::new(Arc::clone(self)),
        }
    }

    /// The server the Sentinels name as the primary now.
    pub fn primary(&self) -> &RedisServer {
        let port = self.named_primary().expect("a Sentinel names a primary");
        self.server(port)
    }

    /// The servers that are not the primary.
    fn replicas(&self) -> impl Iterator<Item = &RedisServer> {
        let primary = self.primary().port();
        self.servers
            .iter()
            .map(AsRef::as_ref)
            .filter(move |server| server.port() != primary)
    }

    /// `SENTINEL FAILOVER`, waiting until a replica is the primary that
    /// every Sentinel names, and the old primary a replica in sync.
    pub fn failover(&self) {
        let from = self.primary().port();
        let _ = self.ask(&self.sentinels[0], &["SENTINEL", "FAILOVER", PRIMARY]);
        self.wait_for_primary_other_than(from);
        self.wait_for_replication();
    }

    /// Kills the primary with SIGKILL, waits until the Sentinels promote a
    /// replica, and restarts the old primary, empty, as the new one's replica.
    pub fn kill_primary(&self) {
        let old = self.primary();
        old.kill();
        self.wait_for_primary_other_than(old.port());
        let port = self.primary().port().to_string();
        assert!(
            old.restart_with(&["--replicaof", "127.0.0.1", &port]),
            "the old primary restarts as a replica"
        );
        self.wait_for_replication();
    }

    fn wait_for_primary_other_than(&self, old: u16) {
        wait_until("every Sentinel to name the new primary", || {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|sentinel| {
                    self.ask(sentinel, &["SENTINEL", "get-master-addr-by-name", PRIMARY])
                        .ok()
                        .and_then(|named| port_of(&named))
                })
                .collect();
            match named[..] {
                [Some(port), ..] if port != old && named.iter().all(|&p| p == Some(port)) => {
                    role(self.server(port)).as_deref() == Some("master")
                }
                _ => false,
            }
        });
    }

    /// Waits until every replica is in sync: Sentinel makes a demoted primary
    /// a replica only at its next look, every 10 s.
    fn wait_for_replication(&self) {
        wait_until_within("the replicas to be in sync", RESYNC, || {
            self.replicas().all(|replica| {
                // One that drops the connection (Sentinel just made it a replica) is not in sync yet.
                let info: String = replica
                    .try_client()
                    .and_then(|mut client| redis::cmd("INFO").arg("replication").query(&mut client))
                    .unwrap_or_default();
                info.contains("master_link_status:up")
            })
        });
    }

    fn named_primary(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let named = self
                .ask(sentinel, &["SENTINEL", "get-master-addr-by-name", PRIMARY])
                .ok()?;
            port_of(&named)
        })
    }

    fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .expect("a server of the deployment")
    }

    fn ask(&self, sentinel: &Sentinel, words: &[&str]) -> redis::RedisResult<redis::Value> {
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |password| format!(":{password}@"));
        let client = redis::Client::open(format!("redis://{auth}127.0.0.1:{}", sentinel.port))?;
        let mut connection = client.get_connection_with_timeout(PATIENCE)?;
        let mut command = redis::cmd(words[0]);
        command.arg(&words[1..]);
        command.query(&mut connection)
    }
}

impl Sentinel {
    fn start(primary: u16, password: Option<&str>) -> Self {
        for _ in 0..5 {
            let dir = TempDir::new().expect("temp dir");
            let port = free_port();
            let auth = password.map_or(String::new(), |password| {
                format!(
                    "requirepass {password}\nsentinel auth-pass {PRIMARY} {password}\n\
                     sentinel sentinel-pass {password}\n"
                )
            });
            let config = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {PRIMARY} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {PRIMARY} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {PRIMARY} 10000\n{auth}",
                dir = dir.path().display()
            );
            let file = dir.path().join("sentinel.conf");
            fs::write(&file, config).expect("write sentinel.conf");
            let child = Command::new("redis-sentinel")
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-sentinel");
            let sentinel = Self {
                port,
                child: Mutex::new(Some(child)),
                _dir: dir,
            };
            // Another process may have had the port: then ours exits, and another is tried.
            if answers_before_exiting(&sentinel.child, || sentinel.answers(password)) {
                return sentinel;
            }
        }
        panic!("could not start redis-sentinel");
    }

    fn answers(&self, password: Option<&str>) -> bool {
        let auth = password.map_or(String::new(), |password| format!(":{password}@"));
        redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port))
            .and_then(|client| client.get_connection_with_timeout(PATIENCE))
            .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection))
            .is_ok()
    }
}

/// The port in a `SENTINEL get-master-addr-by-name` answer.
fn port_of(named: &redis::Value) -> Option<u16> {
    let redis::Value::Array(fields) = named else {
        return None;
    };
    match fields.get(1)? {
        redis::Value::BulkString(port) => std::str::from_utf8(port).ok()?.parse().ok(),
        _ => None,
    }
}

/// A server's role (`master`, `slave`), from ROLE.
fn role(server: &RedisServer) -> Option<String> {
    let reply: redis::Value = redis::cmd("ROLE").query(&mut server.client()).ok()?;
    let redis::Value::Array(fields) = reply else {
        return None;
    };
    match fields.first()? {
        redis::Value::BulkString(role) => Some(String::from_utf8_lossy(role).into_owned()),
        _ => None,
    }
}
