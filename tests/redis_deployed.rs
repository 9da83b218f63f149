//! Redis as deployed (docs/backends/redis.md: "Redis as deployed"): a primary, a replica (or two) and
//! three Sentinels failing over under holders and waiters; `--redis-replicas`
//! without its replica; a Redis Cluster moving a held name's slot.

use std::fs;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::core::{hold, hold_recording};
use crate::support::cluster::RedisCluster;
use crate::support::sentinel::SentinelDeployment;
use crate::support::*;

const PASSWORD: &str = "sentinel-secret-5150";
/// How long acquisitions may stall while Sentinel fails over (it calls a
/// primary down after 1.5 s, then elects a leader) and the replica resyncs.
const FAILOVER: Duration = Duration::from_secs(60);

/// A run's exit status and what it said.
type Finished = (Option<i32>, String);

/// Runs of `lockrun --name failover` one after another in `workers` threads
/// until stopped, each command logging `FENCE START_NS END_NS` to `served`.
struct Workers {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    statuses: Arc<Mutex<Vec<Finished>>>,
}

impl Workers {
    fn start(store: &Store, scratch: &Scratch, workers: usize) -> Self {
        Self::start_with(lockrun, store, scratch, workers)
    }

    /// Like [`Workers::start`], each run started by `launch` (`lockrun`, or
    /// lockrun where the others cannot see its process).
    fn start_with(
        launch: fn() -> Command,
        store: &Store,
        scratch: &Scratch,
        workers: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let script = format!(
            "s=$(date +%s%N); sleep 0.1; echo \"$LOCKRUN_FENCE $s $(date +%s%N)\" >> '{}'",
            scratch.path("served").display()
        );
        let threads = (0..workers)
            .map(|_| {
                let (stop, statuses) = (Arc::clone(&stop), Arc::clone(&statuses));
                let (backend, script) = (store.args().to_vec(), script.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let child = launch()
                            .args(&backend)
                            .args(["--name", "failover", "--initial-delay", "0.2"])
                            .args(["--max-delay", "1", "-c", &script])
                            .stdout(Stdio::null())
                            .stderr(Stdio::piped())
                            .start();
                        let output = finish_within(child, FAILOVER + PATIENCE);
                        statuses
                            .lock()
                            .unwrap()
                            .push((output.status.code(), stderr(&output)));
                    }
                })
            })
            .collect();
        Self {
            stop,
            threads,
            statuses,
        }
    }

    fn stop(self) -> Vec<Finished> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a worker thread");
        }
        Arc::try_unwrap(self.statuses)
            .expect("workers gone")
            .into_inner()
            .unwrap()
    }
}

/// Like [`finish`], within `limit`.
fn finish_within(mut child: Running, limit: Duration) -> std::process::Output {
    let mut err = child.stderr.take().expect("stderr piped");
    let reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut text);
        text
    });
    let status = wait_within(&mut child, limit);
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: reader.join().unwrap_or_default(),
    }
}

/// The commands served so far: (fence, start, end), in the order they started.
fn served(scratch: &Scratch) -> Vec<(u64, u128, u128)> {
    let mut served: Vec<(u64, u128, u128)> = scratch
        .lines("served")
        .iter()
        .filter_map(|line| {
            let mut fields = line.split(' ').map(str::parse::<u128>);
            let (fence, start, end) = (fields.next()?, fields.next()?, fields.next()?);
            Some((fence.ok()? as u64, start.ok()?, end.ok()?))
        })
        .collect();
    served.sort_by_key(|&(_, start, _)| start);
    served
}

/// Waits until `more` commands were served after the `since` that had been.
fn wait_for_more_served(scratch: &Scratch, since: usize, more: usize) -> usize {
    wait_until_within("acquisitions to continue", FAILOVER, || {
        served(scratch).len() >= since + more
    });
    served(scratch).len()
}

