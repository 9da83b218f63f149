//! lockrun on PostgreSQL, beyond the tests every backend runs (tests/core.rs):
//! one thread, a restart or a terminated session during a hold, a waiter
//! across a restart or an ended session, refusals that show no password and touch nothing, a
//! full server at first contact, a long line on few connections, a line
//! that moves without notifications (as behind a transaction-pooling
//! pgbouncer), the statements of an uncontended run, a granted waiter that
//! starts at its wake-up and a wake-up for another name that starts nothing,
//! readers woken together, and an older schema read as it is.

use std::fs;
use std::process::Stdio;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::core::{hold, line_up, served};
use crate::support::postgres::{PASSWORD, PostgresServer, Proxy, USER};
use crate::support::*;

/// The events a lockrun wrote with `--log-format json` to `file`.
fn events(file: &std::path::Path) -> Vec<serde_json::Value> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn count(events: &[serde_json::Value], event: &str) -> usize {
    events.iter().filter(|e| e["event"] == event).count()
}

/// lockrun's connections to `server`, as the server counts them; waits for
/// room to ask when the server is full for a moment.
fn connections(server: &PostgresServer) -> i64 {
    let mut admin = None;
    wait_until("room for one more connection", || {
        admin = server.try_client().ok();
        admin.is_some()
    });
    admin
        .expect("connected")
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockrun'",
            &[],
        )
        .expect("pg_stat_activity")
        .get(0)
}

/// A holder of `name` on `store` until `release` appears in `scratch`, with
/// its events in `scratch`'s `events` file.
fn holder(store: &Store, scratch: &Scratch, name: &str, extra: &[&str]) -> Running {
    let script = format!(
        "touch '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
    );
    let child = store
        .lockrun()
        .args(["--name", name, "--log-format", "json"])
        .args(extra)
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let ready = scratch.path("ready");
    let mut child = child;
    wait_until("the holder's command to start", || {
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the holder exited ({exited:?}): {:?}",
            events(&scratch.path("events"))
        );
        ready.exists()
    });
    child
}

#[test]
fn lockrun_stays_one_thread_connected_by_host_name() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let url = server.url().replace("127.0.0.1", "localhost");
    let scratch = Scratch::new();
    let count_threads = |file: &str| {
        format!(
            "ls /proc/$PPID/task | wc -l > '{}'",
            scratch.path(file).display()
        )
    };
    let output = run(lockrun()
        .args(["--backend", "postgres", "--postgres-url", &url])
        .args(["--name", "threads", "-c", &count_threads("holding")]));
    assert_status(&output, 0);
    assert_eq!(scratch.lines("holding"), ["1"], "threads of the holder");

    // A waiter, connected and listening, is one thread too.
    let store = Store::on_postgres(&Arc::new(server));
    let mut holder = hold(&store, &scratch, "threads", &[]);
    let mut waiter = lockrun()
        .args(["--backend", "postgres", "--postgres-url", &url])
        .args(["--name", "threads", "-v", "-c", &count_threads("waited")])
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting");
    let tasks = fs::read_dir(format!("/proc/{}/task", waiter.id()))
        .unwrap()
        .count();
    assert_eq!(tasks, 1, "threads of the waiter");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0));
    assert_eq!(scratch.lines("waited"), ["1"]);
}

#[test]
fn a_server_restart_during_a_hold_loses_nothing() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = holder(&store, &scratch, "restart", &["--ttl", "6"]);
    server.kill();
    thread::sleep(Duration::from_millis(500));
    assert!(server.restart(), "restart:\n{}", server.log());
    let restarted = count(&events(&scratch.path("events")), "renewed");
    wait_until("a renewal after the restart", || {
        count(&events(&scratch.path("events")), "renewed") > restarted
    });
    let shown = run(store.status().args(["restart", "--json"]));
    assert!(
        stdout(&shown).contains(&format!("\"pid\":{}", holder.id())),
        "{}",
        stdout(&shown)
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(
        wait(&mut holder).code(),
        Some(0),
        "{:?}",
        events(&scratch.path("events"))
    );
    assert_status(
        &run(store.lockrun().args(["--name", "restart", "-n", "true"])),
        0,
    );
}

#[test]
fn a_terminated_session_is_made_anew_and_the_lease_renewed() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = holder(&store, &scratch, "terminated", &["--ttl", "1.5"]);
    let ended: i64 = server
        .client()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'lockrun'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "the holder's session");
    let before = count(&events(&scratch.path("events")), "renewed");
    wait_until("two renewals on a new session", || {
        count(&events(&scratch.path("events")), "renewed") >= before + 2
    });
    assert_eq!(connections(&server), 1);
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

