//! The etcd client against real etcd servers started by the tests: leases,
//! the put-if-absent claim and its retry, ranges in line order, watches,
//! failover between members, auth and TLS.

use std::process::Command;
use std::time::{Duration, Instant};

use lockrun::backend::etcd::client::{Client, Endpoints, ErrorKind, EventKind, Keys, Lease, Range};

use crate::support::etcd::{EtcdCluster, EtcdServer, Tls};
use crate::support::{Scratch, free_port, write_certificates};

const TIMEOUT: Duration = Duration::from_secs(2);

fn etcd(endpoints: &str) -> Client {
    Client::new(Endpoints::parse(endpoints).expect("endpoints"), TIMEOUT)
}

fn grant(client: &mut Client) -> Lease {
    client
        .lease_grant(Duration::from_secs(10))
        .expect("lease grant")
}

#[test]
fn a_lease_is_granted_kept_alive_and_revoked_with_its_keys() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = client.lease_grant(Duration::from_millis(4500)).unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(5), "rounded up to seconds");
    assert_eq!(
        client.lease_keep_alive(lease.id, TIMEOUT).unwrap(),
        Some(lease.ttl)
    );
    let left = client.lease_time_to_live(lease.id).unwrap().expect("alive");
    assert_eq!(left.granted, lease.ttl);
    assert!(left.remaining <= lease.ttl, "{left:?}");
    assert!(
        client
            .put_if_absent(b"/t/held", b"", lease.id)
            .unwrap()
            .created
    );

    assert!(client.lease_revoke(lease.id).unwrap());
    assert_eq!(client.lease_keep_alive(lease.id, TIMEOUT).unwrap(), None);
    assert_eq!(client.lease_time_to_live(lease.id).unwrap(), None);
    assert!(!client.lease_revoke(lease.id).unwrap(), "gone already");
    let listing = client.range(&Range::of(Keys::one(b"/t/held"))).unwrap();
    assert_eq!(listing.count, 0, "the key went with its lease");
}

#[test]
fn put_if_absent_claims_once_and_a_retry_finds_its_own_key() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let (mine, theirs) = (grant(&mut client), grant(&mut client));
    let claim = client.put_if_absent(b"/t/k", b"mine", mine.id).unwrap();
    assert!(claim.created);
    assert_eq!(
        (claim.kv.value.as_slice(), claim.kv.lease),
        (&b"mine"[..], mine.id)
    );
    let retried = client.put_if_absent(b"/t/k", b"mine", mine.id).unwrap();
    assert!(retried.created, "a retry recognises the key by its lease");
    assert_eq!(retried.kv, claim.kv, "and changes nothing");
    let other = client.put_if_absent(b"/t/k", b"theirs", theirs.id).unwrap();
    assert!(!other.created);
    assert_eq!(other.kv, claim.kv);
}

#[test]
fn a_range_lists_keys_in_create_order_with_limit_count_and_the_key_ahead() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = grant(&mut client);
    // Created out of alphabetical order: the line is the create order.
    for key in ["/line/c", "/line/a", "/line/b", "/line0", "/lina"] {
        client.put_if_absent(key.as_bytes(), b"", lease.id).unwrap();
    }
    let line = Keys::prefix(b"/line/");
    let listing = client.range(&Range::of(line.clone())).unwrap();
    let keys: Vec<&[u8]> = listing.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [&b"/line/c"[..], b"/line/a", b"/line/b"]);
    assert_eq!(listing.count, 3);
    assert!(listing.revision >= listing.kvs[2].create_revision);

    let first_two = client.range(&Range::of(line.clone()).limit(2)).unwrap();
    assert_eq!((first_two.kvs.len(), first_two.count), (2, 3));
    let counted = client.range(&Range::of(line.clone()).count_only()).unwrap();
    assert_eq!((counted.kvs.len(), counted.count), (0, 3));

    let last = &listing.kvs[2];
    let ahead = client
        .range(
            &Range::of(line.clone())
                .created_before(last.create_revision)
                .newest_first()
                .limit(1),
        )
        .unwrap();
    assert_eq!(ahead.kvs.len(), 1);
    assert_eq!(
        ahead.kvs[0].key, b"/line/a",
        "the key just ahead of /line/b"
    );
    assert_eq!(
        ahead.count, 3,
        "etcd counts the whole range, not the filtered part"
    );
    let first = &listing.kvs[0];
    let none_ahead = Range::of(line).created_before(first.create_revision);
    assert!(client.range(&none_ahead).unwrap().kvs.is_empty());
}