#[test]
fn sentinel_failovers_planned_and_by_kill_grant_no_slot_twice_and_fences_only_increase() {
    let Some(deployment) = SentinelDeployment::start(Some(PASSWORD)) else {
        return;
    };
    let deployment = Arc::new(deployment);
    let store = deployment.store();
    let scratch = Scratch::new();
    let url = deployment.url();
    for (url, said) in [
        (
            url.replace("/main", "/nosuch"),
            "no Sentinel knows a primary named nosuch",
        ),
        (url.replace(PASSWORD, "wrong-5150"), "authentication failed"),
    ] {
        let started = Instant::now();
        let output = run(lockrun()
            .args(["--backend", "redis", "--redis-url", &url])
            .args(["--name", "x", "true"]));
        assert_status(&output, 69);
        assert!(stderr(&output).contains(said), "{}", stderr(&output));
        assert!(!stderr(&output).contains("5150"), "{}", stderr(&output));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    // A holder through both failovers, renewing on whichever server is the primary, and
    // only once a replica acknowledges (`--redis-replicas` 1): after a planned failover,
    // Sentinel makes the old primary a replica at its next 10 s look, so the lease
    // must outlast that (docs/backends/redis.md: "Redis as deployed").
    let holder_scratch = Scratch::new();
    let holder = hold_recording(&store, &holder_scratch, "held", &["-v", "--ttl", "60"]);
    let workers = Workers::start(&store, &scratch, 3);
    let mut count = wait_for_more_served(&scratch, 0, 5);

    let before = deployment.primary().port();
    deployment.failover();
    assert_ne!(
        deployment.primary().port(),
        before,
        "the replica was promoted"
    );
    count = wait_for_more_served(&scratch, count, 5);

    let before = deployment.primary().port();
    let killed = Instant::now();
    deployment.kill_primary();
    eprintln!(
        "sentinel: failed over and resynced {:?} after the kill",
        killed.elapsed()
    );
    assert_ne!(
        deployment.primary().port(),
        before,
        "the replica was promoted"
    );
    // Renewed since: the lease's key on the new primary has more than 60 s less the time since.
    let back = Instant::now();
    let mut primary = deployment.primary().client();
    wait_until_within("the holder to renew on the new primary", FAILOVER, || {
        let left: i64 = redis::cmd("PTTL")
            .arg("lockrun:{held}:slot:0")
            .query(&mut primary)
            .unwrap_or(-2);
        left > 60_000 - back.elapsed().as_millis() as i64
    });
    wait_for_more_served(&scratch, count, 5);

    let statuses = workers.stop();
    fs::write(holder_scratch.path("release"), "").unwrap();
    let held = finish(holder);
    let held_err = stderr(&held);
    assert_status(&held, 0);
    assert!(held_err.contains("renewed the lease"), "{held_err}");
    for (status, err) in &statuses {
        assert_eq!(*status, Some(0), "a run failed: {err}");
        assert!(!err.contains(PASSWORD), "{err}");
    }
    assert!(!held_err.contains(PASSWORD), "{held_err}");
    let served = served(&scratch);
    for pair in served.windows(2) {
        let ((fence_a, _, end_a), (fence_b, start_b, _)) = (pair[0], pair[1]);
        assert!(start_b >= end_a, "two holders at once: {pair:?}");
        assert!(fence_b > fence_a, "a fence went back: {pair:?}");
    }
    eprintln!(
        "sentinel: {} runs served through two failovers, none overlapping",
        served.len()
    );
}

/// lockrun in a pid namespace of its own, as on another host: no other run
/// can tell that its process is gone. Only where one can be made.
fn lockrun_elsewhere() -> Command {
    lockrun_in_a_pid_namespace().expect("checked by the test")
}

/// How long `fault` holds up the handoffs of four contenders on `store`,
/// each run as on a host of its own (so that none can drop another's
/// leftovers for its process being gone), with the default TTL: the longest
/// start-to-start gap from the fault on. No two runs overlap, and all exit 0.
fn longest_gap_after(store: &Store, fault: impl FnOnce()) -> Duration {
    let scratch = Scratch::new();
    let workers = Workers::start_with(lockrun_elsewhere, store, &scratch, 4);
    let count = wait_for_more_served(&scratch, 0, 5);
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    fault();
    wait_for_more_served(&scratch, count, 10);
    let statuses = workers.stop();
    for (status, err) in &statuses {
        assert_eq!(*status, Some(0), "a run failed: {err}");
    }
    let served = served(&scratch);
    let mut longest = 0;
    for pair in served.windows(2) {
        let ((_, start_a, end_a), (_, start_b, _)) = (pair[0], pair[1]);
        assert!(start_b >= end_a, "two holders at once: {pair:?}");
        if start_b >= since.as_nanos() {
            longest = longest.max(start_b - start_a);
        }
    }
    Duration::from_nanos(longest as u64)
}

/// A planned failover (`SENTINEL FAILOVER`, with two replicas) holds no
/// handoff up for a TTL (docs/backends/redis.md: "Redis as deployed"): releases and leaves
/// that the old primary took after the promotion are made again on the new
/// one, so that it holds no slot or place of a run that has gone.
#[test]
fn a_planned_failover_holds_no_handoff_up_for_a_ttl() {
    if lockrun_in_a_pid_namespace().is_none() {
        return;
    }
    let Some(deployment) = SentinelDeployment::start_with_replicas(None, 2) else {
        return;
    };
    let deployment = Arc::new(deployment);
    let longest = longest_gap_after(&deployment.store(), || deployment.failover());
    eprintln!("sentinel: the longest gap from a planned failover on: {longest:?}");
    assert!(
        longest < Duration::from_secs(8),
        "a handoff waited {longest:?} after the planned failover"
    );
}

/// A restart of a single Redis that keeps its data holds no handoff up for a
/// TTL: a holder that ends while the server is down makes its release again
/// once it is back (docs/backends/redis.md: "Redis as deployed").
#[test]
fn a_restart_holds_no_handoff_up_for_a_ttl() {
    if lockrun_in_a_pid_namespace().is_none() {
        return;
    }
    let Some(server) = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let server = Arc::new(server);
    let store = Store::on_redis(&server);
    let (mut restarted, mut held) = (false, None);
    let longest = longest_gap_after(&store, || {
        let scratch = Scratch::new();
        let holder = hold(&store, &scratch, "failover", &[]);
        server.kill();
        fs::write(scratch.path("release"), "").unwrap();
        thread::sleep(Duration::from_secs(1));
        restarted = server.restart();
        held = Some(finish(holder));
    });
    assert!(restarted, "redis-server restarts");
    let held = held.expect("the holder ran");
    assert_status(&held, 0);
    assert!(
        !stderr(&held).contains("could not release"),
        "{}",
        stderr(&held)
    );
    eprintln!("redis: the longest gap from a restart on: {longest:?}");
    assert!(
        longest < Duration::from_secs(8),
        "a handoff waited {longest:?} after the restart"
    );
}

#[test]
fn redis_replicas_without_the_replica_stops_the_holder_and_grants_nothing() {
    let Some(primary) = RedisServer::start(&[]) else {
        return;
    };
    let port = primary.port().to_string();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]).expect("a replica");
    wait_until("the replica to be in sync", || {
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut replica.client())
            .is_ok_and(|info| info.contains("master_link_status:up"))
    });
    let store = Store::on_redis(&Arc::new(primary));
    let replicas = ["--redis-replicas", "1"];
    assert_status(
        &run(store.lockrun().args(replicas).args(["--name", "r", "true"])),
        0,
    );
    let scratch = Scratch::new();
    let mut holder = hold_recording(
        &store,
        &scratch,
        "r",
        &["--redis-replicas", "1", "--ttl", "1.5", "-v"],
    );
    replica.kill();
    let killed = Instant::now();
    assert_eq!(wait(&mut holder).code(), Some(76));
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "{:?}",
        killed.elapsed()
    );
    let said = stderr(&finish(holder));
    assert!(said.contains("only 0 of the 1 replicas"), "{said}");
    // A new run rides the shortfall out until --timeout, then gives up, holding nothing.
    let output = run(store.lockrun().args(replicas).args([
        "--name",
        "r",
        "-w",
        "1",
        "--initial-delay",
        "0.2",
        "true",
    ]));
    assert_status(&output, 69);
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(stderr(&output).contains("only 0 of the 1 replicas"));
    assert_eq!(
        stdout(&run(store.status().args(["r", "--json"]))).trim(),
        "[]"
    );
    // A single node's default asks for no replica.
    assert_status(&run(store.lockrun().args(["--name", "r", "-n", "true"])), 0);
}

