//! What waiting can fix and what it cannot (docs/guide.md: "When the server has
//! trouble"): a misconfigured store exits 69 at once on every networked
//! backend, and trouble that may pass is ridden out from the first contact on,
//! by a `--no-wait` run too, for its documented 10 s.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::etcd::EtcdServer;
use crate::support::postgres::PostgresServer;
use crate::support::*;

/// `lockrun --backend BACKEND FLAG VALUE --name x -w 30 true`, with how long it took.
fn attempt(backend: &str, flag: &str, value: &str, wait: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let output = run(lockrun()
        .args(["--backend", backend, flag, value, "--name", "x"])
        .args(wait)
        .arg("true"));
    (output, started.elapsed())
}

/// Every networked backend, with a store address whose host name does not exist
/// (`.invalid` never resolves) and one that is not a URL of its kind.
fn misconfigured() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut stores = Vec::new();
    if cfg!(feature = "redis") {
        stores.push(("redis", "--redis-url", "redis://no-such-host.invalid:6379"));
        stores.push(("redis", "--redis-url", "http://:s3cret@127.0.0.1:1"));
    }
    if cfg!(feature = "postgres") {
        stores.push((
            "postgres",
            "--postgres-url",
            "postgres://u:s3cret@no-such-host.invalid/db",
        ));
        stores.push((
            "postgres",
            "--postgres-url",
            "mysql://u:s3cret@127.0.0.1/db",
        ));
    }
    if cfg!(feature = "etcd") {
        stores.push((
            "etcd",
            "--etcd-endpoints",
            "http://u:s3cret@no-such-host.invalid:2379",
        ));
        stores.push(("etcd", "--etcd-endpoints", "ftp://u:s3cret@127.0.0.1:1"));
    }
    stores
}

#[test]
fn what_waiting_cannot_fix_exits_69_within_a_second_without_the_password() {
    for (backend, flag, value) in misconfigured() {
        let (output, took) = attempt(backend, flag, value, &["-w", "30"]);
        assert_status(&output, 69);
        let said = stderr(&output);
        assert_eq!(said.lines().count(), 1, "{backend} {value}: {said}");
        assert!(!said.contains("s3cret"), "{said}");
        assert!(took < Duration::from_secs(1), "{backend} {value}: {took:?}");
    }
}

#[test]
fn a_no_wait_run_rides_out_a_server_that_is_not_there_for_its_bound_then_exits_69() {
    if !cfg!(feature = "redis") {
        return;
    }
    // A port that refuses: nothing listens on it while the listener is not bound.
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (output, took) = attempt(
        "redis",
        "--redis-url",
        &url,
        &["-n", "--initial-delay", "1"],
    );
    assert_status(&output, 69);
    assert!(
        stderr(&output).contains("connection refused"),
        "{}",
        stderr(&output)
    );
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(14),
        "{took:?}"
    );
}

#[test]
fn a_no_wait_run_gets_the_slot_of_a_server_that_comes_back_while_it_rides_out() {
    let Some(server) = RedisServer::start(&[]) else {
        return;
    };
    server.kill();
    let scratch = Scratch::new();
    let mut run = lockrun()
        .args(["--backend", "redis", "--redis-url", &server.url()])
        .args(["--name", "x", "-n", "-v", "--initial-delay", "0.2"])
        .args(["--", "touch"])
        .arg(scratch.path("ran"))
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut run, "connection refused");
    assert!(server.restart(), "redis-server came back");
    let output = finish(run);
    assert_status(&output, 0);
    assert!(scratch.path("ran").exists());
}

/// A store's address at a server of another kind: what answers is no passing
/// trouble, so every pair exits 69 within a second (docs/guide.md: "When the server has trouble"), not at `--timeout`.
#[test]
fn a_server_of_another_kind_exits_69_within_a_second() {
    if !(cfg!(feature = "redis") && cfg!(feature = "postgres") && cfg!(feature = "etcd")) {
        return;
    }
    let (Some(redis), Some(postgres), Some(etcd)) = (
        RedisServer::start(&[]),
        PostgresServer::start(),
        EtcdServer::start(),
    ) else {
        return;
    };
    let (redis, postgres, etcd) = (redis.port(), postgres.port(), etcd.port());
    let cases = [
        (
            "redis",
            "--redis-url",
            format!("redis://127.0.0.1:{postgres}"),
        ),
        ("redis", "--redis-url", format!("redis://127.0.0.1:{etcd}")),
        (
            "redis",
            "--redis-url",
            format!("rediss://127.0.0.1:{redis}"),
        ),
        (
            "etcd",
            "--etcd-endpoints",
            format!("http://127.0.0.1:{redis}"),
        ),
        (
            "etcd",
            "--etcd-endpoints",
            format!("http://127.0.0.1:{postgres}"),
        ),
        (
            "postgres",
            "--postgres-url",
            format!("postgres://u:s3cret@127.0.0.1:{redis}/db"),
        ),
        (
            "postgres",
            "--postgres-url",
            format!("postgres://u:s3cret@127.0.0.1:{etcd}/db"),
        ),
    ];
    for (backend, flag, value) in &cases {
        let (output, took) = attempt(backend, flag, value, &["-w", "30"]);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(69), "{value}: {said}");
        assert_eq!(said.lines().count(), 1, "{value}: {said}");
        assert!(!said.contains("s3cret"), "{said}");
        assert!(said.contains("the server speaks"), "{value}: {said}");
        assert!(took < Duration::from_secs(1), "{value}: {took:?}: {said}");
    }
}
