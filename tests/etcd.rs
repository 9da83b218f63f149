//! The etcd backend (docs/backends/etcd.md: "etcd backend"): calls per run, wake-ups, keys
//! and records, leases as etcd grants them, a member or the whole cluster
//! failing, auth and secrets, and one thread while the command runs.

use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockrun::backend::etcd::link::{Client, Endpoints, Keys, Op, Txn};

use crate::core::{
    hold_after, hold_recording, losing_the_server_stops_the_holder, start_holding,
    takes_the_slot_of_a_lapsing_holder_elsewhere,
};
use crate::support::etcd::{EtcdCluster, EtcdServer};
use crate::support::*;

/// An etcd store and its server, or `None` when etcd is missing.
fn etcd() -> Option<(Store, Arc<EtcdServer>)> {
    let server = Arc::new(EtcdServer::start()?);
    let store = Store::on_etcd(server.url(), Box::new(Arc::clone(&server)));
    Some((store, server))
}

/// A store on every member of `cluster`, `first` first.
fn on_cluster(cluster: &Arc<EtcdCluster>, first: usize) -> Store {
    Store::on_etcd(&cluster.endpoints(first), Box::new(Arc::clone(cluster)))
}

fn client(endpoints: &str) -> Client {
    Client::new(Endpoints::parse(endpoints).expect("endpoints"))
}

#[test]
fn an_uncontended_run_makes_three_calls() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let before = server.calls();
    assert_status(&run(store.lockrun().args(["--name", "calls", "true"])), 0);
    let mut made = server.calls();
    for (method, count) in before {
        *made.get_mut(&method).expect("counts only grow") -= count;
    }
    made.retain(|_, count| *count > 0);
    let made: Vec<(&str, u64)> = made.iter().map(|(m, c)| (m.as_str(), *c)).collect();
    assert_eq!(
        made,
        [("LeaseGrant", 1), ("LeaseRevoke", 1), ("Txn", 1)],
        "a lease, one transaction that takes the slot, the revoke that frees it"
    );
}

#[test]
fn a_busy_run_asks_about_the_holders_not_the_whole_line() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "busy", &[]);
    let mut waiters: Vec<Running> = (0..8)
        .map(|_| {
            store
                .lockrun()
                .args(["--name", "busy", "-w", "60", "true"])
                .start()
        })
        .collect();
    wait_until("the waiters to join the line", || {
        let output = run(store.status().args(["busy", "--json"]));
        stdout(&output).matches(r#""state":"waiting""#).count() == 8
    });
    let asked = || server.calls().get("LeaseTimeToLive").copied().unwrap_or(0);
    let before = asked();
    let output = run(store
        .lockrun()
        .args(["--name", "busy", "--no-wait", "true"]));
    assert_status(&output, 75);
    assert!(stderr(&output).contains("busy"), "{}", stderr(&output));
    // A herd of busy runs on one name must not each ask about every place in line.
    assert_eq!(asked() - before, 1, "one lease asked about: the holder's");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
}

#[test]
fn a_waiter_starts_as_soon_as_the_holder_ends_without_polling() {
    let Some((store, _server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let mut first = hold_recording(&store, &scratch, "handoff", &[]);
    // The default --initial-delay of 1s: polling would start it 0.5 to 1.5 s late.
    let second_script = format!(
        "echo $LOCKRUN_FENCE > {fence}; touch {started}; while [ ! -e {release} ]; do sleep 0.02; done",
        started = scratch.path("second").display(),
        fence = scratch.path("second-fence").display(),
        release = scratch.path("release-second").display(),
    );
    let mut second = store
        .lockrun()
        .args(["--name", "handoff", "-w", "60", "-c", &second_script])
        .start();
    wait_until("the waiter to join the line", || {
        stdout(&run(store.status().arg("handoff"))).contains("waiting")
    });
    let released = Instant::now();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut first).code(), Some(0));
    wait_for_file(&scratch.path("second"));
    let handoff = released.elapsed();
    assert!(
        handoff < Duration::from_millis(500),
        "woken by the release, not by a retry: {handoff:?}"
    );
    // It took the slot without a call of its own; its record follows at once.
    let fence: u64 = fs::read_to_string(scratch.path("second-fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("status to show the new holder", || {
        let output = run(store.status().args(["handoff", "--json"]));
        let entries: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        entries[0]["state"] == "holding"
            && entries[0]["pid"] == second.id()
            && entries[0]["fence"] == fence
    });
    fs::write(scratch.path("release-second"), "").unwrap();
    assert_eq!(wait(&mut second).code(), Some(0));
}

