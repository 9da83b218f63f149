//! The etcd client against real etcd servers started by the tests: leases,
//! transactions, ranges in line order, watches, failover between members,
//! auth and TLS.

use std::process::Command;
use std::time::{Duration, Instant};

use lockrun::backend::etcd::link::{Client, Endpoints, EventKind, GrantedLease, Keys, Op, Txn};
use lockrun::backend::net::{Deadline, Kind};

use crate::support::etcd::{EtcdCluster, EtcdServer, Tls};
use crate::support::{Scratch, free_port, write_certificates};

const TIMEOUT: Duration = Duration::from_secs(2);

fn etcd(endpoints: &str) -> Client {
    Client::new(Endpoints::parse(endpoints).expect("endpoints"))
}

fn grant(client: &mut Client) -> GrantedLease {
    client
        .lease_grant(Duration::from_secs(10), TIMEOUT)
        .expect("lease grant")
}

/// Puts `key` attached to `lease` unless it exists; true when it did not.
fn put_if_absent(client: &mut Client, key: &[u8], value: &[u8], lease: i64) -> bool {
    let txn = Txn::new()
        .if_absent(Keys::one(key))
        .then(Op::put(key, value, lease));
    client.txn(&txn, TIMEOUT).expect("put-if-absent").succeeded
}

/// Every key with `prefix`, oldest first.
fn keys_under(client: &mut Client, prefix: &[u8]) -> Vec<Vec<u8>> {
    let listing = client.range(&Keys::prefix(prefix), TIMEOUT).expect("range");
    listing.kvs.into_iter().map(|kv| kv.key).collect()
}

#[test]
fn a_lease_is_granted_kept_alive_and_revoked_with_its_keys() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = client
        .lease_grant(Duration::from_millis(4500), TIMEOUT)
        .unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(5), "rounded up to seconds");
    assert_eq!(
        client.lease_keep_alive(lease.id, TIMEOUT).unwrap(),
        Some(lease.ttl)
    );
    let left = client
        .lease_time_to_live(lease.id, TIMEOUT)
        .unwrap()
        .expect("alive");
    assert!(left <= lease.ttl, "{left:?}");
    assert!(put_if_absent(&mut client, b"/t/held", b"", lease.id));

    assert!(client.lease_revoke(lease.id, TIMEOUT).unwrap());
    assert_eq!(client.lease_keep_alive(lease.id, TIMEOUT).unwrap(), None);
    assert_eq!(client.lease_time_to_live(lease.id, TIMEOUT).unwrap(), None);
    assert!(
        !client.lease_revoke(lease.id, TIMEOUT).unwrap(),
        "gone already"
    );
    assert!(
        keys_under(&mut client, b"/t/").is_empty(),
        "the key went with its lease"
    );
    let err = client
        .txn(
            &Txn::new().then(Op::put(b"/t/late", b"", lease.id)),
            TIMEOUT,
        )
        .unwrap_err();
    assert!(err.lease_not_found(), "{err}");
}

#[test]
fn a_transaction_checks_absence_and_leases_nests_and_reads_its_own_writes() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let (mine, theirs) = (grant(&mut client), grant(&mut client));
    // Only when nothing exists under /t/ (a range without keys passes).
    let first = Txn::new()
        .if_absent(Keys::prefix(b"/t/"))
        .then(Op::put(b"/t/k", b"mine", mine.id))
        .then(Op::Range(Keys::prefix(b"/t/")))
        .otherwise(Op::Range(Keys::prefix(b"/t/")));
    let outcome = client.txn(&first, TIMEOUT).unwrap();
    assert!(outcome.succeeded);
    let kv = &outcome.listings[0].kvs[0];
    assert_eq!((kv.value.as_slice(), kv.lease), (&b"mine"[..], mine.id));
    assert_eq!(kv.create_revision, outcome.revision, "read its own put");
    let again = client.txn(&first, TIMEOUT).unwrap();
    assert!(!again.succeeded, "/t/ has a key now");
    assert_eq!(again.listings[0].kvs[0], *kv, "and it is unchanged");

    let nested = Txn::new()
        .if_leased(b"/t/k", theirs.id)
        .otherwise(Op::Txn(
            Txn::new()
                .if_absent(Keys::one(b"/t/other"))
                .then(Op::put(b"/t/other", b"", theirs.id)),
        ))
        .otherwise(Op::Range(Keys::prefix(b"/t/")));
    let outcome = client.txn(&nested, TIMEOUT).unwrap();
    assert!(!outcome.succeeded, "/t/k is not on their lease");
    assert_eq!(
        outcome.listings.len(),
        1,
        "the nested one's ranges are not listed"
    );
    assert_eq!(keys_under(&mut client, b"/t/"), [&b"/t/k"[..], b"/t/other"]);
    assert!(!put_if_absent(&mut client, b"/t/k", b"theirs", theirs.id));
}