/// A waiter whose session is ended while it waits rides that out in steps
/// of at most TTL/3, however long its backoff step: it keeps its place, and
/// the slot a release gives it is taken at once, not after a 10-30 s sleep.
#[test]
fn a_waiter_whose_session_is_ended_takes_the_freed_slot_within_a_ttl() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = holder(&store, &scratch, "cut", &["--ttl", "1.5"]);
    let waiting = Store::on_postgres_at(
        &format!("{}?application_name=waiter", server.url()),
        Box::new(Arc::clone(&server)),
    );
    let waiter_events = scratch.path("waiter-events");
    let waiter = waiting
        .lockrun()
        .args([
            "--name",
            "cut",
            "--ttl",
            "1.5",
            "-w",
            "60",
            "--log-format",
            "json",
        ])
        .args(["--initial-delay", "20", "--max-delay", "20", "true"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&waiter_events).unwrap())
        .start();
    wait_until("the waiter in line", || {
        count(&events(&waiter_events), "waiting") == 1
    });
    let ended: i64 = server
        .client()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'waiter'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ended >= 1, "the waiter's session");
    wait_until("the waiter riding out its ended session", || {
        events(&waiter_events)
            .iter()
            .any(|event| event["event"] == "retry" && event["reason"] != "contended")
    });
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    let released = Instant::now();
    assert_status(&finish(waiter), 0);
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter took {:?}: {:?}",
        released.elapsed(),
        events(&waiter_events)
    );
}

#[test]
fn a_holder_that_cannot_reach_the_server_within_its_lease_stops_its_command() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = holder(&store, &scratch, "gone", &["--ttl", "1.5"]);
    server.kill();
    let killed = Instant::now();
    assert_eq!(wait(&mut holder).code(), Some(76));
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    let lost = events(&scratch.path("events"));
    assert_eq!(count(&lost, "lost"), 1, "{lost:?}");
}

#[test]
fn a_waiter_rides_out_a_server_restart() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = holder(&store, &scratch, "ridden", &["--ttl", "6"]);
    let mut waiter = store
        .lockrun()
        .args([
            "--name",
            "ridden",
            "-w",
            "60",
            "--initial-delay",
            "0.2",
            "--max-delay",
            "1",
        ])
        .args(["--log-format", "json", "--", "touch"])
        .arg(scratch.path("ran"))
        .stderr(fs::File::create(scratch.path("waiter")).unwrap())
        .start();
    wait_until("the waiter to join the line", || {
        count(&events(&scratch.path("waiter")), "waiting") == 1
    });
    server.kill();
    wait_until("the waiter to notice", || {
        events(&scratch.path("waiter"))
            .iter()
            .any(|e| e["event"] == "retry" && e["reason"] != "contended")
    });
    assert!(server.restart(), "restart:\n{}", server.log());
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(
        wait(&mut waiter).code(),
        Some(0),
        "{:?}",
        events(&scratch.path("waiter"))
    );
    assert!(scratch.path("ran").exists());
}

#[test]
fn a_wrong_password_exits_69_and_is_never_shown() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let wrong = "wr0ng-s3cret";
    let url = server.url_with(USER, wrong);
    for command in [
        lockrun().args([
            "-b",
            "postgres",
            "--postgres-url",
            &url,
            "--name",
            "x",
            "true",
        ]),
        lockrun().args(["status", "-b", "postgres", "--postgres-url", &url]),
    ] {
        let output = run(command);
        assert_status(&output, 69);
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("password authentication failed"), "{err}");
        assert!(!err.contains(wrong) && !err.contains(PASSWORD), "{err}");
        assert!(stdout(&output).is_empty());
    }
    // Nor does --help show the variable's value.
    let help = run(lockrun().arg("--help").env("LOCKRUN_POSTGRES_URL", &url));
    assert!(!stdout(&help).contains(wrong), "{}", stdout(&help));
}

#[test]
fn a_schema_that_is_not_lockruns_is_refused_and_left_alone() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let mut admin = server.client();
    admin
        .batch_execute(
            "CREATE SCHEMA lockrun; CREATE TABLE lockrun.holders (id int);
             INSERT INTO lockrun.holders VALUES (7)",
        )
        .unwrap();
    let store = Store::on_postgres(&server);
    // A user with no privilege on the schema is told the same.
    admin
        .batch_execute("CREATE ROLE stranger LOGIN PASSWORD 'stranger-pw'")
        .unwrap();
    let stranger = Store::on_postgres_at(&server.url_with("stranger", "stranger-pw"), Box::new(()));
    for output in [
        run(store.lockrun().args(["--name", "x", "true"])),
        run(&mut store.status()),
        run(store.release().args(["x", "--force"])),
        run(stranger.lockrun().args(["--name", "x", "true"])),
    ] {
        assert_status(&output, 69);
        assert!(
            stderr(&output).contains("is not lockrun's"),
            "{}",
            stderr(&output)
        );
    }
    let tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'lockrun'",
            &[],
        )
        .unwrap()
        .get(0);
    let id: i32 = admin
        .query_one("SELECT id FROM lockrun.holders", &[])
        .unwrap()
        .get(0);
    assert_eq!((tables, id), (1, 7), "untouched");
}

