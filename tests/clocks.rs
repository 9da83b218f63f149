//! No step of a wall clock lets a run into a held slot or a slot kept by
//! `--min-hold` (docs/guide.md: "Clocks"): a second lockrun whose wall clock alone is
//! an hour ahead or behind, as after an NTP step or a VM resume, finds the slot
//! taken on every backend. Its monotonic and boot clocks are left alone
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as a step leaves them.

use std::process::Command;

use crate::core::hold;
use crate::support::*;

/// The steps tried: forward and back.
const STEPS: [&str; 2] = ["+1h", "-1h"];

/// `lockrun BACKEND-FLAGS ARGS` whose wall clock is `step` away from the
/// machine's; `None` (after a notice) where faketime is missing.
fn stepped(store: &Store, step: &str, args: &[&str]) -> Option<Command> {
    if !program_installed("faketime", "clock") {
        return None;
    }
    let mut command = without_lockrun_variables(Command::new("faketime"));
    command
        .args(["-f", step])
        .args(store.argv(args))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    Some(command)
}

/// Runs `lockrun -n true` on `name` at every step: each must find it taken (75).
fn no_step_gets_in(store: &Store, name: &str) {
    for step in STEPS {
        let Some(mut second) = stepped(store, step, &["--name", name, "-n", "true"]) else {
            return;
        };
        let output = run(&mut second);
        // S3 signs every request with the client's time, and refuses a request
        // dated far from its own (docs/backends/s3.md: "S3 backend"): that
        // run is kept out too, before it could look.
        let refused_as_skewed = store.kind == "s3"
            && output.status.code() == Some(69)
            && stderr(&output).contains("403");
        assert!(
            output.status.code() == Some(75) || refused_as_skewed,
            "a run with its wall clock at {step} got in: {:?} {}",
            output.status.code(),
            stderr(&output)
        );
    }
}

pub fn a_wall_clock_step_lets_no_run_into_a_held_slot(store: &Store) {
    let scratch = Scratch::new();
    let mut holder = hold(store, &scratch, "stepped", &[]);
    no_step_gets_in(store, "stepped");
    std::fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(
        wait(&mut holder).code(),
        Some(0),
        "the holder kept its lease"
    );
}

pub fn a_wall_clock_step_lets_no_run_into_a_kept_slot(store: &Store) {
    let output = run(store
        .lockrun()
        .args(["--name", "kept", "--min-hold", "20", "true"]));
    assert_status(&output, 0);
    no_step_gets_in(store, "kept");
}

/// On SQLite a lease written on another boot (another host, or before a
/// reboot) is judged by its heartbeat alone: a lockrun that meets it counts it
/// held until it has seen it unchanged for its whole span, whatever the wall
/// clocks say (docs/backends/sqlite.md: "SQLite backend").
#[test]
fn an_sqlite_lease_from_another_boot_is_held_until_seen_unchanged_for_its_span() {
    let store = Store::sqlite();
    assert_status(&run(store.lockrun().args(["--name", "afar", "true"])), 0);
    let at = store.args().iter().position(|arg| arg == "--db").unwrap();
    let db = rusqlite::Connection::open(&store.args()[at + 1]).unwrap();
    // Its wall-clock expiry is long past: only its heartbeat can keep it.
    db.execute(
        "INSERT INTO holders (name, slot, token, fence, pid, start_time, boot_id, host, command,
                              acquired_at, expires_at, parallelism, mode, clock, ends, span, beat)
         VALUES ('afar', 0, 't', 7, 1, 1, 'another-boot/pid:[1]', 'elsewhere', 'far', 0, 0, 1,
                 'exclusive', 'another-boot', 0, 1500, 0)",
        [],
    )
    .unwrap();
    drop(db);
    let output = run(store.lockrun().args(["--name", "afar", "-n", "true"]));
    assert_status(&output, 75);
    no_step_gets_in(&store, "afar");
    let started = std::time::Instant::now();
    let output = run(store.lockrun().args(["--name", "afar", "-w", "10", "true"]));
    assert_status(&output, 0);
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "taken before it was seen unchanged for its span"
    );
}
