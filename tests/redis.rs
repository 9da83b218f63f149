//! The Redis backend (docs/backends/redis.md: "Redis backend"): round trips, wake-ups, leases when Redis or the
//! holder fails, fencing across data loss, connection errors and secrets.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::core::{
    hold, hold_recording, losing_the_server_stops_the_holder, start_holding,
    takes_the_slot_of_a_lapsing_holder_elsewhere,
};
use crate::support::*;

/// A Redis store and its server, or `None` when redis-server is missing.
fn redis(extra: &[&str]) -> Option<(Store, Arc<RedisServer>)> {
    let server = Arc::new(RedisServer::start(extra)?);
    Some((Store::on_redis(&server), server))
}

/// Slot 0 of `name` held by a crashed holder on host "elsewhere", whose lease ends in `px` ms.
fn plant_crashed_holder(server: &RedisServer, name: &str, px: u64) {
    let record = serde_json::json!({
        "name": name, "token": "t", "pid": 1, "start_time": 1, "boot_id": "another-boot",
        "host": "elsewhere", "command": "crashed", "acquired_at": 0, "fence": 5,
    });
    let _: () = redis::cmd("SET")
        .arg(format!("lockrun:{{{name}}}:slot:0"))
        .arg(record.to_string())
        .arg("PX")
        .arg(px)
        .query(&mut server.client())
        .unwrap();
}

fn info(client: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(client).expect("INFO")
}

/// A field of `INFO`, as a number.
fn info_field(client: &mut redis::Connection, section: &str, field: &str) -> u64 {
    info(client, section)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

fn nanos(path: &std::path::Path) -> i128 {
    let text = fs::read_to_string(path).expect("a timestamp");
    text.trim().parse().expect("nanoseconds")
}

fn stderr_of(child: Running) -> String {
    stderr(&finish(child))
}

#[test]
fn uncontended_acquire_and_release_are_one_round_trip_each() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    // The first run loads the scripts into the server.
    assert_status(&run(store.lockrun().args(["--name", "rt", "true"])), 0);
    let mut client = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut client)
        .unwrap();
    assert_status(&run(store.lockrun().args(["--name", "rt", "true"])), 0);
    let stats = info(&mut client, "commandstats");
    let calls = |command: &str| {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(calls("evalsha"), 2, "one script to acquire, one to release");
    // Everything else counted ran inside those two scripts (or is the test's own reset).
    let inside_scripts = [
        "evalsha",
        "exists",
        "time",
        "incr",
        "set",
        "get",
        "del",
        "lpush",
        "pexpire",
        "zrank",
        "zcard",
        "zrange",
        "zrem",
        "config|resetstat",
    ];
    for line in stats.lines().filter(|line| line.starts_with("cmdstat_")) {
        let command = line["cmdstat_".len()..].split(':').next().unwrap();
        assert!(
            inside_scripts.contains(&command),
            "a round trip of its own: {line}"
        );
    }
    assert_eq!(
        info_field(&mut client, "stats", "total_connections_received"),
        1,
        "one connection, no setup commands on it"
    );
}

#[test]
fn a_waiter_starts_as_soon_as_the_holder_ends_without_polling() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let script = format!(
        "touch {ready}; while [ ! -e {release} ]; do sleep 0.01; done; date +%s%N > {end}",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
        end = scratch.path("end").display(),
    );
    let mut first = store
        .lockrun()
        .args(["--name", "handoff", "-c", &script])
        .start();
    wait_for_file(&scratch.path("ready"));
    // The default --initial-delay of 1s: polling would start it 0.5 to 1.5 s late.
    let started = format!("date +%s%N > {}", scratch.path("start").display());
    let mut second = store
        .lockrun()
        .args(["--name", "handoff", "-w", "60", "-c", &started])
        .start();
    let mut client = server.client();
    wait_until("the waiter to block in BLPOP", || {
        info_field(&mut client, "clients", "blocked_clients") == 1
    });
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut first).code(), Some(0));
    assert_eq!(wait(&mut second).code(), Some(0));
    let handoff_ms = (nanos(&scratch.path("start")) - nanos(&scratch.path("end"))) as f64 / 1e6;
    eprintln!(
        "redis handoff: the waiter started {handoff_ms:.1} ms after the holder's command ended"
    );
    assert!(
        handoff_ms < 500.0,
        "woken by the release, not by a retry: {handoff_ms:.1} ms"
    );
}

