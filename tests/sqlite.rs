//! The SQLite backend's own guarantees (docs/backends/sqlite.md: "SQLite backend"): leases that are renewed and
//! lost, same-host reclaim, quick handoff, and files that are not lockrun's.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::core::{hold, start_holding};
use crate::support::*;

/// `lockrun [SUBCOMMAND] --backend sqlite --db PATH ARGS`.
fn on_db(subcommand: &[&str], path: &Path, args: &[&str]) -> Command {
    let mut command = lockrun();
    command
        .args(subcommand)
        .args(["--backend", "sqlite", "--db"])
        .arg(path)
        .args(args);
    command
}

/// The `expires_at` that `status --json` shows for the one holder of `name` (fixed-width
/// RFC 3339, so later times compare greater as text).
fn expires_at(store: &Store, name: &str) -> String {
    let output = run(store.status().args([name, "--json"]));
    let holders: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    holders[0]["expires_at"]
        .as_str()
        .unwrap_or_else(|| panic!("an RFC 3339 expiry: {holders}"))
        .to_owned()
}

#[test]
fn renewal_keeps_a_short_lease_through_a_longer_command() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "renewed", &["--ttl", "1"]);
    let started = Instant::now();
    let first_expiry = expires_at(&store, "renewed");
    // Three TTLs: without renewals the lease would have lapsed twice over.
    while started.elapsed() < Duration::from_secs(3) {
        let output = run(store.lockrun().args(["--name", "renewed", "-n", "true"]));
        assert_status(&output, 75);
        thread::sleep(Duration::from_millis(100));
    }
    let last_expiry = expires_at(&store, "renewed");
    assert!(
        last_expiry > first_expiry,
        "status shows the lease moving on: {first_expiry} then {last_expiry}"
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(
        wait(&mut holder).code(),
        Some(0),
        "the holder kept its lease"
    );
}

#[test]
fn a_frozen_holder_loses_its_slot_and_its_watchdog_stops_the_command() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let script = format!(
        "echo $$ > '{ready}.tmp' && mv '{ready}.tmp' '{ready}'; while :; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
    );
    // lockrun alone in its process group: SIGSTOP freezes it, not its command.
    let holder = store
        .lockrun()
        .args(["--name", "frozen", "--ttl", "1.5", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .start();
    let command = read_pid(&scratch.path("ready"));
    let group = Pid::from_raw(holder.id().cast_signed());
    killpg(group, Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();

    let output = run(store
        .lockrun()
        .args(["--name", "frozen", "-w", "10", "true"]));
    assert_status(&output, 0);
    assert!(
        frozen.elapsed() < Duration::from_secs(3),
        "the waiter got the slot once the lease expired, while the holder was still frozen"
    );
    // The watchdog, which no SIGSTOP to lockrun reaches, ended the command at the lease's end.
    assert!(
        !process_exists(command),
        "the command ran on past its lease while lockrun was frozen"
    );

    killpg(group, Signal::SIGCONT).unwrap();
    let output = finish(holder);
    assert_status(&output, 76);
    assert!(stderr(&output).contains("lease"), "{}", stderr(&output));
}

#[test]
fn a_killed_holder_frees_its_slot_long_before_its_ttl() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "crashed", &["--ttl", "60"]);
    let command = read_pid(&scratch.path("ready"));
    let mut waiter = slow_waiter(&store, &scratch, "crashed");
    killpg(Pid::from_raw(command), Signal::SIGKILL).unwrap();
    holder.kill().unwrap();
    let killed = Instant::now();
    // lockrun stays a zombie until reaped: it is dead all the same.
    assert_eq!(wait(&mut waiter).code(), Some(0));
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "the slot was reclaimed at once, not after the 60 s TTL nor the 5 s backoff step ({:?})",
        killed.elapsed()
    );
    holder.wait().unwrap();
}

#[test]
fn a_freed_slot_is_taken_at_once_not_after_the_backoff_step() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "handoff", &[]);
    // The first backoff step is at least 2.5 s (5 s x 0.5 jitter).
    let mut waiter = slow_waiter(&store, &scratch, "handoff");
    fs::write(scratch.path("release"), "").unwrap();
    let released = Instant::now();
    wait_for_file(&scratch.path("got"));
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "the waiter noticed the change before its backoff step ({:?})",
        released.elapsed()
    );
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0));
}

