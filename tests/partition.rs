//! Hosts cut off from each other, in network namespaces of the test's own
//! (tests/support/netns.rs): a waiter cut off from Redis rides it out, and a
//! holder cut off from PostgreSQL or etcd stops its command before a waiter
//! elsewhere starts. Ignored by default, like the stress suite: `.ci/run`
//! runs them with `cargo test --test integration -- --ignored partition`.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::netns::Network;
use crate::support::*;

/// Redis on host 0 of `network`, as the other hosts reach it; `None` when redis-server is missing.
fn redis_on(network: &Network) -> Option<(Running, String)> {
    RedisServer::installed()?;
    let address = Network::address(0);
    let server = network
        .command(0, "redis-server")
        .args([
            "--bind",
            &address,
            "--port",
            "6379",
            "--protected-mode",
            "no",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .start();
    Some((server, format!("redis://{address}:6379")))
}

/// `lockrun SUBCOMMAND` on `host`, on the Redis at `url`.
fn lockrun_on(network: &Network, host: usize, subcommand: &[&str], url: &str) -> Command {
    let mut command = network.command(host, env!("CARGO_BIN_EXE_lockrun"));
    command
        .args(subcommand)
        .args(["--backend", "redis", "--redis-url", url]);
    command
}

#[test]
#[ignore = "partition suite: cargo test --test integration -- --ignored partition"]
fn partition_a_waiter_cut_off_from_redis_gets_the_lock_when_the_holder_leaves() {
    let Some(network) = Network::new(3) else {
        return;
    };
    let Some((_server, url)) = redis_on(&network) else {
        return;
    };
    await_answer("Redis", || lockrun_on(&network, 1, &["status"], &url));
    let scratch = Scratch::new();
    let holder_script = format!(
        "touch '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
    );
    let mut holder = lockrun_on(&network, 1, &[], &url)
        .args(["--name", "cut", "-c", &holder_script])
        .start();
    wait_for_file(&scratch.path("ready"));
    let mut waiter = lockrun_on(&network, 2, &[], &url)
        .args(["--name", "cut", "-w", "60", "--initial-delay", "0.2"])
        .args(["--max-delay", "1", "--log-format", "json", "--", "touch"])
        .arg(scratch.path("ran"))
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let events = || fs::read_to_string(scratch.path("events")).unwrap_or_default();
    wait_until("the waiter to join the line", || {
        events().contains(r#""event":"waiting""#)
    });

    network.cut(2);
    let cut = Instant::now();
    wait_until("the waiter to notice", || {
        events().contains(r#""reason":"unavailable""#)
    });
    while cut.elapsed() < Duration::from_secs(3) {
        assert!(waiter.try_wait().unwrap().is_none(), "{}", events());
        std::thread::sleep(Duration::from_millis(50));
    }
    network.join(2);

    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0), "{}", events());
    assert!(scratch.path("ran").exists());
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "partition suite: cargo test --test integration -- --ignored partition"]
fn partition_a_holder_cut_off_from_postgres_stops_before_the_next_one_starts() {
    use crate::support::postgres::PostgresServer;

    let Some(network) = Network::new(3) else {
        return;
    };
    let Some(server) = PostgresServer::start_on(&network, 0) else {
        return;
    };
    let url = server.url();
    let lockrun_on = |host: usize| {
        let mut command = network.command(host, env!("CARGO_BIN_EXE_lockrun"));
        command.args([
            "--backend",
            "postgres",
            "--postgres-url",
            &url,
            "--ttl",
            "3",
        ]);
        command
    };
    a_cut_off_holder_stops_before_the_waiter_starts(lockrun_on, &network);
}

/// A one-member etcd on host 0 of `network`, as the other hosts reach it;
/// `None` when etcd is missing.
#[cfg(feature = "etcd")]
fn etcd_on(network: &Network) -> Option<(Running, tempfile::TempDir, String)> {
    if !crate::support::etcd::installed() {
        return None;
    }
    let dir = tempfile::TempDir::new().expect("temp dir");
    let address = Network::address(0);
    let (client, peer) = (
        format!("http://{address}:12379"),
        format!("http://{address}:12380"),
    );
    let server = network
        .command(0, "etcd")
        .args(["--name", "solo", "--data-dir"])
        .arg(dir.path().join("solo.etcd"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("solo={peer}")])
        .args(["--heartbeat-interval", "25", "--election-timeout", "250"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .start();
    Some((server, dir, client))
}

#[test]
#[cfg(feature = "etcd")]
#[ignore = "partition suite: cargo test --test integration -- --ignored partition"]
fn partition_a_holder_cut_off_from_etcd_stops_before_a_waiter_elsewhere_starts() {
    let Some(network) = Network::new(3) else {
        return;
    };
    let Some((_server, _data, endpoints)) = etcd_on(&network) else {
        return;
    };
    let lockrun_on = |host: usize, subcommand: &[&str]| {
        let mut command = network.command(host, env!("CARGO_BIN_EXE_lockrun"));
        command
            .args(subcommand)
            .args(["--backend", "etcd", "--etcd-endpoints", &endpoints]);
        command
    };
    await_answer("etcd", || lockrun_on(1, &["status"]));
    a_cut_off_holder_stops_before_the_waiter_starts(
        |host| {
            let mut command = lockrun_on(host, &[]);
            command.args(["--ttl", "2"]);
            command
        },
        &network,
    );
}

/// Waits for the store to answer `status` (run by `status`) from host 1.
fn await_answer(store: &str, status: impl Fn() -> Command) {
    wait_until(&format!("{store} to answer on host 0"), || {
        let answer = status()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        answer.is_ok_and(|answer| answer.success())
    });
}

/// A holder on host 1 and a waiter on host 2 of `network`, both started with
/// `lockrun_on(host)` (the store and a short TTL); host 1 is cut off from the
/// store: its lockrun stops its command and exits 76, the waiter's command
/// starts only after the holder's is gone, and its fence is higher.
fn a_cut_off_holder_stops_before_the_waiter_starts(
    lockrun_on: impl Fn(usize) -> Command,
    network: &Network,
) {
    let scratch = Scratch::new();
    let holder_script = format!(
        "echo $LOCKRUN_FENCE > '{fence}'; echo $$ > '{pid}'; exec sleep 1000",
        fence = scratch.path("holder-fence").display(),
        pid = scratch.path("holder-pid").display(),
    );
    let mut holder = lockrun_on(1)
        .args(["--name", "cut", "--log-format", "json"])
        .args(["-c", &holder_script])
        .stderr(fs::File::create(scratch.path("holder")).unwrap())
        .start();
    let command = read_pid(&scratch.path("holder-pid"));
    // The waiter's command notes whether the holder's is still there when it starts.
    let waiter_script = format!(
        "cut -d' ' -f3 /proc/{command}/stat > '{state}' 2>/dev/null; echo $LOCKRUN_FENCE > '{fence}'",
        state = scratch.path("holder-state").display(),
        fence = scratch.path("waiter-fence").display(),
    );
    let mut waiter = lockrun_on(2)
        .args(["--name", "cut", "--log-format", "json"])
        .args(["-w", "60", "--initial-delay", "0.2", "--max-delay", "1"])
        .args(["-c", &waiter_script])
        .stderr(fs::File::create(scratch.path("waiter")).unwrap())
        .start();
    let log = |file: &str| fs::read_to_string(scratch.path(file)).unwrap_or_default();
    wait_until("the waiter to join the line", || {
        log("waiter").contains(r#""event":"waiting""#)
    });

    network.cut(1);
    assert_eq!(wait(&mut waiter).code(), Some(0), "{}", log("waiter"));
    let state = log("holder-state");
    assert!(
        state.trim().is_empty() || state.starts_with('Z'),
        "the holder's command ran on ({state:?}) when the waiter's started"
    );
    assert_eq!(wait(&mut holder).code(), Some(76), "{}", log("holder"));
    let fence = |file: &str| log(file).trim().parse::<u64>().expect("a fence");
    assert!(
        fence("waiter-fence") > fence("holder-fence"),
        "fences increase"
    );
    network.join(1);
}