/// Waiters watch and never poll (docs/backends/etcd.md: "etcd backend"): a waiter whose
/// backoff steps are 50 ms looks at the line not once while it stands still,
/// never announces a next try, and starts when the holder ends. The holder
/// runs in a pid namespace of its own, as on another host: a holder on this
/// host would be looked at every 100 ms for its process's death.
#[test]
fn a_waiter_watches_the_line_and_never_polls() {
    let Some(mut elsewhere) = lockrun_in_a_pid_namespace() else {
        return;
    };
    let Some((store, server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    elsewhere.args(store.args());
    let mut holder = start_holding(elsewhere, &scratch, "still", &[], "");
    let waiter = store
        .lockrun()
        .args(["--name", "still", "-w", "60", "-v"])
        .args(["--initial-delay", "0.05", "--max-delay", "0.05", "true"])
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the waiter to join the line", || {
        stdout(&run(store.status().arg("still"))).contains("waiting")
    });
    let looks = || server.calls().get("Range").copied().unwrap_or(0);
    let before = looks();
    // Absence takes a while to see: twenty backoff steps.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        looks() - before,
        0,
        "looks at the line while it stood still"
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    let output = finish(waiter);
    assert_status(&output, 0);
    assert!(!stderr(&output).contains("next try"), "{}", stderr(&output));
}

/// How many of `name`'s entries `status` shows waiting.
fn waiting(store: &Store, name: &str) -> usize {
    stdout(&run(store.status().args([name, "--json"])))
        .matches(r#""state":"waiting""#)
        .count()
}

/// A writer's release lets every reader waiting behind it in at once
/// (docs/backends/etcd.md: "etcd backend"): eight readers watch the writer's place, not
/// each other's, and when it goes each holds at once with a slot of its own,
/// the lowest eight, written by one transaction right after its command
/// starts, and no look at the line; they run together.
#[test]
fn a_writers_release_lets_every_reader_behind_it_in_at_once() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let mut writer = hold_recording(&store, &scratch, "shelf", &[]);
    let together = scratch.path("together");
    fs::create_dir(&together).unwrap();
    // Each reader runs until all eight do (for 10 s at most).
    let script = together_script(&together, 8);
    let readers: Vec<Running> = (0..8)
        .map(|joined| {
            // A TTL long enough that no reader looks to keep its place.
            let reader = store
                .lockrun()
                .args(["--name", "shelf", "-s", "-w", "60", "--ttl", "60"])
                .args(["-c", &script])
                .stderr(std::process::Stdio::piped())
                .start();
            wait_until("the reader to join the line", || {
                waiting(&store, "shelf") > joined
            });
            reader
        })
        .collect();
    let calls = || {
        let calls = server.calls();
        let count = |method: &str| calls.get(method).copied().unwrap_or(0);
        (count("Txn"), count("Range"))
    };
    let before = calls();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut writer).code(), Some(0));
    for reader in readers {
        assert_status(&finish(reader), 0);
    }
    let after = calls();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (8, 0),
        "one take per reader, and no look"
    );
    let mut slots: Vec<u32> = fs::read_dir(&together)
        .unwrap()
        .map(|entry| fs::read_to_string(entry.unwrap().path()).unwrap())
        .map(|slot| slot.trim().parse().unwrap())
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, (0..8).collect::<Vec<u32>>());
}