#[test]
fn status_and_release_on_a_new_server_create_nothing() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let output = run(&mut store.status());
    assert_status(&output, 0);
    assert!(
        stdout(&output).starts_with("no lock is held in PostgreSQL at postgres://"),
        "{}",
        stdout(&output)
    );
    let output = run(store.release().args(["x", "--force"]));
    assert_status(&output, 0);
    assert!(
        stdout(&output).starts_with("nothing to release"),
        "{}",
        stdout(&output)
    );
    let schemas: i64 = server
        .client()
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'lockrun'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(schemas, 0, "a look made the schema");
}

#[test]
fn a_full_server_is_waited_out_and_a_long_line_needs_few_connections() {
    // Room for 30 connections, none kept for superusers: 41 lockruns at once overflow it.
    let Some(server) =
        PostgresServer::start_with(&["max_connections=30", "superuser_reserved_connections=0"])
            .map(Arc::new)
    else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut first = hold(&store, &scratch, "crowd", &[]);
    let log = scratch.path("fences");
    let waiters: Vec<Running> = (0..40)
        .map(|_| {
            store
                .lockrun()
                .args(["--name", "crowd", "-w", "60", "--initial-delay", "0.1"])
                .args(["--max-delay", "1", "--log-format", "json", "--"])
                .args(["sh", "-c", "echo $LOCKRUN_FENCE >> \"$0\"; sleep 0.02"])
                .arg(&log)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .start()
        })
        .collect();
    // All 40 in line at once, on a server with room for 30: only the first
    // ones keep a connection, the others connect to look.
    wait_until("40 waiters in line", || {
        let output = run(store.status().args(["crowd", "--json"]));
        stdout(&output).matches("\"waiting\"").count() == 40
    });
    let peak = (0..20)
        .map(|_| {
            thread::sleep(Duration::from_millis(50));
            connections(&server)
        })
        .max()
        .unwrap();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut first).code(), Some(0));
    let mut crowded = 0;
    for waiter in waiters {
        let output = finish(waiter);
        assert_status(&output, 0);
        crowded += usize::from(stderr(&output).contains("too many clients"));
    }
    assert_eq!(scratch.lines("fences").len(), 40);
    eprintln!(
        "41 lockruns: at most {peak} connections while 40 waited; {crowded} found the server full at first and waited"
    );
}

#[test]
fn a_no_wait_run_on_a_full_server_answers_soon_after_a_connection_frees() {
    // Room for 3 connections, none kept for superusers: the test takes them all.
    let Some(server) =
        PostgresServer::start_with(&["max_connections=3", "superuser_reserved_connections=0"])
            .map(Arc::new)
    else {
        return;
    };
    let store = Store::on_postgres(&server);
    // The schema is made first, so that the run below only connects and looks.
    assert_status(
        &run(store.lockrun().args(["--name", "full", "--", "true"])),
        0,
    );
    let mut taken: Vec<_> = (0..3).map(|_| server.client()).collect();
    let refusals = || server.log().matches("too many clients").count();
    let before = refusals();
    // A backoff step would be 1.5 s at least.
    let run = store
        .lockrun()
        .args([
            "--name",
            "full",
            "--no-wait",
            "--initial-delay",
            "3s",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .start();
    wait_until("the run to find the server full", || refusals() > before);
    let freed = Instant::now();
    drop(taken.pop());
    let output = finish(run);
    let answered = freed.elapsed();
    assert_status(&output, 0);
    assert!(
        answered < Duration::from_millis(1200),
        "answered {answered:?} after a connection freed"
    );
}

#[test]
fn without_notifications_the_line_still_moves_by_polling() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let proxy = Proxy::start(&server, false);
    let url = proxy.url();
    let scratch = Scratch::new();
    let lockrun_on = |name: &str| {
        let mut command = lockrun();
        command.args(["-b", "postgres", "--postgres-url", &url, "--name", name]);
        command
    };
    let holder_script = format!(
        "touch '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
    );
    let mut holder = lockrun_on("quiet").args(["-c", &holder_script]).start();
    wait_for_file(&scratch.path("ready"));
    let log = scratch.path("order");
    let mut waiters = Vec::new();
    for id in 1..=3 {
        waiters.push(
            lockrun_on("quiet")
                .args([
                    "-w",
                    "30",
                    "--initial-delay",
                    "0.2",
                    "--max-delay",
                    "0.5",
                    "-v",
                ])
                .args(["-c", &format!("echo {id} >> '{}'", log.display())])
                .stderr(Stdio::piped())
                .start(),
        );
        wait_for_stderr(waiters.last_mut().unwrap(), "waiting");
    }
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    assert_eq!(
        scratch.lines("order"),
        ["1", "2", "3"],
        "first come, first served"
    );
}

#[test]
fn an_uncontended_run_takes_few_round_trips() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let proxy = Proxy::start(&server, true);
    let url = proxy.url();
    let run_true = || {
        run(lockrun().args([
            "-b",
            "postgres",
            "--postgres-url",
            &url,
            "--name",
            "rt",
            "true",
        ]))
    };
    // The first run makes the schema.
    assert_status(&run_true(), 0);
    let before = proxy.turns();
    assert_status(&run_true(), 0);
    let turns = proxy.turns() - before;
    eprintln!("an uncontended run: {turns} round trips, connecting included");
    // Startup and SCRAM (3), the schema check, the acquire, the release.
    assert!(turns <= 6, "{turns} round trips");
}

