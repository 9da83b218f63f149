//! Test hosts on this machine: network namespaces joined by a bridge that
//! lives in a namespace of its own, with addresses only inside them, so that
//! nothing a test sends leaves the machine. Each host also gets a host name of
//! its own (a UTS namespace per command), so lockrun sees different hosts.
//! A host can be cut off from the others (its port on the bridge goes down:
//! packets vanish, as in a real partition) and joined again.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct Network {
    /// Prefix of every namespace's name, unique to this network.
    id: String,
    hosts: usize,
}

impl Network {
    /// A network of `hosts` hosts; `None` (after saying why) when this machine
    /// cannot make one: it takes root and iproute2's `ip netns`.
    pub fn new(hosts: usize) -> Option<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !nix::unistd::geteuid().is_root() {
            eprintln!("\n*** SKIPPED: network namespaces need root ***\n");
            return None;
        }
        let network = Self {
            id: format!(
                "lr{}n{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            hosts,
        };
        let bridge = network.bridge();
        ip(&["netns", "add", &bridge]);
        in_namespace(&bridge, &["ip", "link", "add", "br0", "type", "bridge"]);
        in_namespace(&bridge, &["ip", "link", "set", "br0", "up"]);
        for host in 0..hosts {
            let namespace = network.namespace(host);
            let (inside, port) = (format!("eth{host}"), format!("port{host}"));
            ip(&["netns", "add", &namespace]);
            ip(&[
                "link", "add", &inside, "netns", &namespace, "type", "veth", "peer", "name", &port,
                "netns", &bridge,
            ]);
            in_namespace(&bridge, &["ip", "link", "set", &port, "master", "br0"]);
            in_namespace(&bridge, &["ip", "link", "set", &port, "up"]);
            let address = format!("{}/24", Self::address(host));
            in_namespace(&namespace, &["ip", "addr", "add", &address, "dev", &inside]);
            in_namespace(&namespace, &["ip", "link", "set", &inside, "up"]);
            in_namespace(&namespace, &["ip", "link", "set", "lo", "up"]);
        }
        Some(network)
    }

    /// Host `host`'s address (the same in every network: each is a world of its own).
    pub fn address(host: usize) -> String {
        format!("10.77.0.{}", host + 1)
    }

    /// `program` to run on `host`, under the host name `host-N`.
    pub fn command(&self, host: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.host(host).command(program)
    }

    /// Test host `host`, to run programs on later (while the network lasts).
    pub fn host(&self, host: usize) -> Host {
        Host {
            namespace: self.namespace(host),
            name: format!("host-{host}"),
        }
    }
    /// Cuts `host` off: whatever it sends or is sent vanishes.
    pub fn cut(&self, host: usize) {
        self.set_port(host, "down");
    }

    /// Joins `host` to the others again.
    pub fn join(&self, host: usize) {
        self.set_port(host, "up");
    }

    fn set_port(&self, host: usize, state: &str) {
        let port = format!("port{host}");
        in_namespace(&self.bridge(), &["ip", "link", "set", &port, state]);
    }

    fn namespace(&self, host: usize) -> String {
        format!("{}h{host}", self.id)
    }

    fn bridge(&self) -> String {
        format!("{}br", self.id)
    }
}

/// One test host of a [`Network`].
#[derive(Clone, Debug)]
pub struct Host {
    namespace: String,
    name: String,
}

impl Host {
    /// `program` to run on this host, under its host name.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace])
            .args([
                "unshare",
                "--uts",
                "sh",
                "-c",
                r#"hostname "$0" && exec "$@""#,
            ])
            .arg(&self.name)
            .arg(program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("LOCKRUN_") {
                command.env_remove(key);
            }
        }
        command.stdin(Stdio::null());
        command
    }
}

fn ip(args: &[&str]) {
    run_ok(Command::new("ip").args(args));
}

fn in_namespace(namespace: &str, args: &[&str]) {
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", namespace])
            .args(args),
    );
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace ends its links; processes still in it keep it alive until they exit.
        for host in 0..self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.namespace(host)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.bridge()])
            .status();
    }
}

fn run_ok(command: &mut Command) {
    let output = command.output().expect("run ip");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