/// A reader's command: writes its `LOCKRUN_SLOT` into `dir`, then runs until
/// `count` readers have (for 10 s at most), so that they are seen together.
fn together_script(dir: &std::path::Path, count: usize) -> String {
    format!(
        "echo $LOCKRUN_SLOT > '{dir}'/$$; n=0; while [ $(ls '{dir}' | wc -l) -lt {count} ]; do \
         n=$((n+1)); [ $n -lt 1000 ] || exit 1; sleep 0.01; done",
        dir = dir.display()
    )
}

/// Readers let in together by a writer's release hold distinct slots even
/// when a reader ahead of them left the line while they waited, and another
/// joined behind (docs/guide.md: "Shared locks"): each counts its slot from
/// the readers still ahead of it when the writer goes, not when it looked.
#[test]
fn readers_let_in_after_one_ahead_left_hold_distinct_slots() {
    let Some((store, _server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let mut writer = hold_recording(&store, &scratch, "shelf", &[]);
    let together = scratch.path("together");
    fs::create_dir(&together).unwrap();
    let script = together_script(&together, 2);
    let reader = |wait: &str| {
        // A TTL long enough that no reader looks to keep its place meanwhile.
        store
            .lockrun()
            .args(["--name", "shelf", "-s", "-w", wait, "--ttl", "60"])
            .args(["-c", &script])
            .stderr(std::process::Stdio::piped())
            .start()
    };
    // It gives up after 3 s: time for the second to join behind it on a loaded host.
    let leaving = reader("3");
    wait_until("the first reader to join", || waiting(&store, "shelf") == 1);
    let second = reader("60");
    wait_until("the second reader to join", || {
        waiting(&store, "shelf") == 2
    });
    assert_status(&finish(leaving), 75);
    assert_eq!(
        waiting(&store, "shelf"),
        1,
        "the first reader left the line"
    );
    let third = reader("60");
    wait_until("the third reader to join", || waiting(&store, "shelf") == 2);
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut writer).code(), Some(0));
    for reader in [second, third] {
        assert_status(&finish(reader), 0);
    }
    let mut slots: Vec<u32> = fs::read_dir(&together)
        .unwrap()
        .map(|entry| fs::read_to_string(entry.unwrap().path()).unwrap())
        .map(|slot| slot.trim().parse().unwrap())
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1], "two readers at once, a slot each");
}

/// A sharer joining readers takes no slot that one of them may hold without
/// showing it yet (docs/guide.md: "Shared locks"): a reader let in by a
/// release writes its slot key with its first renewal, and the slot it holds
/// is not the lowest free one when a reader ahead of it has left meanwhile.
/// Here such a reader on another host (its keys written by the test) holds
/// slot 1: the joining sharer waits until the slot shows, then takes slot 0.
#[test]
fn a_sharer_joining_waits_until_a_reader_let_in_shows_its_slot() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let mut etcd = client(server.url());
    let within = Duration::from_secs(2);
    let lease = etcd.lease_grant(Duration::from_secs(60), within).unwrap();
    let place = format!("/lockrun/shelf/line/{:016x}", lease.id);
    let reader = r#""name":"shelf","token":"u","pid":1,"start_time":1,"boot_id":"another-boot","host":"elsewhere","command":"reader","parallelism":1,"mode":"shared""#;
    let let_in = format!(r#"{{{reader},"since":0}}"#);
    etcd.txn(
        &Txn::new().then(Op::put(place.as_bytes(), let_in.as_bytes(), lease.id)),
        within,
    )
    .unwrap();
    let scratch = Scratch::new();
    let slot = scratch.path("slot");
    let joining = store
        .lockrun()
        .args(["--name", "shelf", "-s", "-w", "30"])
        .args(["-c", &format!("echo $LOCKRUN_SLOT > '{}'", slot.display())])
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the sharer to join", || {
        waiting(&store, "shelf") == 2 || slot.exists()
    });
    assert!(!slot.exists(), "took a slot the reader may hold");
    let holding = format!(r#"{{"slot":1,{reader},"acquired_at":0}}"#);
    let shown = Txn::new()
        .then(Op::put(place.as_bytes(), holding.as_bytes(), lease.id))
        .then(Op::put(b"/lockrun/shelf/slot/1", b"u", lease.id));
    etcd.txn(&shown, within).unwrap();
    assert_status(&finish(joining), 0);
    assert_eq!(fs::read_to_string(&slot).unwrap().trim(), "0");
    etcd.lease_revoke(lease.id, within).unwrap();
}

