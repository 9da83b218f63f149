//! PostgreSQL groundwork against a real server: connecting with a password
//! (and being refused without the right one, which no message repeats), a
//! hard deadline on every call, failures sorted for the backend, lockrun's
//! schema, LISTEN/NOTIFY with a timeout, leases dated by the server's clock,
//! a restart that loses nothing, and sslmode with rustls.

use std::thread;
use std::time::{Duration, Instant};

use lockrun::backend::net::{Failure, Kind};
use lockrun::backend::postgres::connect::{Connector, Session};
use lockrun::backend::postgres::schema::{SCHEMA_VERSION, Schema, create_or_check};
use lockrun::backend::postgres::target::Target;
use nix::sys::signal::Signal;
use postgres::types::Type;

use crate::support::postgres::{PASSWORD, PostgresServer, USER};
use crate::support::{PATIENCE, Scratch, signal, write_certificates};

/// The time a call is given in these tests: far more than any should take.
const CALL: Duration = Duration::from_secs(5);

fn connect(url: &str) -> Result<Session, Failure> {
    Connector::new(Target::parse(Some(url), "--postgres-url").expect("a valid URL"))?.connect(CALL)
}

/// The failure connecting to `url`, which must fail.
fn refusal(url: &str) -> Failure {
    match connect(url) {
        Ok(_) => panic!("connected to {url}"),
        Err(failure) => failure,
    }
}

fn backend_pid(session: &mut Session) -> i32 {
    session
        .call("ask for the backend's pid", CALL, async |client| {
            Ok(client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0))
        })
        .expect("the backend's pid")
}

/// `SELECT 1` within `within`.
fn ping(session: &mut Session, within: Duration) -> Result<(), Failure> {
    session.call("ping", within, async |client| {
        client.batch_execute("SELECT 1").await
    })
}

#[test]
fn connects_with_the_password_and_refuses_others_without_showing_them() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let mut session = connect(&server.url()).expect("connect with the password");
    let user: String = session
        .call("ask who we are", CALL, async |client| {
            Ok(client
                .query_one("SELECT current_user::text", &[])
                .await?
                .get(0))
        })
        .expect("current_user");
    assert_eq!(user, USER);

    let wrong = "wr0ng-s3cret";
    let failure = refusal(&server.url_with(USER, wrong));
    let message = failure.to_string();
    assert_eq!(failure.kind(), Kind::Permanent, "{message}");
    assert!(
        message.contains("password authentication failed"),
        "{message}"
    );
    assert!(
        message.contains("postgres://lockrun:***@127.0.0.1:"),
        "{message}"
    );
    assert!(
        !message.contains(wrong) && !message.contains(PASSWORD),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message}");
    assert_eq!(lockrun::error::Error::from(failure).exit_code(), 69);

    if std::env::var_os("PGPASSWORD").is_none() {
        let failure = refusal(&format!(
            "postgres://{USER}@127.0.0.1:{}/postgres",
            server.port()
        ));
        assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
        assert!(
            failure.to_string().contains("asks for a password"),
            "{failure}"
        );
    }

    let url = server.url().replace("/postgres", "/nosuchdb");
    let failure = refusal(&url);
    assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
    assert!(failure.to_string().contains("does not exist"), "{failure}");
}

#[test]
fn a_call_to_a_silent_server_gives_up_on_time() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let mut session = connect(&server.url()).expect("connect");
    let pid = backend_pid(&mut session);
    // A stopped backend: the kernel still acknowledges, the server never answers.
    signal(pid.cast_unsigned(), Signal::SIGSTOP);
    let started = Instant::now();
    let result = ping(&mut session, Duration::from_millis(300));
    let took = started.elapsed();
    signal(pid.cast_unsigned(), Signal::SIGCONT);
    let failure = result.expect_err("no answer from a stopped backend");
    assert!(took < Duration::from_secs(1), "gave up after {took:?}");
    assert_eq!(failure.kind(), Kind::Unreachable, "{failure}");
    assert!(
        failure
            .to_string()
            .ends_with("ping failed: no answer within 300ms"),
        "{failure}"
    );
    assert!(failure.is_transient());
    assert!(
        !session.is_usable(),
        "a late reply could be taken for the next call's"
    );
    assert!(ping(&mut session, CALL).expect_err("broken").is_transient());
    // The server itself is fine: a new session works.
    ping(&mut connect(&server.url()).expect("reconnect"), CALL).expect("ping");
}