/// A writer's release grants every reader waiting behind it its slot in the
/// release's own transaction (docs/backends/sqlite.md: "SQLite backend"): the
/// woken readers only read what was granted to them, and none waits for
/// another's write. So all eight were acquired at the same moment, with
/// consecutive fences in line order.
#[test]
fn a_writers_release_grants_every_waiting_reader_in_its_own_transaction() {
    const READERS: usize = 8;
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut writer = hold(&store, &scratch, "grants", &[]);
    let holding = scratch.path("holding");
    fs::create_dir(&holding).unwrap();
    let script = format!(
        "touch '{dir}'/$$; until [ -e '{done}' ]; do sleep 0.01; done",
        dir = holding.display(),
        done = scratch.path("done").display()
    );
    let status = || -> serde_json::Value {
        serde_json::from_slice(&run(store.status().args(["grants", "--json"])).stdout).unwrap()
    };
    let readers: Vec<Running> = (0..READERS)
        .map(|joined| {
            let reader = store
                .lockrun()
                .args(["--name", "grants", "-s", "-w", "60", "sh", "-c", &script])
                .start();
            wait_until("the reader to join the line", || {
                status().as_array().unwrap().len() > joined + 1
            });
            reader
        })
        .collect();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut writer).code(), Some(0));
    wait_until("every reader to run", || {
        fs::read_dir(&holding).unwrap().count() == READERS
    });
    let holders = status();
    let holders = holders.as_array().unwrap();
    assert_eq!(holders.len(), READERS, "{holders:?}");
    let acquired: Vec<&str> = holders
        .iter()
        .map(|holder| holder["acquired_at"].as_str().unwrap())
        .collect();
    assert!(
        acquired.iter().all(|at| *at == acquired[0]),
        "granted by one transaction: {acquired:?}"
    );
    let mut fences: Vec<u64> = holders
        .iter()
        .map(|holder| holder["fence"].as_u64().unwrap())
        .collect();
    fences.sort_unstable();
    assert_eq!(
        fences,
        (fences[0]..fences[0] + READERS as u64).collect::<Vec<_>>()
    );
    fs::write(scratch.path("done"), "").unwrap();
    for reader in readers {
        assert_status(&finish(reader), 0);
    }
}

/// A waiter that is stopped (SIGSTOP, a terminal's Ctrl-Z) reads no rings and
/// its doorbell fills up; whoever rings it goes on regardless
/// (docs/backends/sqlite.md: "SQLite backend"). Here twelve runs give up
/// waiting behind it, each ringing the head of the line as it leaves: every
/// one ends at its timeout, none stays stuck ringing.
#[test]
fn a_stopped_waiter_at_the_head_holds_up_nobody_who_rings_it() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "stalled", &[]);
    let mut stopped = store
        .lockrun()
        .args(["--name", "stalled", "-w", "60", "true"])
        .start();
    wait_until("the waiter to join the line", || {
        stdout(&run(store.status().args(["stalled", "--json"]))).contains(r#""state":"waiting""#)
    });
    signal(stopped.id(), Signal::SIGSTOP);
    for _ in 0..12 {
        let output = run(store
            .lockrun()
            .args(["--name", "stalled", "-w", "0.2", "true"]));
        assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    }
    signal(stopped.id(), Signal::SIGCONT);
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut stopped).code(), Some(0));
}

#[test]
fn release_force_breaks_a_live_lease_and_its_command_is_stopped() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    // Renewed every 3 s: that is when the holder learns its lease is gone.
    let mut holder = hold(&store, &scratch, "broken", &["--ttl", "9"]);
    let command = read_pid(&scratch.path("ready"));
    let mut waiter = slow_waiter(&store, &scratch, "broken");

    let output = run(store.release().args(["broken", "--force"]));
    let broken = Instant::now();
    assert_status(&output, 0);
    assert!(
        stdout(&output).contains(&format!("released broken slot 0 (pid {}", holder.id())),
        "{}",
        stdout(&output)
    );
    // The holder is alive, so only the database's change can have woken the waiter this soon.
    wait_for_file(&scratch.path("got"));
    assert!(
        broken.elapsed() < Duration::from_secs(2) && holder.try_wait().unwrap().is_none(),
        "the waiter took the broken slot at once ({:?})",
        broken.elapsed()
    );
    assert_eq!(wait(&mut waiter).code(), Some(0));

    let output = finish(holder);
    assert_status(&output, 76);
    assert!(stderr(&output).contains("lease"), "{}", stderr(&output));
    assert!(!process_exists(command), "the command was stopped");
}