/// A writer behind three readers holds only once the last of them has gone:
/// with one slot it then holds by being the oldest, without a call.
#[test]
fn a_writer_behind_readers_waits_for_the_last_of_them() {
    let Some((store, _server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let readers: Vec<(Scratch, Running)> = (0..3)
        .map(|_| {
            let reader = Scratch::new();
            let done = format!("trap 'echo reader >> {}' EXIT; ", log.display());
            let holding = hold_after(&store, &reader, "ledger", &["-s"], &done);
            (reader, holding)
        })
        .collect();
    let writer = store
        .lockrun()
        .args(["--name", "ledger", "-w", "60"])
        .args(["-c", &format!("echo writer >> {}", log.display())])
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the writer to join the line", || {
        waiting(&store, "ledger") == 1
    });
    for (reader, mut holding) in readers {
        fs::write(reader.path("release"), "").unwrap();
        assert_eq!(wait(&mut holding).code(), Some(0));
    }
    assert_status(&finish(writer), 0);
    assert_eq!(
        scratch.lines("log"),
        ["reader", "reader", "reader", "writer"]
    );
}

#[test]
fn keys_live_under_the_prefix_and_the_escaped_name_with_the_real_name_inside() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let name = "a/b c";
    let mut held = hold_recording(&store, &scratch, name, &["--prefix", "myapp"]);
    let waiter = store
        .lockrun()
        .args(["--prefix", "myapp", "--name", name, "-w", "60", "true"])
        .start();
    wait_until("the waiter to join the line", || {
        let output = run(store.status().args(["--prefix", "myapp", name, "--json"]));
        stdout(&output).contains("\"waiting\"")
    });
    let mut listing = client(server.url())
        .range(&Keys::prefix(b"/"), Duration::from_secs(2))
        .unwrap();
    // The prefix's format, put by its first claim (docs/operating.md: "Upgrading").
    let format = b"/myapp/.format/0000000001";
    assert!(listing.kvs.iter().any(|kv| kv.key == format));
    listing.kvs.retain(|kv| kv.key != format);
    let keys: Vec<String> = listing
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert_eq!(
        keys.len(),
        3,
        "holder's place and slot, waiter's place: {keys:?}"
    );
    assert!(keys[0].starts_with("/myapp/a%2Fb%20c/line/"), "{keys:?}");
    assert_eq!(keys[1], "/myapp/a%2Fb%20c/slot/0");
    assert!(keys[2].starts_with("/myapp/a%2Fb%20c/line/"), "{keys:?}");
    for kv in [&listing.kvs[0], &listing.kvs[2]] {
        let record: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
        assert_eq!(record["name"], name);
    }
    let fence: i64 = fs::read_to_string(scratch.path("fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        fence, listing.kvs[0].create_revision,
        "the fence is the place's create revision"
    );

    let output = run(store.status().args(["--prefix", "myapp", "--json"]));
    let entries: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    for entry in entries {
        assert!(entry["expires_at"].is_string(), "a lease's end: {entry}");
    }
    assert_eq!(entries[0]["fence"], fence);
    assert_eq!(
        stdout(&run(store.status().arg("--json"))).trim(),
        "[]",
        "nothing under the default prefix"
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut held).code(), Some(0));
    assert_eq!(finish(waiter).status.code(), Some(0));
}