#[test]
fn a_busy_no_wait_run_names_the_holder_from_one_look_without_the_names_lock() {
    let Some(server) = statements_counted().map(Arc::new) else {
        return;
    };
    let proxy = Proxy::start(&server, true);
    let scratch = Scratch::new();
    let mut holder = holder(&Store::on_postgres(&server), &scratch, "busy", &[]);
    // Another session holds the name's lock the while: a run that took it
    // would wait for it up to its lock_timeout (5 s, connect_timeout's default).
    let mut other = server.client();
    let mut locking = other.transaction().unwrap();
    locking
        .execute(
            "SELECT FROM lockrun.locks WHERE name = 'busy' FOR UPDATE",
            &[],
        )
        .unwrap();
    let before = proxy.turns();
    server
        .client()
        .batch_execute("SELECT pg_stat_statements_reset()")
        .unwrap();
    let started = Instant::now();
    let busy = run(Store::on_postgres_at(&proxy.url(), Box::new(()))
        .lockrun()
        .args(["--name", "busy", "--no-wait", "true"]));
    let took = started.elapsed();
    let turns = proxy.turns() - before;
    let (calls, statements) = statements_run(&server);
    locking.rollback().unwrap();
    assert_status(&busy, 75);
    let said = stderr(&busy);
    assert!(
        // The program's name, not the `command` column's packed JSON.
        said.contains(&format!("held by pid {}", holder.id())) && said.contains("sh)\n"),
        "the message names the holder: {said}"
    );
    assert!(took < Duration::from_secs(4), "answered after {took:?}");
    // Startup and SCRAM (3), the schema check and the look, whose holders the message names.
    assert!(turns <= 5, "{turns} round trips");
    // The schema check and the look: neither the name's lock nor a take, nothing
    // that tidies or wakes a line it does not stand in.
    assert!(calls <= 2, "{calls} statements: {statements:#?}");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

#[test]
fn a_no_wait_run_takes_a_free_slot_after_its_look() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let proxy = Proxy::start(&server, true);
    let store = Store::on_postgres_at(&proxy.url(), Box::new(()));
    // The first run makes the schema; then a name never used, whose row the
    // take makes, and the same name, its slot freed.
    for name in ["first", "fresh", "fresh"] {
        let before = proxy.turns();
        let ran = run(store
            .lockrun()
            .args(["--name", name, "--no-wait", "--", "echo", "ran"]));
        assert_status(&ran, 0);
        assert_eq!(String::from_utf8_lossy(&ran.stdout), "ran\n");
        let turns = proxy.turns() - before;
        // Startup and SCRAM (3), the schema check, the look, the take, the release.
        assert!(name == "first" || turns <= 7, "{turns} round trips");
    }
}

#[test]
fn a_no_wait_run_whose_take_was_made_but_never_answered_runs_its_command() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let direct = Store::on_postgres(&server);
    // The first run makes the schema.
    assert_status(&run(direct.lockrun().args(["--name", "first", "true"])), 0);
    // Connecting (3), the schema check, the look, then the take: made, its
    // answer lost, and the next connection cut too, so the run rides it out.
    let proxy = Proxy::losing_answer(&server, 6);
    let ran = run(Store::on_postgres_at(&proxy.url(), Box::new(()))
        .lockrun()
        .args(["--name", "lost", "--no-wait", "--initial-delay", "0.1"])
        .args(["--", "echo", "ran"]));
    let lost = proxy.lost_answer();
    assert!(
        lost.iter().any(|tag| tag == "COMMIT"),
        "the take was made before its answer was lost: {lost:?}"
    );
    // Its look after the trouble finds the slot its own, not a holder's to wait for.
    assert_status(&ran, 0);
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "ran\n");
    // And it let the slot go.
    assert_status(
        &run(direct
            .lockrun()
            .args(["--name", "lost", "--no-wait", "true"])),
        0,
    );
}

/// A server that counts the statements it runs (`pg_stat_statements`), utility ones aside.
fn statements_counted() -> Option<PostgresServer> {
    let server = PostgresServer::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track_utility=off",
    ])?;
    server
        .client()
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .unwrap();
    Some(server)
}