#[test]
fn files_that_are_not_lockrun_databases_are_refused_untouched() {
    let scratch = Scratch::new();
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(scratch.path("random"), &random).unwrap();
    fs::write(scratch.path("text"), "just some notes\n").unwrap();
    let foreign = rusqlite::Connection::open(scratch.path("foreign")).unwrap();
    foreign
        .execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE users (name TEXT);
             INSERT INTO users VALUES ('ann');",
        )
        .unwrap();
    drop(foreign);
    // A lockrun database whose first page, past the header, was overwritten.
    let damaged = scratch.path("damaged");
    assert_status(&run(&mut on_db(&[], &damaged, &["--name", "x", "true"])), 0);
    let mut bytes = fs::read(&damaged).unwrap();
    bytes[100..4096].fill(0xa5);
    fs::write(&damaged, &bytes).unwrap();

    for (name, says) in [
        ("random", "not an SQLite file"),
        ("text", "not an SQLite file"),
        ("foreign", "another program's SQLite database"),
        ("damaged", "damaged"),
    ] {
        let path = scratch.path(name);
        let before = fs::read(&path).unwrap();
        for mut command in [
            on_db(&[], &path, &["--name", "x", "true"]),
            on_db(&["status"], &path, &[]),
        ] {
            let output = run(&mut command);
            assert_status(&output, 69);
            let err = stderr(&output);
            assert!(
                err.lines().count() == 1 && err.contains(says),
                "{name}: {err}"
            );
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            before,
            "{name} is byte-for-byte untouched"
        );
    }
    let mut files: Vec<_> = fs::read_dir(scratch.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["damaged", "foreign", "random", "text"],
        "no journal or WAL file appeared beside a foreign file"
    );
}

#[test]
fn a_locked_database_gives_69_within_a_bounded_time() {
    let scratch = Scratch::new();
    let db = scratch.path("locks.sqlite3");
    assert_status(&run(&mut on_db(&[], &db, &["--name", "x", "true"])), 0);
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // Looking takes no lock: status reads while another process writes.
    assert_status(&run(&mut on_db(&["status"], &db, &[])), 0);
    for mut command in [
        on_db(&[], &db, &["--name", "x", "-w", "1", "true"]),
        on_db(&["release"], &db, &["x", "--force"]),
    ] {
        let started = Instant::now();
        let output = run(&mut command);
        assert_status(&output, 69);
        assert!(stderr(&output).contains("locked"), "{}", stderr(&output));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "gave up after the busy timeout ({:?})",
            started.elapsed()
        );
    }
    drop(locker);
    assert_status(
        &run(&mut on_db(&[], &db, &["--name", "x", "-n", "true"])),
        0,
    );
}

#[test]
fn a_read_only_database_gives_69() {
    let scratch = Scratch::new();
    let db = scratch.path("locks.sqlite3");
    assert_status(&run(&mut on_db(&[], &db, &["--name", "x", "true"])), 0);
    let Some(_read_only) = ReadOnly::make(&db) else {
        eprintln!("skipped: cannot make a file read-only for root here (no chattr +i)");
        return;
    };
    let output = run(&mut on_db(&[], &db, &["--name", "x", "true"]));
    assert_status(&output, 69);
    assert!(stderr(&output).contains("read-only"), "{}", stderr(&output));
    // Looking needs no write access.
    assert_status(&run(&mut on_db(&["status"], &db, &[])), 0);
}

/// A file made read-only for this process: by its mode, or for root (whom modes do
/// not stop) with the immutable attribute, removed again on drop.
struct ReadOnly<'a>(&'a Path);

impl<'a> ReadOnly<'a> {
    fn make(path: &'a Path) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            fs::set_permissions(path, fs::Permissions::from_mode(0o444)).unwrap();
            return Some(Self(path));
        }
        let status = Command::new("chattr").arg("+i").arg(path).status();
        status.is_ok_and(|s| s.success()).then_some(Self(path))
    }
}

impl Drop for ReadOnly<'_> {
    fn drop(&mut self) {
        if nix::unistd::geteuid().is_root() {
            let _ = Command::new("chattr").arg("-i").arg(self.0).status();
        }
    }
}