#[test]
fn a_lease_lasts_what_etcd_grants_and_is_renewed_by_that() {
    let Some((store, _server)) = etcd() else {
        return;
    };
    // The tests' etcd grants whole seconds, at least one.
    let output = run(store.lockrun().args([
        "--name",
        "rounded",
        "--ttl",
        "0.3",
        "--log-format",
        "json",
        "--",
        "sleep",
        "1.2",
    ]));
    assert_status(&output, 0);
    let err = stderr(&output);
    let renewals = err
        .lines()
        .filter(|line| line.contains(r#""event":"renewed""#));
    let renewals: Vec<&str> = renewals.collect();
    assert!(
        (2..=5).contains(&renewals.len()),
        "about every third of the granted second: {err}"
    );
    assert!(
        renewals
            .iter()
            .all(|line| line.contains(r#""ttl_ms":1000"#)),
        "{err}"
    );
}

#[test]
fn a_crashed_holder_on_another_host_is_replaced_when_its_lease_expires() {
    let Some((store, server)) = etcd() else {
        return;
    };
    let mut etcd = client(server.url());
    let within = Duration::from_secs(2);
    let lease = etcd.lease_grant(Duration::from_secs(1), within).unwrap();
    let record = r#"{"slot":0,"name":"crash","token":"t","pid":1,"start_time":1,"boot_id":"another-boot","host":"elsewhere","command":"crashed","acquired_at":0}"#;
    let place = format!("/lockrun/crash/line/{:016x}", lease.id);
    let crashed = Txn::new()
        .then(Op::put(place.as_bytes(), record.as_bytes(), lease.id))
        .then(Op::put(b"/lockrun/crash/slot/0", b"t", lease.id));
    etcd.txn(&crashed, within).unwrap();
    takes_the_slot_of_a_lapsing_holder_elsewhere(&store, "crash");
}

#[test]
fn etcd_killed_mid_hold_stops_the_command_with_76_within_the_ttl() {
    let Some((store, server)) = etcd() else {
        return;
    };
    // A little slack past the TTL for a loaded machine.
    losing_the_server_stops_the_holder(&store, "2", Duration::from_millis(2500), || server.kill());
}

#[test]
fn release_force_revokes_the_holders_lease_and_its_lockrun_exits_76() {
    let Some((store, _server)) = etcd() else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "broken", &["--ttl", "1.5"]);
    let output = run(store.release().args(["broken", "--force"]));
    assert_status(&output, 0);
    assert!(
        stdout(&output).contains("released broken slot 0"),
        "{}",
        stdout(&output)
    );
    let broken = Instant::now();
    assert_eq!(wait(&mut holder).code(), Some(76));
    assert!(
        broken.elapsed() < Duration::from_secs(2),
        "{:?}",
        broken.elapsed()
    );
    assert!(scratch.path("stopped").exists());
    assert_status(
        &run(store.lockrun().args(["--name", "broken", "-n", "true"])),
        0,
    );
}

#[test]
fn a_member_killed_during_a_hold_leaves_the_holder_running() {
    let Some(cluster) = EtcdCluster::start().map(Arc::new) else {
        return;
    };
    // The holder's first member is the leader: its loss also forces an election.
    let leader = cluster.leader();
    let store = on_cluster(&cluster, leader);
    let scratch = Scratch::new();
    let mut held = hold_recording(&store, &scratch, "survives", &["--ttl", "2", "-v"]);
    cluster.kill(leader);
    let killed = Instant::now();
    // A new lockrun whose first member is the dead one: the failover a fresh process sees.
    let output = run(store.lockrun().args(["--name", "other", "true"]));
    assert_status(&output, 0);
    eprintln!(
        "etcd failover: a run whose first member was the killed leader took {:?}",
        killed.elapsed()
    );
    // Several renewals go to the surviving members.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!scratch.path("stopped").exists(), "the command runs on");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut held).code(), Some(0));
    let err = stderr(&finish(held));
    assert!(err.contains("renewed the lease"), "{err}");
    assert!(!err.contains("lost"), "{err}");
}

#[test]
fn a_waiter_keeps_its_place_across_a_members_loss() {
    let Some(cluster) = EtcdCluster::start().map(Arc::new) else {
        return;
    };
    let leader = cluster.leader();
    let scratch = Scratch::new();
    let held = on_cluster(&cluster, (leader + 1) % 3);
    let mut holder = hold_recording(&held, &scratch, "across", &[]);
    // The waiter watches on the leader, and a 30 s retry delay leaves its watch to notice the release.
    let waiting = on_cluster(&cluster, leader);
    let ran = scratch.path("ran");
    let mut waiter = waiting
        .lockrun()
        .args(["--name", "across", "-w", "60", "--initial-delay", "30"])
        .args(["--log-format", "json", "--", "touch"])
        .arg(&ran)
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let events = || fs::read_to_string(scratch.path("events")).unwrap_or_default();
    wait_until("the waiter to join the line", || {
        events().contains(r#""event":"waiting""#)
    });
    cluster.kill(leader);
    // Let the waiter find another member and the cluster elect a leader.
    std::thread::sleep(Duration::from_secs(1));
    let released = Instant::now();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    while !ran.exists() {
        assert!(released.elapsed() < Duration::from_secs(3), "{}", events());
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "etcd: a waiter took the slot {:?} after the release, a member lost",
        released.elapsed()
    );
    assert_eq!(wait(&mut waiter).code(), Some(0), "{}", events());
}

#[test]
fn a_wrong_password_exits_69_and_no_password_is_ever_shown() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    server.enable_auth("locker", "right-secret-8731");
    let authority = server.url().trim_start_matches("http://");
    let with_password = |password: &str| format!("http://locker:{password}@{authority}");
    let wrong = with_password("wrong-secret-4242");
    let backend = ["--backend", "etcd", "--etcd-endpoints", &wrong];
    let running = [&backend[..], &["--name", "auth", "-v", "true"]].concat();
    let status = [&["status"][..], &backend].concat();
    for args in [running, status] {
        let started = Instant::now();
        let output = run(lockrun().args(args));
        assert_status(&output, 69);
        let all = format!("{}{}", stdout(&output), stderr(&output));
        assert!(!all.contains("secret-4242"), "{all}");
        assert!(all.contains("authentication failed"), "{all}");
        assert!(all.contains("locker:***@"), "{all}");
        // Besides -v's line that says where the lock is (its password redacted), one line.
        let said = stderr(&output);
        let errors = said
            .lines()
            .filter(|line| !line.contains("the lock is in "));
        assert_eq!(errors.count(), 1, "{all}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // Right: not in events, status, or the environment's help.
    let right = with_password("right-secret-8731");
    let backend = ["--backend", "etcd", "--etcd-endpoints", &right];
    let store_args: Vec<String> = backend.iter().map(|&arg| arg.to_owned()).collect();
    let status = run(lockrun().arg("status").args(&store_args).arg("--json"));
    let runs = [
        run(lockrun()
            .args(&store_args)
            .args(["--name", "auth", "-v", "--ttl", "0.3", "--", "sleep", "0.5"])),
        run(lockrun().args(&store_args).args([
            "--name",
            "auth",
            "--log-format",
            "json",
            "-v",
            "true",
        ])),
        run(lockrun()
            .args(&store_args)
            .args(["--name", "auth", "--help"])),
        run(lockrun()
            .env("LOCKRUN_ETCD_ENDPOINTS", &right)
            .args(["--backend", "etcd", "--help"])),
        status,
    ];
    for output in &runs {
        assert!(output.status.success(), "{}", stderr(output));
        let all = format!("{}{}", stdout(output), stderr(output));
        assert!(!all.contains("secret-8731"), "{all}");
    }
}

#[test]
fn an_unreachable_cluster_is_ridden_out_until_the_timeout_then_exits_69_naming_every_endpoint() {
    let endpoints = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let started = Instant::now();
    let output = run(lockrun()
        .args(["--backend", "etcd", "--etcd-endpoints", &endpoints])
        .args(["--name", "x", "-w", "1", "--initial-delay", "0.2", "true"]));
    assert_status(&output, 69);
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    for endpoint in endpoints.split(',') {
        assert!(err.contains(endpoint), "{err}");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "{took:?}"
    );
}