/// How many statements `server` ran since its count was reset, and each with its calls.
fn statements_run(server: &PostgresServer) -> (i64, Vec<(String, i64)>) {
    let statements: Vec<(String, i64)> = server
        .client()
        .query(
            "SELECT query, calls FROM pg_stat_statements
              WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY query",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    (statements.iter().map(|(_, calls)| calls).sum(), statements)
}

#[test]
fn an_uncontended_run_has_the_server_read_no_line() {
    let Some(server) = statements_counted() else {
        return;
    };
    let run_true = || {
        run(lockrun().args([
            "-b",
            "postgres",
            "--postgres-url",
            &server.url(),
            "--name",
            "quiet",
            "true",
        ]))
    };
    // The first run makes the schema and the name's row.
    assert_status(&run_true(), 0);
    server
        .client()
        .batch_execute("SELECT pg_stat_statements_reset()")
        .unwrap();
    assert_status(&run_true(), 0);
    let (calls, statements) = statements_run(&server);
    // The schema check; the name's lock and the take; the lock, the release and the wake.
    assert!(calls <= 6, "{calls} statements: {statements:#?}");
}

#[test]
fn a_waiter_granted_the_slot_starts_its_command_without_asking_the_server_again() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let proxy = Proxy::start(&server, true);
    let scratch = Scratch::new();
    let lockrun_at = |url: &str| {
        let mut command = lockrun();
        command.args(["-b", "postgres", "--postgres-url", url, "--name", "told"]);
        command
    };
    let mut holder = holder(&Store::on_postgres(&server), &scratch, "told", &[]);
    // The waiter alone goes through the proxy; its backoff steps are long, so
    // it looks only when told.
    let mut waiter = lockrun_at(&proxy.url())
        .args(["-w", "30", "--initial-delay", "5", "-v", "true"])
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting");
    let before = proxy.turns();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0));
    let turns = proxy.turns() - before;
    // Its release; the wake-up said which slot and fence were granted.
    assert_eq!(
        turns, 1,
        "round trips from the wake-up to the waiter's exit"
    );
}

#[test]
fn a_waiter_readies_its_release_while_it_waits() {
    // Settings under which a name is easily written in wrongly, and a schema
    // whose quoted name holds what a parameter would look like outside quotes.
    const PREFIX: &str = r#"lr$1"$2"#;
    let Some(server) = PostgresServer::start_with(&[
        "log_min_duration_statement=0",
        "backslash_quote=off",
        "standard_conforming_strings=off",
    ])
    .map(Arc::new) else {
        return;
    };
    let scratch = Scratch::new();
    let lockrun_on = || {
        let mut command = lockrun();
        let url = server.url();
        command.args([
            "-b",
            "postgres",
            "--postgres-url",
            &url,
            "--prefix",
            PREFIX,
            "--name",
            r"it's \ready",
        ]);
        command
    };
    let mut holder = holder(
        &Store::on_postgres(&server),
        &scratch,
        r"it's \ready",
        &["--prefix", PREFIX],
    );
    let mut waiter = lockrun_on()
        .args(["-w", "30", "-v", "true"])
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0));
    // The slot is free again: the release, its values written in, found the waiter's row.
    let after = lockrun_on().args(["--no-wait", "true"]).output().unwrap();
    assert_eq!(after.status.code(), Some(0), "{after:?}");
    let log = server.log();
    // The statements the server logged, each whole (a statement's text runs over lines).
    let mut entries: Vec<String> = Vec::new();
    for line in log.lines() {
        match (line.strip_prefix('\t'), entries.last_mut()) {
            (Some(more), Some(entry)) => entry.push_str(more),
            _ => entries.push(line.to_owned()),
        }
    }
    let said = |what: &str| {
        let what = format!("; {what} lockrun_wake_");
        let said: Vec<&String> = entries
            .iter()
            .filter(|entry| entry.contains(" LOG: ") && entry.contains("statement: "))
            .filter(|entry| entry.contains(&what))
            .collect();
        said
    };
    // The waiter prepared and planned the wake while it waited, and its release ran it
    // so, in one message with the name's lock and the delete; the holder, which nobody
    // was behind when it took the slot, released the plain way.
    assert_eq!(said("PREPARE").len(), 1, "{log}");
    assert_eq!(said("EXPLAIN EXECUTE").len(), 1, "{log}");
    let released = said("EXECUTE");
    assert_eq!(released.len(), 1, "{log}");
    assert!(released[0].contains("FOR UPDATE; DELETE FROM"), "{log}");
    assert!(!log.contains("ERROR:"), "{log}");
}

#[test]
fn waiters_too_far_back_to_listen_come_in_before_the_line_reaches_them() {
    let Some(store) = Store::postgres() else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "far", &[]);
    // 17 waiters listen (one slot and 16 more); the 13 behind them look from afar,
    // behind a 5 s backoff step: one that only polled would hold the line up that long.
    let mut waiters = line_up(
        &store,
        &scratch,
        "far",
        30,
        &["-w", "60", "--initial-delay", "5"],
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    served_in_order_never_standing_still(&scratch, 30, Duration::from_secs(2));
}