/// `CLUSTER name words...` on `server`.
fn cluster_cmd<T: redis::FromRedisValue>(server: &RedisServer, words: &[&str]) -> T {
    redis::cmd("CLUSTER")
        .arg(words)
        .query(&mut server.client())
        .expect("a CLUSTER command")
}

#[test]
fn a_cluster_spreads_names_over_its_primaries_and_status_and_release_read_them_all() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let store = cluster.store();
    let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let scratches: Vec<Scratch> = names.iter().map(|_| Scratch::new()).collect();
    let holders: Vec<Running> = names
        .iter()
        .zip(&scratches)
        .map(|(name, scratch)| hold_recording(&store, scratch, name, &["--ttl", "1.5"]))
        .collect();
    let with_keys = cluster
        .servers()
        .iter()
        .filter(|server| {
            redis::cmd("DBSIZE")
                .query::<u64>(&mut server.client())
                .is_ok_and(|keys| keys > 0)
        })
        .count();
    assert!(with_keys >= 2, "the names landed on {with_keys} primary");
    let listed = stdout(&run(store.status().arg("--json")));
    for name in names {
        assert!(listed.contains(&format!("\"name\":\"{name}\"")), "{listed}");
    }
    for name in names {
        let output = run(store.release().args([name, "--force"]));
        assert_status(&output, 0);
        assert!(
            stdout(&output).contains(&format!("released {name} slot 0")),
            "{}",
            stdout(&output)
        );
    }
    for mut holder in holders {
        assert_eq!(wait(&mut holder).code(), Some(76), "its lease was broken");
    }
    assert_eq!(stdout(&run(store.status().arg("--json"))).trim(), "[]");
}

