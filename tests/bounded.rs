//! Every call to a server has one deadline for connecting, TLS, writing and
//! reading together (docs/guide.md: "When the server has trouble"): a server that accepts and then stays
//! silent, or trickles a byte a second, holds no run past it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::slow::{Manner, SlowServer};
use crate::support::*;

/// One call's bound for a run that holds nothing (5 s), and room for the
/// start-up and the exit.
const BOUND: Duration = Duration::from_secs(5 + 3);

/// Runs `lockrun -w 3s` against each of `targets` (backend flags) at once, and
/// checks that each ends within [`BOUND`], having got no slot.
fn each_ends_by_its_deadline(targets: &[(&str, Vec<String>)]) {
    let runs: Vec<_> = targets
        .iter()
        .map(|(what, flags)| {
            let child = lockrun()
                .args(flags)
                .args(["--name", "x", "-w", "3s", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .start();
            (what, Instant::now(), child)
        })
        .collect();
    for (what, started, mut child) in runs {
        while child.try_wait().expect("try_wait").is_none() {
            assert!(
                started.elapsed() < BOUND,
                "{what}: still running after {BOUND:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = finish(child);
        let status = output.status;
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            matches!(status.code(), Some(69 | 75)),
            "{what}: {status:?}: {said}"
        );
    }
}

fn flags(backend: &str, option: &str, url: String) -> Vec<String> {
    vec!["-b".into(), backend.into(), option.into(), url]
}

#[test]
fn a_redis_server_that_stays_silent_or_trickles_holds_no_run_past_the_deadline() {
    let silent = SlowServer::start(Manner::Silent);
    let trickle = SlowServer::trickle(b"+", b'x');
    let tls = SlowServer::trickle_tls();
    let url = |scheme: &str, server: &SlowServer| format!("{scheme}://{}", server.address());
    let sentinel = |server: &SlowServer| format!("redis+sentinel://{}/main", server.address());
    let cluster = |server: &SlowServer| format!("redis+cluster://{}", server.address());
    let redis = |url: String| flags("redis", "--redis-url", url);
    each_ends_by_its_deadline(&[
        ("silent", redis(url("redis", &silent))),
        ("trickle", redis(url("redis", &trickle))),
        ("TLS handshake", redis(url("rediss", &tls))),
        ("Sentinel", redis(sentinel(&trickle))),
        ("Cluster", redis(cluster(&trickle))),
    ]);
}

#[cfg(feature = "postgres")]
#[test]
fn a_postgres_server_that_stays_silent_or_trickles_holds_no_run_past_the_deadline() {
    let silent = SlowServer::start(Manner::Silent);
    // An authentication request that announces a long message.
    let trickle = SlowServer::trickle(b"R\0\0\x10\0", 0);
    let tls = SlowServer::trickle(b"S", 0x16);
    let url = |server: &SlowServer, mode: &str| {
        format!("postgres://u@{}/db?sslmode={mode}", server.address())
    };
    let postgres = |url: String| flags("postgres", "--postgres-url", url);
    each_ends_by_its_deadline(&[
        ("silent", postgres(url(&silent, "disable"))),
        ("trickle", postgres(url(&trickle, "disable"))),
        ("TLS handshake", postgres(url(&tls, "require"))),
    ]);
}

#[cfg(feature = "etcd")]
#[test]
fn an_etcd_server_that_stays_silent_or_trickles_holds_no_run_past_the_deadline() {
    let silent = SlowServer::start(Manner::Silent);
    let trickle = SlowServer::trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", b' ');
    let tls = SlowServer::trickle_tls();
    let url = |scheme: &str, server: &SlowServer| format!("{scheme}://{}", server.address());
    let etcd = |url: String| flags("etcd", "--etcd-endpoints", url);
    each_ends_by_its_deadline(&[
        ("silent", etcd(url("http", &silent))),
        ("trickle", etcd(url("http", &trickle))),
        ("TLS handshake", etcd(url("https", &tls))),
    ]);
}