#[test]
fn a_session_ended_by_an_administrator_is_trouble_that_passes() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let mut session = connect(&server.url()).expect("connect");
    let pid = backend_pid(&mut session);
    let ended: bool = server
        .client()
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .expect("pg_terminate_backend")
        .get(0);
    assert!(ended);
    let failure = ping(&mut session, CALL).expect_err("the session was ended");
    assert!(failure.is_transient(), "{failure}");
    assert!(!session.is_usable());
}

#[test]
fn listen_notify_wakes_a_waiter_at_once_and_a_quiet_wait_times_out() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let mut waiter = connect(&server.url()).expect("connect");
    waiter
        .call("listen", CALL, async |client| {
            client.batch_execute("LISTEN lockrun").await
        })
        .expect("LISTEN");

    let started = Instant::now();
    let quiet = waiter
        .notification(Duration::from_millis(200))
        .expect("a quiet wait");
    let took = started.elapsed();
    assert!(quiet.is_none());
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert!(waiter.is_usable(), "a quiet wait leaves the session usable");

    let mut notifier = server.client();
    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        notifier
            .execute("SELECT pg_notify('lockrun', 'backup')", &[])
            .expect("NOTIFY");
        notifier
    });
    let started = Instant::now();
    let woken = waiter
        .notification(PATIENCE)
        .expect("a wait")
        .expect("a notification");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "woken after {:?}",
        started.elapsed()
    );
    assert_eq!((woken.channel(), woken.payload()), ("lockrun", "backup"));

    // One that arrives during a call is kept for the next wait.
    let mut notifier = sender.join().expect("the notifier");
    notifier
        .execute("SELECT pg_notify('lockrun', 'deploy')", &[])
        .expect("NOTIFY");
    ping(&mut waiter, CALL).expect("ping");
    let kept = waiter
        .notification(PATIENCE)
        .expect("a wait")
        .expect("a notification");
    assert_eq!(kept.payload(), "deploy");
}

#[test]
fn the_schema_is_made_once_and_foreign_or_newer_ones_are_left_alone() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let url = server.url();
    let lockrun = Schema::new("lockrun").unwrap();
    let mut session = connect(&url).expect("connect");
    // Looking (status, release) creates nothing.
    let present = create_or_check(&mut session, &lockrun, false, CALL).expect("a look");
    assert_eq!(present, None);
    let mut admin = server.client();
    let schemas: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'lockrun'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(schemas, 0, "a look made the schema");

    // Four lockruns that use the server for the first time at once.
    let first_uses: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            thread::spawn(move || {
                let mut session = connect(&url).expect("connect");
                create_or_check(&mut session, &Schema::new("lockrun").unwrap(), true, CALL)
            })
        })
        .collect();
    for first_use in first_uses {
        first_use
            .join()
            .expect("a first use")
            .expect("made or found");
    }
    assert_eq!(
        create_or_check(&mut session, &lockrun, false, CALL).expect("found"),
        Some(SCHEMA_VERSION)
    );
    let tables = |admin: &mut postgres::Client, schema: &str| -> Vec<String> {
        admin
            .query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1",
                &[&schema],
            )
            .expect("list tables")
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    assert_eq!(
        tables(&mut admin, "lockrun"),
        ["holders", "locks", "waiters"]
    );

    // An empty schema an administrator made for lockrun is used.
    admin.batch_execute("CREATE SCHEMA premade").unwrap();
    create_or_check(&mut session, &Schema::new("premade").unwrap(), true, CALL).expect("used");
    assert_eq!(
        tables(&mut admin, "premade"),
        ["holders", "locks", "waiters"]
    );

    // Someone else's table of the same name is refused, untouched.
    admin
        .batch_execute(
            "CREATE SCHEMA other; CREATE TABLE other.holders (id int); INSERT INTO other.holders VALUES (7)",
        )
        .unwrap();
    let failure = create_or_check(&mut session, &Schema::new("other").unwrap(), true, CALL)
        .expect_err("someone else's schema");
    assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
    assert!(
        failure.to_string().contains("is not lockrun's"),
        "{failure}"
    );
    assert_eq!(tables(&mut admin, "other"), ["holders"]);
    let row = admin
        .query_one(
            "SELECT id, obj_description('other.holders'::regclass) FROM other.holders",
            &[],
        )
        .unwrap();
    assert_eq!(
        (row.get::<_, i32>(0), row.get::<_, Option<String>>(1)),
        (7, None)
    );

    // A newer lockrun's schema is refused too.
    let newer = format!("schema version {}", SCHEMA_VERSION + 1);
    admin
        .batch_execute(&format!(
            "COMMENT ON TABLE lockrun.holders IS 'lockrun {newer}'"
        ))
        .unwrap();
    let failure =
        create_or_check(&mut session, &lockrun, true, CALL).expect_err("a newer lockrun's schema");
    assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
    assert!(failure.to_string().contains(&newer), "{failure}");
}