#[test]
fn a_watch_waits_until_its_deadline_and_sees_the_key_ahead_deleted_at_once() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = grant(&mut client);
    client.put_if_absent(b"/w/ahead", b"", lease.id).unwrap();
    let listing = client.range(&Range::of(Keys::prefix(b"/w/"))).unwrap();
    let mut watch = client
        .watch(&Keys::one(b"/w/ahead"), listing.revision + 1)
        .unwrap();

    let started = Instant::now();
    assert!(
        watch
            .next(started + Duration::from_millis(200))
            .unwrap()
            .is_empty()
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(1),
        "{waited:?}"
    );

    let deleted_at = Instant::now();
    assert!(client.delete(b"/w/ahead").unwrap());
    let events = watch.next(deleted_at + TIMEOUT).unwrap();
    let seen = deleted_at.elapsed();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].kind, events[0].kv.key.as_slice()),
        (EventKind::Delete, &b"/w/ahead"[..])
    );
    assert!(seen < Duration::from_millis(100), "seen after {seen:?}");
    assert_eq!(watch.next_revision(), events[0].kv.mod_revision + 1);

    // A watch from an earlier revision replays what it missed.
    let mut replay = client
        .watch(&Keys::prefix(b"/w/"), listing.revision)
        .unwrap();
    let replayed = replay.next(Instant::now() + TIMEOUT).unwrap();
    assert_eq!(replayed[0].kind, EventKind::Put);
}

#[test]
fn a_killed_server_is_unreachable_and_its_restart_is_reconnected_with_the_data() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = grant(&mut client);
    client.put_if_absent(b"/r/kept", b"", lease.id).unwrap();
    let mut watch = client.watch(&Keys::one(b"/r/kept"), 0).unwrap();

    server.kill();
    let started = Instant::now();
    let err = client.lease_keep_alive(lease.id, TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unreachable, "{err}");
    assert!(started.elapsed() < TIMEOUT, "refused at once");
    let err = watch.next(Instant::now() + TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");

    server.restart();
    assert!(
        client
            .lease_keep_alive(lease.id, TIMEOUT)
            .unwrap()
            .is_some()
    );
    let listing = client.range(&Range::of(Keys::one(b"/r/kept"))).unwrap();
    assert_eq!(listing.count, 1, "the data survived the restart");
}

#[test]
fn nothing_listening_is_unreachable_and_every_endpoint_is_named() {
    let endpoints = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let started = Instant::now();
    let err = etcd(&endpoints).lease_grant(TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unreachable);
    assert!(started.elapsed() < Duration::from_secs(1), "no waiting");
    for endpoint in endpoints.split(',') {
        assert!(err.to_string().contains(endpoint), "{err}");
    }
}

#[test]
fn calls_move_to_the_next_member_when_the_first_is_killed_and_the_lease_lives_on() {
    let Some(cluster) = EtcdCluster::start() else {
        return;
    };
    // The first endpoint is the leader's, so killing it also forces an election.
    let leader = cluster.leader();
    let mut client = etcd(&cluster.endpoints(leader));
    let lease = grant(&mut client);
    assert!(
        client
            .put_if_absent(b"/f/holder", b"", lease.id)
            .unwrap()
            .created
    );
    let mut watch_on_first = client.watch(&Keys::one(b"/f/holder"), 0).unwrap();

    cluster.kill(leader);
    let renewed = client.lease_keep_alive(lease.id, TIMEOUT).unwrap();
    assert!(
        renewed.is_some(),
        "renewed within the call's time, election and all"
    );
    let claim = client.put_if_absent(b"/f/holder", b"", lease.id).unwrap();
    assert!(claim.created, "the retried claim finds its own key");
    assert!(watch_on_first.next(Instant::now() + TIMEOUT).is_err());
    let mut watch = client
        .watch(&Keys::one(b"/f/holder"), watch_on_first.next_revision())
        .unwrap();
    assert!(client.lease_revoke(lease.id).unwrap());
    let events = watch.next(Instant::now() + TIMEOUT).unwrap();
    assert_eq!(events[0].kind, EventKind::Delete);

    cluster.restart(leader);
    let first = cluster.endpoints(leader);
    let first = first.split(',').next().unwrap();
    assert!(
        etcd(first).lease_grant(TIMEOUT).is_ok(),
        "the first member is back"
    );
}