#[test]
fn the_default_database_is_created_in_the_state_directory() {
    let scratch = Scratch::new();
    let state = scratch.path("state");
    let output = run(lockrun().env("XDG_STATE_HOME", &state).args([
        "--backend",
        "sqlite",
        "--name",
        "x",
        "true",
    ]));
    assert_status(&output, 0);
    assert!(state.join("lockrun/locks.sqlite3").is_file());
    let mode = fs::metadata(state.join("lockrun"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the directory is private");
}

#[test]
fn a_holder_that_cannot_renew_gets_sigterm_before_its_lease_ends() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let script = format!(
        "trap 'echo term >> {log}' TERM; touch {ready}; while :; do sleep 0.02; done",
        log = scratch.path("log").display(),
        ready = scratch.path("ready").display(),
    );
    let holder = store
        .lockrun()
        .args(["--name", "stuck", "--ttl", "1.2", "--kill-grace", "0.05"])
        .args(["-c", &script])
        .stderr(Stdio::piped())
        .start();
    wait_for_file(&scratch.path("ready"));
    let db = store.args().last().unwrap();
    let locker = rusqlite::Connection::open(db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let output = finish(holder);
    assert_status(&output, 76);
    assert!(
        stderr(&output).contains("no renewal was confirmed in time"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        scratch.lines("log"),
        ["term"],
        "SIGTERM came --kill-grace before the lease ended, SIGKILL after"
    );
}

#[test]
fn a_slot_taken_late_in_a_long_backoff_step_gets_a_whole_lease() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "late", &["--ttl", "1"]);
    // The waiter's first backoff step (2.5 s or more) is longer than its 1 s lease.
    let mut waiter = store
        .lockrun()
        .args(["--name", "late", "-v", "--ttl", "1", "--initial-delay", "5"])
        .args(["--", "sh", "-c", "sleep 0.3"])
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting");
    // The subject of the test is time: free the slot more than a TTL into the waiter's step.
    std::thread::sleep(Duration::from_millis(1500));
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(
        wait(&mut waiter).code(),
        Some(0),
        "the lease runs from when the slot was taken, not from when the step began"
    );
}

#[test]
fn a_holder_in_another_pid_namespace_is_not_judged_dead() {
    let Some(mut elsewhere) = lockrun_in_a_pid_namespace() else {
        return;
    };
    let store = Store::sqlite();
    let scratch = Scratch::new();
    // Inside its namespace the holder's lockrun is pid 1: here, pid 1 is another process.
    elsewhere.args(store.args());
    let mut holder = start_holding(elsewhere, &scratch, "namespaced", &["--ttl", "60"], "");
    let output = run(store.lockrun().args(["--name", "namespaced", "-n", "true"]));
    assert_status(&output, 75);
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

/// A waiter whose first retry is 2.5 s away or more (`--initial-delay 5`), so that
/// only a change check can start it sooner; it touches `got` once it runs.
/// Returns once it says it is waiting.
fn slow_waiter(store: &Store, scratch: &Scratch, name: &str) -> Running {
    let mut waiter = store
        .lockrun()
        .args(["--name", name, "-v", "--initial-delay", "5", "--", "touch"])
        .arg(scratch.path("got"))
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting");
    waiter
}

#[test]
fn a_waiter_rides_out_a_database_locked_for_six_seconds() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "ridden", &[]);
    // A one-second place in line: the waiter writes to keep it, so it meets the lock.
    let mut waiter = store
        .lockrun()
        .args(["--name", "ridden", "--ttl", "1", "-w", "60"])
        .args([
            "--initial-delay",
            "0.2",
            "--max-delay",
            "1",
            "--log-format",
            "json",
        ])
        .args(["--", "touch"])
        .arg(scratch.path("ran"))
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let events = || fs::read_to_string(scratch.path("events")).unwrap_or_default();
    wait_until("the waiter to join the line", || {
        events().contains("\"waiting\"")
    });
    let db = store.args()[3].clone();
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let lock_taken = Instant::now();
    while lock_taken.elapsed() < Duration::from_secs(6) {
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "the waiter gave up while the database was locked"
        );
        thread::sleep(Duration::from_millis(50));
    }
    locker.execute_batch("COMMIT").unwrap();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(wait(&mut waiter).code(), Some(0), "{}", events());
    assert!(scratch.path("ran").exists());
    assert!(
        events().contains(r#""reason":"transient-error""#),
        "{}",
        events()
    );
}