#[test]
fn a_held_name_follows_its_slot_to_another_primary_by_ask_then_moved() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let store = cluster.store();
    let scratch = Scratch::new();
    let holder = hold_recording(&store, &scratch, "moving", &["--ttl", "1.5", "-v"]);
    let servers = cluster.servers();
    let slot: u16 = cluster_cmd(&servers[0], &["KEYSLOT", "lockrun:{moving}:fence"]);
    let slot = slot.to_string();
    let (source, target) = {
        let has_keys =
            |server: &&RedisServer| cluster_cmd::<u64>(server, &["COUNTKEYSINSLOT", &slot]) > 0;
        let source = servers.iter().find(has_keys).expect("the name's node");
        let target = servers.iter().find(|s| s.port() != source.port()).unwrap();
        (source, target)
    };
    let id = |server: &RedisServer| cluster_cmd::<String>(server, &["MYID"]);
    let (source_id, target_id) = (id(source), id(target));
    let evalsha_on_target = || target.command_calls().get("evalsha").copied().unwrap_or(0);
    // Half way: the keys are on the target, the source answers ASK.
    let _: () = cluster_cmd(target, &["SETSLOT", &slot, "IMPORTING", &source_id]);
    let _: () = cluster_cmd(source, &["SETSLOT", &slot, "MIGRATING", &target_id]);
    let keys: Vec<String> = cluster_cmd(source, &["GETKEYSINSLOT", &slot, "100"]);
    let port = target.port().to_string();
    let _: () = redis::cmd("MIGRATE")
        .arg(&["127.0.0.1", &port, "", "0", "5000", "KEYS"])
        .arg(&keys)
        .query(&mut source.client())
        .expect("MIGRATE");
    wait_until("a renewal asked of the target", || {
        target.command_calls().contains_key("asking") && evalsha_on_target() > 0
    });
    // Done: every node says the target serves the slot, the source answers MOVED.
    for server in [target, source] {
        let _: () = cluster_cmd(server, &["SETSLOT", &slot, "NODE", &target_id]);
    }
    let renewed = evalsha_on_target();
    wait_until("a renewal on the target after the move", || {
        evalsha_on_target() > renewed
    });
    assert_status(
        &run(store.lockrun().args(["--name", "moving", "-n", "true"])),
        75,
    );
    fs::write(scratch.path("release"), "").unwrap();
    let output = finish(holder);
    assert_status(&output, 0);
    let fence: u64 = fs::read_to_string(scratch.path("fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let output = run(store.lockrun().args([
        "--name",
        "moving",
        "-n",
        "--",
        "sh",
        "-c",
        "echo $LOCKRUN_FENCE",
    ]));
    assert_status(&output, 0);
    let next: u64 = stdout(&output).trim().parse().unwrap();
    assert!(
        next > fence,
        "fences increase across the move: {fence} then {next}"
    );
}