#[test]
fn auth_takes_a_token_renews_it_and_never_shows_the_password() {
    let Some(server) = EtcdServer::start_with(None, &["--auth-token-ttl", "1"]) else {
        return;
    };
    server.enable_auth("locker", "s3cret-pw");
    let authority = server.url().trim_start_matches("http://");

    let mut wrong = etcd(&format!("http://locker:wr0ng-pw@{authority}"));
    let err = wrong.lease_grant(TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    assert!(!err.to_string().contains("wr0ng-pw"), "{err}");
    assert!(!format!("{err:?}").contains("wr0ng-pw"), "{err:?}");
    let mut anonymous = etcd(server.url());
    let err = anonymous
        .range(&Range::of(Keys::prefix(b"/a/")))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    let Err(err) = anonymous.watch(&Keys::prefix(b"/a/"), 0) else {
        panic!("a watch without a user");
    };
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");

    let mut right = etcd(&format!("http://locker:s3cret-pw@{authority}"));
    let lease = grant(&mut right);
    assert!(right.put_if_absent(b"/a/k", b"", lease.id).unwrap().created);
    // The token lapses after a second unused; a watch and a call that find
    // it gone authenticate again.
    let lapse = Duration::from_millis(1500);
    std::thread::sleep(lapse);
    let watch = right.watch(&Keys::prefix(b"/a/"), 0);
    assert!(watch.is_ok(), "{:?}", watch.err());
    std::thread::sleep(lapse);
    let listing = right.range(&Range::of(Keys::prefix(b"/a/"))).unwrap();
    assert_eq!(listing.count, 1);
}

/// The client half of the https test, run in a child process of this test
/// binary so that `SSL_CERT_FILE` is set for it alone.
#[test]
#[ignore = "run by https_checks_the_server_certificate_against_the_trusted_roots"]
fn https_child() {
    let endpoint = std::env::var("LOCKRUN_TEST_ETCD_ENDPOINT").expect("set by the parent test");
    match etcd(&endpoint).lease_grant(TIMEOUT) {
        Ok(_) => println!("granted over https"),
        Err(err) => println!("{:?}: {err}", err.kind()),
    }
}

#[test]
fn https_checks_the_server_certificate_against_the_trusted_roots() {
    let scratch = Scratch::new();
    write_certificates(scratch.dir());
    let tls = Tls {
        cert: scratch.path("server.pem"),
        key: scratch.path("server.key"),
    };
    let Some(server) = EtcdServer::start_with(Some(&tls), &[]) else {
        return;
    };
    let endpoint = format!("https://localhost:{}", server.port());
    let child_with_roots = |roots: &str| {
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "etcd::https_child", "--ignored", "--nocapture"])
            .env("SSL_CERT_FILE", scratch.path(roots))
            .env("LOCKRUN_TEST_ETCD_ENDPOINT", &endpoint)
            .output()
            .expect("run the child test");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let trusted = child_with_roots("ca.pem");
    assert!(trusted.contains("granted over https"), "{trusted}");
    let untrusted = child_with_roots("server.pem");
    assert!(
        untrusted.contains("Unreachable") && untrusted.contains("certificate"),
        "{untrusted}"
    );
}

#[test]
fn a_member_that_lost_its_quorum_refuses_and_ends_its_watches() {
    let Some(cluster) = EtcdCluster::start() else {
        return;
    };
    let survivor = cluster.endpoints(2);
    let survivor = survivor.split(',').next().unwrap();
    let mut client = etcd(survivor);
    let mut watch = client.watch(&Keys::prefix(b"/q/"), 0).unwrap();

    cluster.kill(0);
    cluster.kill(1);
    let started = Instant::now();
    let err = watch.next(started + Duration::from_secs(5)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    let err = client.range(&Range::of(Keys::prefix(b"/q/"))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(err.to_string().contains("no leader"), "{err}");
}