/// The `count` waiters `scratch` logged were served in arrival order, each
/// command starting less than `within` after the one before.
fn served_in_order_never_standing_still(scratch: &Scratch, count: usize, within: Duration) {
    let served = served(scratch);
    let order: Vec<usize> = served.iter().map(|(place, _)| *place).collect();
    assert_eq!(
        order,
        (0..count).collect::<Vec<_>>(),
        "first come, first served"
    );
    let longest = served
        .windows(2)
        .map(|pair| pair[1].1 - pair[0].1)
        .max()
        .unwrap();
    assert!(
        longest < i128::try_from(within.as_nanos()).unwrap(),
        "the line stood still for {} ms",
        longest / 1_000_000
    );
}

/// Far back in line, a waiter waits for the end of the waiter of its host
/// that stands among the listening places ahead of it (once that one has
/// run, it is among them itself), not for a timer: each of the 13 behind the
/// 17 that listen connects once more, to listen, though the line moves a place
/// every 150 ms or so, slower than the 100 ms a place that paces the looks of
/// a far waiter with nobody of its host to wait for, and though the backoff's
/// steps (1 s, then 1.5 s) would have it look again meanwhile; and none comes
/// in late.
#[test]
fn waiters_too_far_back_to_listen_come_in_when_one_of_their_host_among_the_listeners_ends() {
    let Some(server) = PostgresServer::start_with(&["log_connections=on"]).map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "slow", &[]);
    let stamps = scratch.path("served");
    let mut waiters: Vec<Running> = (0..30)
        .map(|place| {
            let script = format!(
                "echo {place} $(date +%s%N) >> '{}'; sleep 0.15",
                stamps.display()
            );
            let waiter = store
                .lockrun()
                .args(["--name", "slow", "-w", "60", "-c", &script])
                .start();
            wait_until("a waiter in line", || {
                waiting_pids(&store, "slow").len() > place
            });
            waiter
        })
        .collect();
    let connected = || server.log().matches("connection authorized").count();
    let before = connected();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    let opened = connected() - before;
    eprintln!("the 13 far waiters opened {opened} sessions while the line moved");
    served_in_order_never_standing_still(&scratch, 30, Duration::from_secs(1));
    assert!(
        opened <= 13 + 2,
        "the 13 far waiters opened {opened} sessions while the line moved"
    );
}

/// A waiter far back in line that comes among the listening places connects
/// anew, looks once, listening from before that look (a wake-up sent after it
/// reaches it; what one sent before it said, the look sees), and readies its
/// release in one round trip, where it looked twice and readied it in three.
#[test]
fn a_waiter_that_comes_in_from_afar_looks_once_and_readies_its_release_at_once() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let proxy = Proxy::start(&server, true);
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "in", &[]);
    // One slot and 16 more listen; the 18th, through the proxy, stands beyond
    // them. It comes in as the first of them ends, 16 places from the head.
    let mut waiters: Vec<Running> = (0..17)
        .map(|place| {
            let waiter = store
                .lockrun()
                .args(["--name", "in", "-w", "60", "sleep", "0.1"])
                .start();
            wait_until("a waiter in line", || {
                waiting_pids(&store, "in").len() > place
            });
            waiter
        })
        .collect();
    let proxied = Store::on_postgres_at(&proxy.url(), Box::new(()));
    let mut far = far_waiter(
        &proxied,
        &scratch,
        &["--name", "in", "--initial-delay", "30"],
    );
    let before = proxy.turns();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    assert_eq!(wait(&mut far).code(), Some(0));
    let turns = proxy.turns() - before;
    eprintln!("the far waiter took {turns} turns from in line to its end");
    // Startup and SCRAM (3), the look, the release readied; a look each time
    // a slot is granted to one of the two places ahead of it (told so, in
    // case the new head has died), none for its own grant; the release.
    assert!(turns <= 3 + 2 + 2 + 1, "{turns} round trips");
}