#[test]
fn a_range_lists_keys_in_create_order_within_its_prefix() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = grant(&mut client);
    // Created out of alphabetical order: the line is the create order.
    for key in ["/line/c", "/line/a", "/line/b", "/line0", "/lina"] {
        assert!(put_if_absent(&mut client, key.as_bytes(), b"", lease.id));
    }
    let listing = client.range(&Keys::prefix(b"/line/"), TIMEOUT).unwrap();
    let keys: Vec<&[u8]> = listing.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [&b"/line/c"[..], b"/line/a", b"/line/b"]);
    assert!(listing.revision >= listing.kvs[2].create_revision);
}

#[test]
fn a_watch_waits_until_its_deadline_and_sees_the_key_ahead_deleted_at_once() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let (ahead, other) = (grant(&mut client), grant(&mut client));
    assert!(put_if_absent(&mut client, b"/w/ahead", b"", ahead.id));
    let revision = client
        .range(&Keys::prefix(b"/w/"), TIMEOUT)
        .unwrap()
        .revision;
    let mut watch = client
        .watch(&Keys::prefix(b"/w/"), revision + 1, true, TIMEOUT)
        .unwrap();

    let started = Instant::now();
    assert!(
        watch
            .next(Deadline::after(Duration::from_millis(200)))
            .unwrap()
            .is_empty()
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(1),
        "{waited:?}"
    );

    // Deletes only: a put is not even sent.
    assert!(put_if_absent(&mut client, b"/w/behind", b"", other.id));
    let deleted_at = Instant::now();
    assert!(client.lease_revoke(ahead.id, TIMEOUT).unwrap());
    let events = watch.next(Deadline::after(TIMEOUT)).unwrap();
    let seen = deleted_at.elapsed();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].kind, events[0].kv.key.as_slice()),
        (EventKind::Delete, &b"/w/ahead"[..])
    );
    assert!(seen < Duration::from_millis(100), "seen after {seen:?}");

    // A watch from an earlier revision replays what it missed.
    let mut replay = client
        .watch(&Keys::prefix(b"/w/"), revision, false, TIMEOUT)
        .unwrap();
    let replayed = replay.next(Deadline::after(TIMEOUT)).unwrap();
    assert_eq!(replayed[0].kind, EventKind::Put);
}

#[test]
fn a_killed_server_is_unreachable_and_its_restart_is_reconnected_with_the_data() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let mut client = etcd(server.url());
    let lease = grant(&mut client);
    assert!(put_if_absent(&mut client, b"/r/kept", b"", lease.id));
    let mut watch = client
        .watch(&Keys::one(b"/r/kept"), 0, false, TIMEOUT)
        .unwrap();

    server.kill();
    let started = Instant::now();
    let err = client.lease_keep_alive(lease.id, TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), Kind::Unreachable, "{err}");
    assert!(started.elapsed() < TIMEOUT, "refused at once");
    let err = watch.next(Deadline::after(TIMEOUT)).unwrap_err();
    assert_eq!(err.kind(), Kind::Transient, "{err}");

    server.restart();
    assert!(
        client
            .lease_keep_alive(lease.id, TIMEOUT)
            .unwrap()
            .is_some()
    );
    assert_eq!(
        keys_under(&mut client, b"/r/"),
        [b"/r/kept"],
        "the data survived the restart"
    );
}