/// Many lockruns using a schema for the first time at once, in rounds: each
/// finds it missing, or made empty by an administrator, or made by another of
/// them a moment before. None may take lockrun's own tables, caught half-seen
/// while another commits them, for someone else's.
#[test]
fn first_uses_at_once_never_take_lockruns_own_schema_for_someone_elses() {
    const AT_ONCE: usize = 6;
    const ROUNDS: usize = 16;
    const LOOKS: usize = 6;
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let url = server.url();
    let mut admin = server.client();
    for round in 0..ROUNDS {
        let name = format!("race{round}");
        if round % 2 == 1 {
            admin
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .unwrap();
        }
        let start = std::sync::Arc::new(std::sync::Barrier::new(AT_ONCE));
        let first_uses: Vec<_> = (0..AT_ONCE)
            .map(|_| {
                let (url, name, start) = (url.clone(), name.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    // Again and again, so that some look while another commits;
                    // each in a fresh session, as every run is.
                    (0..LOOKS)
                        .map(|_| {
                            let mut session = connect(&url).expect("connect");
                            create_or_check(&mut session, &Schema::new(&name).unwrap(), true, CALL)
                        })
                        .find(Result::is_err)
                        .unwrap_or(Ok(Some(SCHEMA_VERSION)))
                })
            })
            .collect();
        for first_use in first_uses {
            let made = first_use.join().expect("a first use");
            assert_eq!(
                made.map_err(|e| e.to_string()),
                Ok(Some(SCHEMA_VERSION)),
                "round {round}"
            );
        }
    }
}

#[test]
fn a_version_1_schema_is_brought_up_to_date_by_a_run_only() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let lockrun = Schema::new("lockrun").unwrap();
    let mut session = connect(&server.url()).expect("connect");
    create_or_check(&mut session, &lockrun, true, CALL).expect("the schema");
    let mut admin = server.client();
    // Without the rows' -p and mode: a look leaves it so, a run brings it up to date.
    admin
        .batch_execute(
            "ALTER TABLE lockrun.holders DROP COLUMN parallelism, DROP COLUMN mode;
             ALTER TABLE lockrun.waiters DROP COLUMN parallelism, DROP COLUMN mode;
             COMMENT ON TABLE lockrun.holders IS 'lockrun schema version 1'",
        )
        .unwrap();
    let columns = |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM information_schema.columns
                  WHERE table_schema = 'lockrun' AND column_name IN ('parallelism', 'mode')",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(
        create_or_check(&mut session, &lockrun, false, CALL).expect("a look"),
        Some(1)
    );
    assert_eq!(columns(&mut admin), 0, "a look changed the schema");
    create_or_check(&mut session, &lockrun, true, CALL).expect("brought up to date");
    assert_eq!(columns(&mut admin), 4);
    assert_eq!(
        create_or_check(&mut session, &lockrun, true, CALL).expect("up to date"),
        Some(SCHEMA_VERSION)
    );
}

/// Takes slot 0 of `name` for `ttl_ms` by the server's clock; returns the lease's length as stored.
fn take_slot(session: &mut Session, schema: &Schema, name: &str, ttl_ms: i64) -> i64 {
    let insert = format!(
        "INSERT INTO {} (name, slot, token, fence, pid, start_time, boot_id, host, command,
                         acquired_at, expires_at)
         VALUES ($1, 0, 'token', 1, 42, 0, 'boot', 'host', 'cmd',
                 now(), now() + $2 * interval '1 millisecond')
         RETURNING (extract(epoch FROM expires_at - acquired_at) * 1000)::bigint",
        schema.table("holders")
    );
    session
        .transaction("take a slot", CALL, async |client| {
            let rows = client
                .query_typed(&insert, &[(&name, Type::TEXT), (&ttl_ms, Type::INT8)])
                .await?;
            Ok(rows[0].get(0))
        })
        .expect("take a slot")
}