/// Far back in line, a waiter that waits for a waiter of its host among the
/// listeners keeps its place (every TTL/3) with the keep alone: the server
/// does not read the line for it, which in a line of a thousand made a
/// hundred such reads a second. It still comes in and runs when its turn comes.
#[test]
fn a_waiter_far_back_keeps_its_place_without_the_server_reading_the_line() {
    let Some(server) = PostgresServer::start_with(&[
        "log_connections=on",
        "log_statement=all",
        "log_line_prefix=%c ",
    ])
    .map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "kept", &[]);
    // One slot and 16 more listen over the sessions they keep; the 18th, with
    // a TTL of 3 s, keeps its place every second, each time over a new session.
    let mut waiters = line_up(&store, &scratch, "kept", 17, &["-w", "60"]);
    waiters.push(far_waiter(
        &store,
        &scratch,
        &["--name", "kept", "--ttl", "3s"],
    ));
    let known: Vec<String> = sessions_opened(&server.log());
    wait_until("three places kept afar", || {
        sessions_opened(&server.log()).len() >= known.len() + 3
    });
    let log = server.log();
    let afar: Vec<String> = sessions_opened(&log)
        .into_iter()
        .filter(|session| !known.contains(session))
        .collect();
    let statements: Vec<&str> = log
        .lines()
        .filter(|line| {
            afar.iter()
                .any(|session| line.starts_with(&format!("{session} ")))
        })
        .filter(|line| line.contains("statement: ") || line.contains("execute "))
        .collect();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    assert!(
        statements
            .iter()
            .any(|line| line.contains("SET expires_at")),
        "{statements:#?}"
    );
    assert!(
        !statements.iter().any(|line| line.contains("WITH line AS")),
        "{statements:#?}"
    );
}