#[test]
fn nothing_listening_is_unreachable_and_every_endpoint_is_named() {
    let endpoints = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let started = Instant::now();
    let err = etcd(&endpoints).lease_grant(TIMEOUT, TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), Kind::Unreachable);
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
    assert!(put_if_absent(&mut client, b"/f/holder", b"", lease.id));
    let revision = client
        .range(&Keys::prefix(b"/f/"), TIMEOUT)
        .unwrap()
        .revision;
    let mut watch_on_first = client
        .watch(&Keys::one(b"/f/holder"), revision + 1, false, TIMEOUT)
        .unwrap();

    cluster.kill(leader);
    let renewed = client.lease_keep_alive(lease.id, TIMEOUT).unwrap();
    assert!(
        renewed.is_some(),
        "renewed within the call's time, election and all"
    );
    let mine = Txn::new().if_leased(b"/f/holder", lease.id).then(Op::put(
        b"/f/holder",
        b"moved",
        lease.id,
    ));
    assert!(
        client.txn(&mine, TIMEOUT).unwrap().succeeded,
        "the key is still ours"
    );
    assert!(watch_on_first.next(Deadline::after(TIMEOUT)).is_err());
    let mut watch = client
        .watch(&Keys::one(b"/f/holder"), revision + 1, false, TIMEOUT)
        .unwrap();
    let events = watch.next(Deadline::after(TIMEOUT)).unwrap();
    assert_eq!(
        events[0].kind,
        EventKind::Put,
        "what the first watch missed"
    );
    assert!(client.lease_revoke(lease.id, TIMEOUT).unwrap());
    let events = watch.next(Deadline::after(TIMEOUT)).unwrap();
    assert_eq!(events[0].kind, EventKind::Delete);

    cluster.restart(leader);
    let first = cluster.endpoints(leader);
    let first = first.split(',').next().unwrap();
    assert!(
        etcd(first).lease_grant(TIMEOUT, TIMEOUT).is_ok(),
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
    let err = wrong.lease_grant(TIMEOUT, TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), Kind::Permanent, "{err}");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    assert!(!err.to_string().contains("wr0ng-pw"), "{err}");
    assert!(!format!("{err:?}").contains("wr0ng-pw"), "{err:?}");
    let mut anonymous = etcd(server.url());
    let err = anonymous.range(&Keys::prefix(b"/a/"), TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), Kind::Permanent, "{err}");
    let Err(err) = anonymous.watch(&Keys::prefix(b"/a/"), 0, false, TIMEOUT) else {
        panic!("a watch without a user");
    };
    assert_eq!(err.kind(), Kind::Permanent, "{err}");

    let mut right = etcd(&format!("http://locker:s3cret-pw@{authority}"));
    let lease = grant(&mut right);
    assert!(put_if_absent(&mut right, b"/a/k", b"", lease.id));
    // The token lapses after a second unused; a watch and a call that find
    // it gone authenticate again.
    let lapse = Duration::from_millis(1500);
    std::thread::sleep(lapse);
    let watch = right.watch(&Keys::prefix(b"/a/"), 0, false, TIMEOUT);
    assert!(watch.is_ok(), "{:?}", watch.err());
    std::thread::sleep(lapse);
    assert_eq!(keys_under(&mut right, b"/a/"), [b"/a/k"]);
}

/// The client half of the https test, run in a child process of this test
/// binary so that `SSL_CERT_FILE` is set for it alone.
#[test]
#[ignore = "run by https_checks_the_server_certificate_against_the_trusted_roots"]
fn https_child() {
    let endpoint = std::env::var("LOCKRUN_TEST_ETCD_ENDPOINT").expect("set by the parent test");
    match etcd(&endpoint).lease_grant(TIMEOUT, TIMEOUT) {
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
            .args([
                "--exact",
                "etcd_client::https_child",
                "--ignored",
                "--nocapture",
            ])
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
        untrusted.contains("Permanent") && untrusted.contains("certificate"),
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
    let mut watch = client
        .watch(&Keys::prefix(b"/q/"), 0, false, TIMEOUT)
        .unwrap();

    cluster.kill(0);
    cluster.kill(1);
    let started = Instant::now();
    let err = watch
        .next(Deadline::after(Duration::from_secs(5)))
        .unwrap_err();
    assert_eq!(err.kind(), Kind::Transient, "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    let err = client.range(&Keys::prefix(b"/q/"), TIMEOUT).unwrap_err();
    assert_eq!(err.kind(), Kind::Transient, "{err}");
    assert!(err.to_string().contains("no leader"), "{err}");
}