#[test]
fn leases_are_dated_by_the_server_clock_and_never_revived() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let mut session = connect(&server.url()).expect("connect");
    let schema = Schema::new("lockrun").unwrap();
    create_or_check(&mut session, &schema, true, CALL).expect("the schema");
    assert_eq!(take_slot(&mut session, &schema, "job", 300), 300);

    // A renewal extends only a lease that has not run out.
    let renew = format!(
        "UPDATE {} SET expires_at = now() + $3 * interval '1 millisecond'
          WHERE name = $1 AND token = $2 AND expires_at > now()",
        schema.table("holders")
    );
    let mut renew = || {
        session
            .transaction("renew", CALL, async |client| {
                let rows = client
                    .query_typed(
                        &format!("{renew} RETURNING 1"),
                        &[
                            (&"job", Type::TEXT),
                            (&"token", Type::TEXT),
                            (&300_i64, Type::INT8),
                        ],
                    )
                    .await?;
                Ok(rows.len())
            })
            .expect("renew")
    };
    assert_eq!(renew(), 1, "renewed in time");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(renew(), 0, "a lapsed lease is not revived");
}

#[test]
fn a_server_restart_loses_nothing() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let url = server.url();
    let schema = Schema::new("lockrun").unwrap();
    let mut session = connect(&url).expect("connect");
    create_or_check(&mut session, &schema, true, CALL).expect("the schema");
    take_slot(&mut session, &schema, "job", 60_000);

    server.kill();
    let failure = ping(&mut session, CALL).expect_err("the server is gone");
    assert!(failure.is_transient(), "{failure}");
    let failure = refusal(&url);
    assert_eq!(failure.kind(), Kind::Unreachable, "{failure}");

    assert!(server.restart(), "restart:\n{}", server.log());
    let mut session = connect(&url).expect("reconnect");
    create_or_check(&mut session, &schema, true, CALL).expect("the schema is still lockrun's");
    let holders = format!(
        "SELECT token FROM {} WHERE name = 'job'",
        schema.table("holders")
    );
    let token: String = session
        .call("read the holder", CALL, async |client| {
            Ok(client.query_one(&holders, &[]).await?.get(0))
        })
        .expect("the holder is still there");
    assert_eq!(token, "token");
}

#[test]
fn sslmode_is_obeyed_with_rustls() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let url = |host: &str, query: &str| {
        format!(
            "postgres://{USER}:{PASSWORD}@{host}:{}/postgres?{query}",
            server.port()
        )
    };
    let failure = refusal(&url("127.0.0.1", "sslmode=require"));
    assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
    assert!(
        failure.to_string().contains("does not support TLS"),
        "{failure}"
    );

    let ours = Scratch::new();
    write_certificates(ours.dir());
    server.use_tls(ours.dir());
    let theirs = Scratch::new();
    write_certificates(theirs.dir());
    let (ca, other_ca) = (ours.path("ca.pem"), theirs.path("ca.pem"));
    let uses_tls = |url: &str| -> bool {
        let mut session = connect(url).expect(url);
        session
            .call("ask about TLS", CALL, async |client| {
                let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
                Ok(client.query_one(sql, &[]).await?.get(0))
            })
            .expect("pg_stat_ssl")
    };
    let verify =
        |mode: &str, ca: &std::path::Path| format!("sslmode={mode}&sslrootcert={}", ca.display());
    assert!(!uses_tls(&url("127.0.0.1", "sslmode=disable")));
    assert!(uses_tls(&url("127.0.0.1", "sslmode=prefer")));
    assert!(uses_tls(&url("127.0.0.1", "sslmode=require")));
    assert!(uses_tls(&url("localhost", &verify("verify-full", &ca))));
    assert!(uses_tls(&url("127.0.0.1", &verify("verify-ca", &ca))));
    // The certificate is for localhost, not 127.0.0.1; and another CA did not sign it.
    for (host, query) in [
        ("127.0.0.1", verify("verify-full", &ca)),
        ("localhost", verify("verify-ca", &other_ca)),
        ("localhost", verify("require", &other_ca)),
    ] {
        let failure = refusal(&url(host, &query));
        assert_eq!(failure.kind(), Kind::Permanent, "{failure}");
        assert!(failure.to_string().contains("certificate"), "{failure}");
    }
}