/// Far back in line, a waiter that waits for the end of a waiter of its host
/// among the listeners looks again once that waiter has left the line though
/// its process lives on. Here it is paused and its place lapses; the waiters
/// between are killed, and so is the holder. Their places and the holder's
/// lease run out and nobody releases, so nobody grants the free slot to the
/// far waiter, now at the head: it must see that for itself, not wait for
/// the paused process's end.
#[test]
fn a_far_waiter_looks_again_once_the_waiter_it_watches_has_left_the_line_alive() {
    let Some(store) = Store::postgres() else {
        return;
    };
    let scratch = Scratch::new();
    let ttl = ["--ttl", "3s"];
    let mut holder = hold(&store, &scratch, "left", &ttl);
    // One slot and 16 more listen; the 18th stands beyond them and watches the first.
    let mut waiters = line_up(&store, &scratch, "left", 17, &["-w", "60", "--ttl", "3s"]);
    let mut far = far_waiter(&store, &scratch, &["--name", "left", "--ttl", "3s"]);
    let watched = waiters[0].id();
    signal(watched, nix::sys::signal::Signal::SIGSTOP);
    for gone in waiters[1..].iter_mut().chain([&mut holder]) {
        gone.kill().unwrap();
        gone.wait().unwrap();
    }
    let status = wait(&mut far);
    signal(watched, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(status.code(), Some(0));
}

/// A waiter that runs `true` with `args` (its name among them), once it is in line.
fn far_waiter(store: &Store, scratch: &Scratch, args: &[&str]) -> Running {
    let events = scratch.path("far.events");
    let waiter = store
        .lockrun()
        .args(["-w", "60", "--log-format", "json"])
        .args(args)
        .arg("true")
        .stderr(fs::File::create(&events).unwrap())
        .start();
    wait_until("the far waiter in line", || {
        fs::read_to_string(&events).is_ok_and(|text| text.contains(r#""waiting""#))
    });
    waiter
}

/// The sessions `log` says were authorized, by their ids (`log_line_prefix=%c `).
fn sessions_opened(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains("connection authorized"))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn a_waiter_too_far_back_to_listen_sleeps_between_its_looks() {
    let Some(store) = Store::postgres() else {
        return;
    };
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "afar", &[]);
    // 17 waiters listen; the last of 70 stands 53 places beyond them, so it looks
    // again only after 5.3 s (100 ms a place), or its 30 s backoff step. Every
    // waiter here has one of its own host just ahead: watching that one's
    // process would wake it every second in between.
    let mut waiters = line_up(
        &store,
        &scratch,
        "afar",
        70,
        &["-w", "60", "--initial-delay", "30"],
    );
    let last = waiters.last().unwrap().id();
    let wakeups = || {
        crate::core::counters_of(last)
            .expect("the waiter's counters")
            .0
    };
    let before = wakeups();
    let watched = Duration::from_secs(3);
    thread::sleep(watched);
    let woke = wakeups() - before;
    eprintln!("the last waiter woke {woke} times in {watched:?}");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    assert!(
        woke <= 1,
        "the last waiter woke {woke} times in {watched:?}"
    );
}

#[test]
fn a_server_too_busy_to_answer_at_first_contact_is_waited_out() {
    use std::io;
    use std::net::{TcpListener, TcpStream};

    let Some(server) = PostgresServer::start() else {
        return;
    };
    // In front of the server, as it looks in a fleet's cron minute: the first
    // connection is accepted and not answered in a call's 5 s; the rest reach the server.
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = front.local_addr().unwrap().port();
    let upstream = server.port();
    thread::spawn(move || {
        for (at, client) in front.incoming().map_while(Result::ok).enumerate() {
            if at < 1 {
                thread::spawn(move || {
                    thread::sleep(Duration::from_secs(6));
                    drop(client);
                });
                continue;
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                thread::spawn(move || io::copy(&mut from, &mut to));
            }
        }
    });
    let url = format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres?sslmode=disable&connect_timeout=1"
    );
    let lockrun = || {
        let mut command = lockrun();
        command.args([
            "--backend",
            "postgres",
            "--postgres-url",
            &url,
            "--name",
            "busy",
        ]);
        command
    };
    // Even a `--no-wait` run rides it out, saying what the server did.
    let output = run(lockrun().args(["--no-wait", "-v", "--initial-delay", "0.1", "true"]));
    assert_status(&output, 0);
    assert!(
        stderr(&output).contains("did not answer"),
        "{}",
        stderr(&output)
    );
}

/// `status` and `release --force` read a schema from before the rows said
/// their mode as it is: its holders held alone.
#[test]
fn status_and_release_read_a_version_2_schema_as_it_is() {
    let Some(server) = PostgresServer::start() else {
        return;
    };
    let server = Arc::new(server);
    let store = Store::on_postgres(&server);
    assert_status(&run(store.lockrun().args(["--name", "old", "true"])), 0);
    let mut admin = server.client();
    admin
        .batch_execute(
            "ALTER TABLE lockrun.holders DROP COLUMN mode;
             ALTER TABLE lockrun.waiters DROP COLUMN mode;
             COMMENT ON TABLE lockrun.holders IS 'lockrun schema version 2';
             INSERT INTO lockrun.holders (name, slot, token, fence, pid, start_time, boot_id,
                                          host, command, acquired_at, expires_at, parallelism)
             VALUES ('old', 0, 'an-old-token', 7, 1, 1, 'boot', 'elsewhere', 'old job', now(),
                     now() + interval '1 hour', 1)",
        )
        .unwrap();
    let output = run(store.status().args(["old", "--json"]));
    assert_status(&output, 0);
    let entries: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(entries[0]["command"], "old job", "{entries}");
    assert_eq!(entries[0]["mode"], "exclusive", "{entries}");
    assert_status(&run(store.release().args(["old", "--force"])), 0);
    let output = run(store.status().args(["old", "--json"]));
    assert_eq!(stdout(&output).trim(), "[]");
    let modes: i64 = admin
        .query_one(
            "SELECT count(*) FROM information_schema.columns
              WHERE table_schema = 'lockrun' AND column_name = 'mode'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(modes, 0, "status or release changed the schema");
}

#[test]
fn a_password_in_the_url_is_blanked_in_ps() {
    let Some(store) = Store::postgres() else {
        return;
    };
    crate::core::no_password_stays_in_ps(&store, PASSWORD);
}

/// A run with several names listens for each name's wake-ups on that name's
/// own channel: a grant that comes on the first name's channel while it waits
/// for the second (as a late one would, for a slot it took by a look) starts
/// nothing. Before, it listened on the first name's channel alone and took
/// such a grant for the second name's: its command ran without that lock.
#[test]
fn a_wake_up_for_another_name_of_the_run_starts_nothing() {
    let Some(server) = PostgresServer::start().map(Arc::new) else {
        return;
    };
    let store = Store::on_postgres(&server);
    let (first, second) = (Scratch::new(), Scratch::new());
    let mut holds_a = holder(&store, &first, "a", &[]);
    let mut holds_b = holder(&store, &second, "b", &[]);
    let ran = first.path("ran");
    let mut run_both = store
        .lockrun()
        .args([
            "--name",
            "a",
            "--name",
            "b",
            "-w",
            "60",
            "--initial-delay",
            "20",
        ])
        .args(["touch", ran.to_str().unwrap()])
        .start();
    let mut admin = server.client();
    let mut waiting_for = |name: &str| {
        let rows = admin
            .query(
                "SELECT count(*) FROM lockrun.waiters WHERE name = $1",
                &[&name],
            )
            .unwrap();
        rows[0].get::<_, i64>(0) > 0
    };
    wait_until("the run in line for a", || waiting_for("a"));
    fs::write(first.path("release"), "").unwrap();
    assert_eq!(wait(&mut holds_a).code(), Some(0));
    wait_until("the run in line for b", || waiting_for("b"));
    let token: String = admin
        .query_one("SELECT token FROM lockrun.holders WHERE name = 'a'", &[])
        .unwrap()
        .get(0);
    admin
        .execute(
            "SELECT pg_notify('lockrun:' || $1, 'granted 0 999')",
            &[&token],
        )
        .unwrap();
    // The run looks again only after its first backoff step (20 s): what it
    // does before then, it does on the wake-up.
    let told = Instant::now();
    while told.elapsed() < Duration::from_secs(2) {
        assert!(!ran.exists(), "the command ran while b was held");
        assert!(run_both.try_wait().unwrap().is_none(), "the run ended");
        thread::sleep(Duration::from_millis(20));
    }
    fs::write(second.path("release"), "").unwrap();
    assert_eq!(wait(&mut holds_b).code(), Some(0));
    assert_eq!(wait(&mut run_both).code(), Some(0));
    assert!(ran.exists());
}