/// A waiter sees every 100 ms whether the holder ahead of it on this host is
/// gone by looking at its process, not by asking Redis: while the holder
/// lives, the waiter runs no script (its BLPOP ends at each check and is
/// made anew, no more).
#[test]
fn a_waiter_behind_a_live_holder_on_this_host_asks_redis_nothing() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "local", &[]);
    let mut waiter = store
        .lockrun()
        .args([
            "--name",
            "local",
            "-w",
            "60",
            "--initial-delay",
            "30",
            "true",
        ])
        .start();
    let mut client = server.client();
    wait_until("the waiter to block in BLPOP", || {
        info_field(&mut client, "clients", "blocked_clients") == 1
    });
    let scripts = || server.command_calls().get("evalsha").copied().unwrap_or(0);
    let before = scripts();
    // Absence takes a while to see: ten of the 100 ms checks.
    thread::sleep(Duration::from_secs(1));
    assert_eq!(
        scripts() - before,
        0,
        "looks at the line while the holder lived"
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0));
}

#[test]
fn a_crashed_holder_on_another_host_is_replaced_when_its_lease_expires() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    plant_crashed_holder(&server, "crash", 800);
    takes_the_slot_of_a_lapsing_holder_elsewhere(&store, "crash");
}

#[test]
fn a_dead_holder_on_this_host_is_reclaimed_at_once() {
    let Some((store, _server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "dead", &[]);
    let command = read_pid(&scratch.path("ready"));
    // SIGKILL leaves the 30 s lease in Redis; the command dies with lockrun.
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_until("the command to die", || !process_exists(command));
    let output = run(store.lockrun().args(["--name", "dead", "-n", "true"]));
    assert_status(&output, 0);
}

#[test]
fn renewal_keeps_the_lease_past_its_ttl() {
    let Some((store, _server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let holder = hold_recording(&store, &scratch, "renewed", &["--ttl", "0.6", "-v"]);
    let ready = Instant::now();
    // Three TTLs: without renewal the slot would have been free after the first.
    while ready.elapsed() < Duration::from_millis(1800) {
        assert_status(
            &run(store.lockrun().args(["--name", "renewed", "-n", "true"])),
            75,
        );
        thread::sleep(Duration::from_millis(100));
    }
    fs::write(scratch.path("release"), "").unwrap();
    let err = stderr_of(holder);
    assert!(err.contains("renewed the lease"), "{err}");
    assert!(!err.contains("lost"), "{err}");
}

#[test]
fn redis_killed_mid_hold_stops_the_command_with_76_within_the_ttl() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    // Within the TTL of the last renewal; a little slack for a loaded machine.
    losing_the_server_stops_the_holder(&store, "1.5", Duration::from_secs(2), || server.kill());
}

#[test]
fn redis_restarted_empty_bounds_the_overlap_and_fences_still_increase() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut first = hold_recording(&store, &scratch, "restart", &["--ttl", "1.5"]);
    let first_fence: u64 = fs::read_to_string(scratch.path("fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(server.restart(), "redis-server restarts");
    // The lock is gone with Redis's data: a second holder gets it at once.
    let second_script = format!(
        "date +%s%N > {start}; echo $LOCKRUN_FENCE > {fence}",
        start = scratch.path("second-start").display(),
        fence = scratch.path("second-fence").display(),
    );
    let output = run(store
        .lockrun()
        .args(["--name", "restart", "-n", "-c", &second_script]));
    assert_status(&output, 0);
    assert_eq!(
        wait(&mut first).code(),
        Some(76),
        "the first holder found its lease gone"
    );
    let overlap_ms =
        (nanos(&scratch.path("stopped")) - nanos(&scratch.path("second-start"))) as f64 / 1e6;
    eprintln!("redis restart: the two holders overlapped for {overlap_ms:.0} ms (TTL 1500 ms)");
    assert!(overlap_ms < 1500.0, "overlap {overlap_ms:.0} ms");
    let second_fence: u64 = fs::read_to_string(scratch.path("second-fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        second_fence > first_fence,
        "fences increase across the data loss: {first_fence} then {second_fence}"
    );
}

#[test]
fn a_frozen_holder_loses_its_slot_and_exits_76_when_continued() {
    let Some((store, _server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "frozen", &["--ttl", "1"]);
    let command = read_pid(&scratch.path("ready"));
    // Freeze lockrun and its command, as a paused VM would.
    let groups = [
        Pid::from_raw(holder.id().cast_signed()),
        Pid::from_raw(command),
    ];
    for group in groups {
        killpg(group, Signal::SIGSTOP).unwrap();
    }
    let marker = scratch.path("second");
    let output = run(store
        .lockrun()
        .args(["--name", "frozen", "-w", "10", "--", "touch"])
        .arg(&marker));
    assert_status(&output, 0);
    for group in groups {
        // The command may be gone already: a loaded machine can delay a renewal past the stop.
        let _ = killpg(group, Signal::SIGCONT);
    }
    let continued = Instant::now();
    assert_eq!(wait(&mut holder).code(), Some(76));
    assert!(
        continued.elapsed() < Duration::from_secs(2),
        "stopped at once"
    );
}

/// Four names' renewals all come due while the server is stopped (it
/// accepts, never answers): each may take its whole call (TTL/5 = 3 s), but
/// lockrun renews one at a time and forwards a signal in between, so the
/// command gets it within about one call, not four.
#[test]
fn renewals_of_several_names_on_a_silent_server_never_hold_a_signal_up() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(
        &store,
        &scratch,
        "a",
        &["--name", "b", "--name", "c", "--name", "d", "--ttl", "15"],
    );
    let acquired = Instant::now();
    let server_pid = server.pid().expect("the server runs");
    signal(server_pid, Signal::SIGSTOP);
    // The renewals come due TTL/3 = 5 s after the names were taken: the
    // signal comes while the first of them waits for its answer.
    thread::sleep(Duration::from_millis(5500).saturating_sub(acquired.elapsed()));
    let sent = std::time::SystemTime::now();
    signal(holder.id(), Signal::SIGTERM);
    wait_for_file(&scratch.path("stopped"));
    signal(server_pid, Signal::SIGCONT);
    let stopped: u128 = fs::read_to_string(scratch.path("stopped"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sent = sent
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let delay = Duration::from_nanos((stopped.saturating_sub(sent)) as u64);
    assert!(
        delay < Duration::from_secs(4),
        "the signal came {delay:?} late"
    );
    wait(&mut holder);
}

#[test]
fn a_password_in_the_url_is_blanked_in_ps() {
    let Some((_, server)) = redis(&["--requirepass", "right-secret-8731"]) else {
        return;
    };
    let url = format!("redis://:right-secret-8731@127.0.0.1:{}", server.port());
    let store = Store::on_redis_at(&url, Box::new(server));
    crate::core::no_password_stays_in_ps(&store, "right-secret-8731");
}

#[test]
fn a_wrong_or_missing_password_exits_69_without_showing_the_secret() {
    let Some((_, server)) = redis(&["--requirepass", "right-secret-8731"]) else {
        return;
    };
    let port = server.port();
    let with_password = |password: &str| format!("redis://:{password}@127.0.0.1:{port}");
    for (url, expected) in [
        (with_password("wrong-secret-4242"), "authentication failed"),
        (
            format!("redis://default:wrong-secret-4242@127.0.0.1:{port}"),
            "authentication failed",
        ),
        (server.url(), "requires a password"),
    ] {
        let backend = ["--backend", "redis", "--redis-url", &url];
        let running = [&backend[..], &["--name", "auth", "-v", "true"]].concat();
        let status = [&["status"][..], &backend].concat();
        for args in [running, status] {
            let started = Instant::now();
            let output = run(lockrun().args(args));
            assert_status(&output, 69);
            let all = format!("{}{}", stdout(&output), stderr(&output));
            assert!(!all.contains("secret-4242"), "{all}");
            assert!(all.contains(expected), "{all}");
            // Besides -v's line that says where the lock is (its password redacted), one line.
            let said = stderr(&output);
            let errors = said
                .lines()
                .filter(|line| !line.contains("the lock is in "));
            assert_eq!(errors.count(), 1, "{all}");
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }
    let output = run(lockrun()
        .args(["--backend", "redis", "--redis-url"])
        .arg(with_password("right-secret-8731"))
        .args(["--name", "auth", "-v", "true"]));
    assert_status(&output, 0);
    assert!(
        !stderr(&output).contains("right-secret"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_unreachable_server_is_ridden_out_and_one_that_is_not_redis_exits_69_at_once() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let chatty = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://{}", silent.local_addr().unwrap());
    let chatty_url = format!("redis://{}", chatty.local_addr().unwrap());
    // Accepts and never answers.
    thread::spawn(move || {
        let kept: Vec<_> = silent.incoming().collect();
        drop(kept);
    });
    // Answers like a web server.
    thread::spawn(move || {
        for mut stream in chatty.incoming().flatten() {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let attempt = |url: &str| {
        let started = Instant::now();
        let output = run(lockrun()
            .args(["--backend", "redis", "--redis-url", url])
            .args(["--name", "x", "-w", "1", "--initial-delay", "0.2", "true"]));
        assert_status(&output, 69);
        assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
        (started.elapsed(), stderr(&output))
    };
    // Trouble that may pass: retried until --timeout, then 69 saying what the server did.
    let (took, said) = attempt(&format!("redis://127.0.0.1:{}", free_port()));
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(said.contains("connection refused"), "{said}");
    // A silent server: one call's 5 s, whatever the TTL, then the timeout has passed.
    let (took, said) = attempt(&silent_url);
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(said.contains("no answer in time"), "{said}");
    // Not Redis: waiting cannot fix that.
    let (took, said) = attempt(&chatty_url);
    assert!(took < Duration::from_secs(1), "{took:?}: {said}");
}

#[test]
fn keys_start_with_the_prefix() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let holder = hold_recording(&store, &scratch, "prefixed", &["--prefix", "myapp"]);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.client())
        .unwrap();
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(key.starts_with("myapp:{prefixed}:"), "{keys:?}");
    }
    let shown = |prefix: &str| stdout(&run(store.status().args(["--prefix", prefix, "--json"])));
    assert!(shown("myapp").contains("prefixed"));
    assert_eq!(shown("lockrun").trim(), "[]");
    fs::write(scratch.path("release"), "").unwrap();
    stderr_of(holder);
}

#[test]
fn verbose_warns_when_the_server_may_evict_lock_keys() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let output = run(store.lockrun().args(["--name", "evict", "-v", "true"]));
    assert!(!stderr(&output).contains("maxmemory-policy"));
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut server.client())
        .unwrap();
    let output = run(store.lockrun().args(["--name", "evict", "-v", "true"]));
    assert_status(&output, 0);
    assert!(
        stderr(&output).contains("maxmemory-policy allkeys-lru"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn rediss_connects_with_tls_and_refuses_an_unknown_certificate() {
    let scratch = Scratch::new();
    write_certificates(scratch.dir());
    let tls_port = free_port().to_string();
    let file = |name: &str| scratch.path(name).display().to_string();
    let (server_pem, server_key, ca_pem) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let Some((_, _server)) = redis(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &server_pem,
        "--tls-key-file",
        &server_key,
        "--tls-auth-clients",
        "no",
    ]) else {
        return;
    };
    let url = format!("rediss://localhost:{tls_port}");
    let mut command = lockrun();
    command
        .args(["--backend", "redis", "--redis-url", &url])
        .args(["--name", "tls", "--", "sh", "-c", "echo $LOCKRUN_FENCE"]);
    // rustls reads the trusted roots from the system, which SSL_CERT_FILE replaces.
    let output = run(command.env("SSL_CERT_FILE", &ca_pem));
    assert_status(&output, 0);
    assert!(stdout(&output).trim().parse::<u64>().is_ok());
    let output = run(command.env("SSL_CERT_FILE", &server_pem));
    assert_status(&output, 69);
    assert!(
        stderr(&output).contains("certificate"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn release_force_breaks_the_lease_and_its_holder_stops() {
    let Some((store, _server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold_recording(&store, &scratch, "broken", &["--ttl", "0.6"]);
    let output = run(store.release().args(["broken", "--force"]));
    assert_status(&output, 0);
    assert!(
        stdout(&output).contains(&format!("released broken slot 0 (pid {}", holder.id())),
        "{}",
        stdout(&output)
    );
    assert_status(
        &run(store.lockrun().args(["--name", "broken", "-n", "true"])),
        0,
    );
    assert_eq!(
        wait(&mut holder).code(),
        Some(76),
        "the next renewal finds the lease gone"
    );
    let output = run(store.release().args(["broken", "--force"]));
    assert!(stdout(&output).contains("nothing to release"));
}

#[test]
fn a_waiter_keeps_its_place_across_a_redis_restart() {
    // Redis keeps its data on disk here, so the line survives the restart.
    let Some((store, server)) = redis(&["--appendonly", "yes", "--appendfsync", "always"]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut first = hold_recording(&store, &scratch, "restarted", &[]);
    let mut waiter = store
        .lockrun()
        .args(["--name", "restarted", "-w", "60", "--initial-delay", "0.2"])
        .args(["--max-delay", "1", "--log-format", "json", "--", "touch"])
        .arg(scratch.path("ran"))
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let events = || fs::read_to_string(scratch.path("events")).unwrap_or_default();
    wait_until("the waiter to join the line", || {
        events().contains(r#""event":"waiting""#)
    });
    server.kill();
    wait_until("the waiter to ride out the outage", || {
        events().contains(r#""reason":"unavailable""#)
    });
    assert!(waiter.try_wait().unwrap().is_none(), "{}", events());
    assert!(server.restart(), "redis-server restarts");
    wait_until("the waiter to be back in its place", || {
        let output = run(store.status().args(["restarted", "--json"]));
        stdout(&output).contains(r#""position":1"#)
    });
    assert!(!scratch.path("ran").exists(), "the holder still holds");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(
        wait(&mut first).code(),
        Some(0),
        "the holder kept its lease"
    );
    assert_eq!(wait(&mut waiter).code(), Some(0), "{}", events());
    assert!(scratch.path("ran").exists());
}

#[test]
fn a_dead_waiter_on_another_host_stalls_the_line_only_until_its_place_lapses() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let mut first = hold_recording(&store, &scratch, "ghost", &[]);
    // A waiter from another host that died: its place lapses in 800 ms, as nobody renews it.
    let record = r#"{"name":"ghost","token":"dead","pid":1,"start_time":1,"boot_id":"another-boot","host":"elsewhere","command":"crashed","since":0}"#;
    let mut client = server.client();
    let ticket: u64 = redis::cmd("INCR")
        .arg("lockrun:{ghost}:ticket")
        .query(&mut client)
        .unwrap();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg("lockrun:{ghost}:line")
        .arg(ticket)
        .arg("dead")
        .cmd("SET")
        .arg("lockrun:{ghost}:waiter:dead")
        .arg(record)
        .arg("PX")
        .arg(800)
        .query(&mut client)
        .unwrap();
    // A 30 s retry delay: only the lapse of the dead waiter's place can let this one on in time.
    let mut waiter = store
        .lockrun()
        .args([
            "--name",
            "ghost",
            "-w",
            "20",
            "--initial-delay",
            "30",
            "--",
            "touch",
        ])
        .arg(scratch.path("ran"))
        .start();
    wait_until("the waiter to stand behind the dead one", || {
        let output = run(store.status().args(["ghost", "--json"]));
        stdout(&output).contains(r#""position":2"#)
    });
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut first).code(), Some(0));
    let released = Instant::now();
    assert_eq!(wait(&mut waiter).code(), Some(0));
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "the line moved on when the dead waiter's place lapsed, after {:?}",
        released.elapsed()
    );
}

/// Eight readers wait behind a writer; the writer's release is the one event
/// that may start them (the writer runs in a pid namespace of its own, as on
/// another host, so that nobody watches its process): it wakes all eight at
/// once, and they hold together. Each reader's command waits until all have
/// begun, so a reader let in alone would hold the others out.
#[test]
fn a_writers_release_wakes_every_reader_waiting_behind_it_at_once() {
    const READERS: usize = 8;
    let Some(mut elsewhere) = lockrun_in_a_pid_namespace() else {
        return;
    };
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    elsewhere.args(store.args());
    let end = scratch.path("end");
    let writer = start_holding(
        elsewhere,
        &scratch,
        "group",
        &["--ttl", "60"],
        &format!("trap 'date +%s%N > {}' EXIT; ", end.display()),
    );
    let began = |reader: usize| scratch.path(&format!("at.{reader}"));
    let mut readers: Vec<Running> = (0..READERS)
        .map(|reader| {
            let script = format!(
                "date +%s%N > {}; {}",
                began(reader).display(),
                together(scratch.dir(), &reader.to_string(), READERS)
            );
            in_line(&store, "group", &["-s"], &script)
        })
        .collect();
    let mut client = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut client)
        .unwrap();
    let released = Instant::now();
    fs::write(scratch.path("release"), "").unwrap();
    stderr_of(writer);
    for reader in &mut readers {
        assert_eq!(wait(reader).code(), Some(0), "held together with the rest");
    }
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken by the release, not by their retries: {:?}",
        released.elapsed()
    );
    let last_ms = (0..READERS)
        .map(|reader| nanos(&began(reader)) - nanos(&end))
        .max()
        .unwrap() as f64
        / 1e6;
    eprintln!(
        "redis group handoff: the last of {READERS} readers began {last_ms:.1} ms after the writer's command ended"
    );
    let pushes = server.command_calls().get("lpush").copied().unwrap_or(0);
    assert_eq!(
        pushes, READERS as u64,
        "one wake-up each, all from the writer's release"
    );
}

/// A run of `name` with `extra` flags and the shell `script`, whose only ways
/// in are a wake-up and a process it watches (its first retry is 15 s or more
/// away, its place keeps for 20 s); returned once it stands in line.
fn in_line(store: &Store, name: &str, extra: &[&str], script: &str) -> Running {
    let waiting = || {
        let output = run(store.status().args([name, "--json"]));
        stdout(&output).matches(r#""state":"waiting""#).count()
    };
    let before = waiting();
    let run = store
        .lockrun()
        .args([
            "--name",
            name,
            "-w",
            "60",
            "--ttl",
            "60",
            "--initial-delay",
            "30",
        ])
        .args(extra)
        .args(["-c", script])
        .start();
    wait_until("the run to stand in line", || waiting() > before);
    run
}

/// Shell code that touches `mark` and waits (10 s at most, else fails) until
/// `count` files named `began.*` are in `dir`: run by readers that must hold together.
fn together(dir: &std::path::Path, mark: &str, count: usize) -> String {
    let dir = dir.display();
    format!(
        "touch {dir}/began.{mark}; n=0; while [ $(ls {dir} | grep -c began) -lt {count} ] && [ $n -lt 1000 ]; do sleep 0.01; n=$((n+1)); done; [ $n -lt 1000 ]"
    )
}

/// Two readers wait behind a holder on another host that crashed: both
/// watch when its lease ends (the second goes with the first, so it is at
/// the head too), and both hold together then, not the second only at its
/// next retry.
#[test]
fn readers_at_the_head_watch_the_holders_lease_and_go_together_when_it_ends() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    plant_crashed_holder(&server, "fallen", 5000);
    let scratch = Scratch::new();
    let mut readers: Vec<Running> = ["1", "2"]
        .iter()
        .map(|mark| in_line(&store, "fallen", &["-s"], &together(scratch.dir(), mark, 2)))
        .collect();
    for reader in &mut readers {
        assert_eq!(wait(reader).code(), Some(0), "held together");
    }
}

/// A writer waits behind two readers that wait behind a holder. The second
/// reader dies: the writer, right behind the readers, watches both and drops
/// it at once; so when the holder ends and the first reader has come and
/// gone, the writer runs, without waiting for the dead reader's place to lapse.
#[test]
fn a_writer_behind_waiting_readers_drops_a_dead_one_at_once() {
    let Some((store, _server)) = redis(&[]) else {
        return;
    };
    let scratch = Scratch::new();
    let holder = hold_recording(&store, &scratch, "behind", &["--ttl", "60"]);
    let mut first = in_line(&store, "behind", &["-s"], "true");
    let mut second = in_line(&store, "behind", &["-s"], "true");
    let written = scratch.path("written");
    let mut writer = in_line(
        &store,
        "behind",
        &[],
        &format!("touch {}", written.display()),
    );
    second.kill().unwrap();
    second.wait().unwrap();
    let released = Instant::now();
    fs::write(scratch.path("release"), "").unwrap();
    stderr_of(holder);
    assert_eq!(wait(&mut first).code(), Some(0));
    assert_eq!(wait(&mut writer).code(), Some(0));
    assert!(written.exists());
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "{:?}",
        released.elapsed()
    );
}

/// A writer waits behind three readers that hold: the releases of the first
/// two free nothing for it and wake nobody; the last one's wakes it.
#[test]
fn a_writer_behind_readers_is_woken_by_the_last_ones_release_only() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    let scratches = [Scratch::new(), Scratch::new(), Scratch::new()];
    let readers: Vec<Running> = scratches
        .iter()
        .map(|scratch| hold(&store, scratch, "last", &["-s"]))
        .collect();
    let mut writer = in_line(&store, "last", &[], "true");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.client())
        .unwrap();
    for (scratch, reader) in scratches.iter().zip(readers) {
        fs::write(scratch.path("release"), "").unwrap();
        stderr_of(reader);
    }
    assert_eq!(wait(&mut writer).code(), Some(0));
    let pushes = server.command_calls().get("lpush").copied().unwrap_or(0);
    assert_eq!(pushes, 1, "the writer woken once");
}

/// A proxy to `server` that, once, lets a release (the script run with a
/// slot's key and the line's) reach the server and cuts the connection
/// before its answer reaches the client, as a network cut would. Its port,
/// and whether it cut.
fn cutting_the_first_release_answer(server: &RedisServer) -> (u16, Arc<AtomicBool>) {
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = front.local_addr().unwrap().port();
    let upstream = server.port();
    let cut = Arc::new(AtomicBool::new(false));
    let cutting = Arc::clone(&cut);
    thread::spawn(move || {
        for client in front.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut from_client, mut to_server) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let this_one = Arc::new(AtomicBool::new(false));
            let (cutting, marked) = (Arc::clone(&cutting), Arc::clone(&this_one));
            thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(read) = from_client.read(&mut buffer) {
                    let request = String::from_utf8_lossy(&buffer[..read]);
                    // A script given a slot's key and the line's: a release.
                    if request.contains("EVALSHA")
                        && request.contains(":slot:")
                        && request.contains(":line")
                        && !cutting.swap(true, Ordering::SeqCst)
                    {
                        marked.store(true, Ordering::SeqCst);
                    }
                    if read == 0 || to_server.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
            });
            let (mut from_server, mut to_client) = (server, client);
            thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(read) = from_server.read(&mut buffer) {
                    if read == 0 || this_one.load(Ordering::SeqCst) {
                        break;
                    }
                    if to_client.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
                let _ = to_client.shutdown(Shutdown::Both);
                let _ = from_server.shutdown(Shutdown::Both);
            });
        }
    });
    (port, cut)
}

/// A release whose answer is lost is made again on a new connection; the
/// slot is gone by then, and the release knows it freed it itself: the run
/// exits with its command's status, not 76. One that keeps the slot
/// (`--min-hold`) finds it kept, and keeps it once. A lease broken by `release
/// --force` is still found lost (`sessions::a_lease_found_lost_at_release_gives_76`).
#[test]
fn a_release_made_again_after_its_answer_was_lost_is_not_found_lost() {
    let Some((store, server)) = redis(&[]) else {
        return;
    };
    // The first run loads the scripts: the cut release must run, not meet NOSCRIPT.
    assert_status(&run(store.lockrun().args(["--name", "cut", "true"])), 0);
    for (name, extra) in [("cut", &[][..]), ("kept", &["--min-hold", "30"][..])] {
        let (port, cut) = cutting_the_first_release_answer(&server);
        let output = run(lockrun()
            .args(["--backend", "redis", "--redis-url"])
            .arg(format!("redis://127.0.0.1:{port}"))
            .args(["--name", name, "-c", "exit 3"])
            .args(extra));
        assert!(cut.load(Ordering::SeqCst), "the proxy cut no release");
        assert_status(&output, 3);
        assert_eq!(stderr(&output), "", "nothing said about a lost lease");
    }
    assert_status(
        &run(store.lockrun().args(["--name", "cut", "-n", "true"])),
        0,
    );
    let status = stdout(&run(store.status().args(["kept", "--json"])));
    assert!(status.contains(r#""state":"holding""#), "{status}");
}