#[test]
fn a_slot_taken_after_a_long_wait_for_the_database_is_renewed_before_the_command_starts() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    // A holder whose one-second lease lapses while the database is locked.
    let mut holder = hold(&store, &scratch, "slow", &["--ttl", "1"]);
    let script = format!("sleep 0.2; touch '{}'", scratch.path("ran").display());
    let mut taker = store
        .lockrun()
        .args([
            "--name",
            "slow",
            "--ttl",
            "1",
            "-w",
            "30",
            "--log-format",
            "json",
        ])
        .args(["-c", &script])
        .stderr(fs::File::create(scratch.path("events")).unwrap())
        .start();
    let events = || fs::read_to_string(scratch.path("events")).unwrap_or_default();
    wait_until("the taker to join the line", || {
        events().contains(r#""event":"waiting""#)
    });
    // Locked for longer than the leases, shorter than a writer waits for it (2 s): the
    // taker's look, sent while it is locked, takes the lapsed slot when it is free again,
    // with its lease (counted from the look's sending) past its stop.
    let db = store.args()[3].clone();
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    thread::sleep(Duration::from_millis(1700));
    locker.execute_batch("COMMIT").unwrap();
    assert_eq!(wait(&mut taker).code(), Some(0), "{}", events());
    assert!(scratch.path("ran").exists(), "{}", events());
    let (acquired, renewed) = (
        events().find(r#""event":"acquired""#),
        events().find(r#""event":"renewed""#),
    );
    assert!(acquired < renewed, "renewed at once: {}", events());
    assert_eq!(wait(&mut holder).code(), Some(76));
}

/// Uses of a database: (subcommand, arguments).
type Use = (&'static [&'static str], &'static [&'static str]);
const RUNNING: Use = (&[], &["--name", "x", "true"]);
const STATUS: Use = (&["status"], &[]);
const RELEASE: Use = (&["release"], &["x", "--force"]);

/// Each of `uses` of the database at `path` exits 69 at once, saying `why` in one line.
fn assert_refused_at_once(path: &Path, uses: &[Use], why: &str) {
    for (subcommand, args) in uses {
        let started = Instant::now();
        let output = run(&mut on_db(subcommand, path, args));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{subcommand:?} on {} took {:?}",
            path.display(),
            started.elapsed()
        );
        assert_status(&output, 69);
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(why), "{subcommand:?}: {err}");
    }
}

#[test]
fn a_database_path_that_is_not_a_regular_file_is_refused_at_once_creating_nothing() {
    let every_use = [RUNNING, STATUS, RELEASE];
    let scratch = Scratch::new();
    let fifo = scratch.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert_refused_at_once(&fifo, &every_use, "is a FIFO, not a regular file");
    assert_refused_at_once(
        scratch.dir(),
        &every_use,
        "is a directory, not a regular file",
    );
    assert_eq!(
        fs::read_dir(scratch.dir()).unwrap().count(),
        1,
        "only the FIFO"
    );

    // SQLite would write /dev/null-journal (as root, who may): nothing is made beside it.
    let beside = ["-journal", "-wal", "-shm"].map(|suffix| format!("/dev/null{suffix}"));
    let there_before = beside.clone().map(|path| Path::new(&path).exists());
    assert_refused_at_once(
        Path::new("/dev/null"),
        &every_use,
        "is a character device, not a regular file",
    );
    for (path, before) in beside.iter().zip(there_before) {
        assert!(before || !Path::new(path).exists(), "{path} was made");
    }
}

#[test]
fn status_and_release_on_a_missing_database_say_so_and_create_nothing() {
    let scratch = Scratch::new();
    assert_refused_at_once(
        &scratch.path("typo/locks.sqlite3"),
        &[RELEASE],
        "there is no lockrun database",
    );
    let output = run(&mut on_db(
        STATUS.0,
        &scratch.path("typo/locks.sqlite3"),
        STATUS.1,
    ));
    assert_status(&output, 0);
    assert!(
        stdout(&output).starts_with("no lock is held: there is no lockrun database"),
        "{}",
        stdout(&output)
    );
    assert!(!scratch.path("typo").exists(), "no directory made for it");

    // The default database, by XDG_STATE_HOME or else HOME: nothing is made there either.
    for variable in ["XDG_STATE_HOME", "HOME"] {
        let home = scratch.path(variable);
        fs::create_dir(&home).unwrap();
        for ((subcommand, args), code) in [(STATUS, 0), (RELEASE, 69)] {
            let output = run(lockrun()
                .env_remove("XDG_STATE_HOME")
                .env(variable, &home)
                .args(subcommand)
                .args(["--backend", "sqlite"])
                .args(args));
            assert_status(&output, code);
            let said = format!("{}{}", stdout(&output), stderr(&output));
            assert!(said.contains("there is no lockrun database"), "{said}");
            assert_eq!(
                fs::read_dir(&home).unwrap().count(),
                0,
                "{variable}: nothing made"
            );
        }
    }
}