#[test]
fn sentinels_that_do_not_answer_are_ridden_out_until_the_timeout() {
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/main",
        free_port(),
        free_port()
    );
    let started = Instant::now();
    let output = run(lockrun()
        .args(["--backend", "redis", "--redis-url", &url])
        .args(["--name", "x", "-w", "1", "--initial-delay", "0.2", "true"]));
    assert_status(&output, 69);
    let said = stderr(&output);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("no primary found") && said.contains("connection refused"),
        "{said}"
    );
    // Each look follows the Sentinels for one call's 5 s.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(8),
        "{took:?}"
    );
}

/// A plain `redis://` URL at a Cluster node works for the names it serves;
/// a name it would send elsewhere (MOVED) exits 69 at once, saying to use
/// `redis+cluster://` (docs/backends/redis.md: "Redis as deployed"), never after --timeout.
#[test]
fn a_plain_url_at_a_cluster_node_exits_69_at_once_for_a_name_served_elsewhere() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let node = &cluster.servers()[0];
    let url = node.url();
    // The first names whose slots this node does and does not serve.
    let nodes: String = cluster_cmd(node, &["NODES"]);
    let mine = nodes.lines().find(|line| line.contains("myself")).unwrap();
    let ranges: Vec<(u16, u16)> = mine
        .split_whitespace()
        .skip(8)
        .map(|range| {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            (from.parse().unwrap(), to.parse().unwrap())
        })
        .collect();
    let serves = |name: &str| {
        let slot: u16 = cluster_cmd(node, &["KEYSLOT", &format!("lockrun:{{{name}}}:fence")]);
        ranges.iter().any(|&(from, to)| (from..=to).contains(&slot))
    };
    let names: Vec<String> = (0..50).map(|n| format!("n{n}")).collect();
    let here = names.iter().find(|name| serves(name)).unwrap();
    let elsewhere = names.iter().find(|name| !serves(name)).unwrap();
    let attempt = |name: &str| {
        let started = Instant::now();
        let output = run(lockrun()
            .args(["--backend", "redis", "--redis-url", &url, "--name", name])
            .args(["-w", "30", "true"]));
        (output, started.elapsed())
    };
    assert_status(&attempt(here).0, 0);
    let (output, took) = attempt(elsewhere);
    assert_status(&output, 69);
    let said = stderr(&output);
    assert!(said.contains("redis+cluster://"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}
