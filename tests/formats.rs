//! Every store says which format wrote it, and a lockrun that meets a newer
//! one exits 69 with one line naming both and saying to upgrade, having
//! touched nothing (docs/operating.md: "Upgrading").

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::support::*;

/// A run on `store`, and `release --force`, are refused (69) with one line
/// that names `found` and says to upgrade.
fn refused(store: &Store, found: &str) {
    let run_it = run(store.lockrun().args(["--name", "x", "true"]));
    let break_it = run(store.release().args(["--force", "x"]));
    for output in [run_it, break_it] {
        assert_status(&output, 69);
        let said = stderr(&output);
        assert_eq!(said.trim_end().lines().count(), 1, "{said}");
        assert!(said.contains(found), "{said}");
        assert!(said.contains("upgrade lockrun"), "{said}");
    }
}

/// Every file in `dir` with its content.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, fs::read(entry.path()).unwrap())
        })
        .collect()
}

#[test]
fn a_file_directory_of_a_newer_format_is_refused_untouched() {
    let store = Store::file();
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    assert_eq!(
        fs::read_to_string(store.dir().join("format")).unwrap(),
        "1\n"
    );
    fs::write(store.dir().join("format"), "2\n").unwrap();
    let before = files(&store.dir());
    refused(&store, "file format 2");
    assert_status(&run(store.status().args(["--json"])), 69);
    assert_eq!(files(&store.dir()), before, "nothing was touched");
}

#[test]
fn an_sqlite_database_of_a_newer_schema_is_refused_untouched() {
    let store = Store::sqlite();
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    let at = store.args().iter().position(|arg| arg == "--db").unwrap();
    let db = Path::new(&store.args()[at + 1]).to_owned();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    // Closing the last connection checkpoints the WAL into the file's header.
    drop(conn);
    let before = fs::read(&db).unwrap();
    refused(&store, "schema version 99");
    assert_eq!(fs::read(&db).unwrap(), before, "nothing was touched");
}

/// Every key on `server` with its value as a string, or its type.
fn redis_keys(server: &RedisServer) -> BTreeMap<String, String> {
    let mut client = server.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut client).unwrap();
    keys.into_iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut client).unwrap();
            (key, kind)
        })
        .collect()
}

#[test]
fn redis_keys_of_a_newer_format_are_refused_untouched() {
    let Some(server) = RedisServer::start(&[]) else {
        return;
    };
    let server = Arc::new(server);
    let store = Store::on_redis(&server);
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    let format: String = redis::cmd("GET")
        .arg("lockrun:{x}:format")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(format, "1");
    let _: () = redis::cmd("SET")
        .arg("lockrun:{x}:format")
        .arg(2)
        .query(&mut server.client())
        .unwrap();
    let before = redis_keys(&server);
    refused(&store, "key format 2");
    assert_eq!(redis_keys(&server), before, "nothing was touched");
}

#[test]
fn redis_cluster_keys_of_a_newer_format_are_refused_untouched() {
    let Some(cluster) = cluster::RedisCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let port = cluster.servers()[0].port().to_string();
    let set = Command::new("redis-cli")
        .args(["-c", "-p", &port, "SET", "lockrun:{x}:format", "2"])
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let every_key =
        || -> Vec<BTreeMap<String, String>> { cluster.servers().iter().map(redis_keys).collect() };
    let before = every_key();
    refused(&cluster.store(), "key format 2");
    assert_eq!(every_key(), before, "nothing was touched");
}

#[cfg(feature = "postgres")]
#[test]
fn a_postgres_schema_of_a_newer_version_is_refused_untouched() {
    let Some(server) = postgres::PostgresServer::start() else {
        return;
    };
    let server = Arc::new(server);
    let store = Store::on_postgres(&server);
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    let mut client = server.client();
    client
        .batch_execute("COMMENT ON TABLE lockrun.holders IS 'lockrun schema version 99'")
        .unwrap();
    // Every row of every table: a run that got in would raise a fence, or leave a row.
    let rows = |client: &mut ::postgres::Client| -> String {
        client
            .query_one(
                "SELECT (SELECT coalesce(string_agg(l::text, ';'), '') FROM lockrun.locks l)
                        || (SELECT count(*) FROM lockrun.holders)::text
                        || (SELECT count(*) FROM lockrun.waiters)::text",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let before = rows(&mut client);
    refused(&store, "schema version 99");
    assert_eq!(rows(&mut client), before, "nothing was touched");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_keys_of_a_newer_format_are_refused_untouched() {
    use lockrun::backend::etcd::link::{Client, Endpoints, Keys, Op, Txn};
    use std::time::Duration;

    let Some(server) = etcd::EtcdServer::start() else {
        return;
    };
    let url = server.url().to_owned();
    let store = Store::on_etcd(&url, Box::new(server));
    let mut client = Client::new(Endpoints::parse(&url).unwrap());
    let within = Duration::from_secs(5);
    let every_key = |client: &mut Client| -> Vec<Vec<u8>> {
        let listing = client.range(&Keys::prefix(b"/lockrun/"), within).unwrap();
        listing.kvs.into_iter().map(|kv| kv.key).collect()
    };
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    assert_eq!(
        every_key(&mut client),
        [b"/lockrun/.format/0000000001".to_vec()]
    );
    let newer = Txn::new().then(Op::put(b"/lockrun/.format/0000000002", b"", 0));
    client.txn(&newer, within).unwrap();
    let before = every_key(&mut client);
    refused(&store, "key format 2");
    assert_eq!(every_key(&mut client), before, "nothing was touched");
}

#[cfg(feature = "s3")]
#[test]
fn an_s3_state_object_of_a_newer_format_is_refused_untouched() {
    let Some(store) = Store::s3() else {
        return;
    };
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    let flag = |flag: &str| {
        let args = store.args();
        let at = args.iter().position(|arg| arg == flag).expect("the flag");
        args[at + 1].to_string_lossy().into_owned()
    };
    let endpoint = flag("--s3-endpoint");
    let prefix = flag("--s3-url")
        .strip_prefix(&format!("s3://{}/", s3::BUCKET))
        .expect("a prefix")
        .to_owned();
    let key = format!("{prefix}/x.lock.json");
    let object = s3::get_object(&endpoint, &key);
    let mut state: serde_json::Value = serde_json::from_slice(&object.body).expect("its state");
    state["format"] = 2.into();
    state["seq"] = (state["seq"].as_u64().expect("its sequence number") + 1).into();
    let newer = serde_json::to_vec(&state).unwrap();
    assert!(s3::put_object_if_match(
        &endpoint,
        &key,
        &object.etag,
        newer.clone()
    ));
    refused(&store, "object format 2");
    assert_eq!(
        s3::get_object(&endpoint, &key).body,
        newer,
        "nothing was touched"
    );
}
