//! A Redis Cluster of the test's own: three primaries on free loopback ports
//! (and free cluster-bus ports), joined by `redis-cli --cluster create`;
//! killed when dropped.

use std::process::{Command, Stdio};
use std::sync::Arc;

use super::{RedisServer, Store, free_port, wait_until};

pub struct RedisCluster {
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// `None` after a loud notice when redis-server is missing.
    pub fn start() -> Option<Self> {
        RedisServer::installed()?;
        let servers = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start(&["--cluster-enabled", "yes", "--cluster-port", &bus])
            })
            .collect::<Option<Vec<_>>>()?;
        let nodes: Vec<String> = servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Self { servers };
        wait_until("every node to see the cluster ok", || {
            cluster.servers.iter().all(|server| {
                redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query::<String>(&mut server.client())
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        Some(cluster)
    }

    /// `redis+cluster://HOST:PORT,...`: every node, or the first `seeds` of them.
    pub fn url(&self, seeds: usize) -> String {
        let nodes: Vec<String> = self.servers[..seeds]
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The Redis backend on this cluster, seeded with one node only, which the store keeps alive.
    pub fn store(self: &Arc<Self>) -> Store {
        Store {
            kind: "redis",
            args: vec![
                "--backend".into(),
                "redis".into(),
                "--redis-url".into(),
                self.url(1).into(),
            ],
            _keep: Box::new(Arc::clone(self)),
        }
    }
}

impl Store {
    /// The Redis backend on a three-primary Redis Cluster of its own; `None`
    /// (after a loud notice) when redis-server is not installed, unless `CI=true`.
    pub fn redis_cluster() -> Option<Self> {
        RedisCluster::start().map(|cluster| Arc::new(cluster).store())
    }
}
