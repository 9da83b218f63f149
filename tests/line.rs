//! The waiting line every backend keeps (docs/guide.md: "The waiting line"): first
//! come, first served for any number of slots, no idle slot, dead waiters
//! skipped, and `status` listing the line in order. Run against each backend
//! through `backend_tests!` (tests/core.rs).

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::core::hold_after;
use crate::support::*;

/// Waiters come this far apart, each once the one before it is in line.
const WAITERS: usize = 8;

/// `status NAME --json` as its entries.
fn entries(store: &Store, name: &str) -> Vec<Value> {
    let output = run(store.status().args([name, "--json"]));
    assert_status(&output, 0);
    let entries: Value = serde_json::from_slice(&output.stdout).expect("status --json is JSON");
    entries.as_array().expect("an array").clone()
}

/// The pids of the waiters of `name`, in line order, as `status` lists them.
fn waiting_pids(store: &Store, name: &str) -> Vec<u64> {
    let waiters: Vec<Value> = entries(store, name)
        .into_iter()
        .filter(|entry| entry["state"] == "waiting")
        .collect();
    for (place, waiter) in waiters.iter().enumerate() {
        assert_eq!(waiter["position"], place + 1, "{waiters:?}");
        assert_eq!(waiter["slot"], Value::Null, "{waiters:?}");
        assert!(waiter["waiting_since"].is_string(), "{waiters:?}");
    }
    waiters
        .iter()
        .map(|waiter| waiter["pid"].as_u64().expect("a pid"))
        .collect()
}

/// `slots` holders of `name`, each until its own `release` file appears.
fn holders(store: &Store, name: &str, slots: u32) -> Vec<(Scratch, Running)> {
    let parallelism = slots.to_string();
    (0..slots)
        .map(|_| {
            let scratch = Scratch::new();
            let holder = hold_after(store, &scratch, name, &["-p", &parallelism], "");
            (scratch, holder)
        })
        .collect()
}

fn let_go(holders: Vec<(Scratch, Running)>) {
    for (scratch, mut holder) in holders {
        fs::write(scratch.path("release"), "").unwrap();
        assert_eq!(wait(&mut holder).code(), Some(0));
    }
}

/// Starts a waiter on `name` that logs `ID FENCE` to `log` when it runs, once
/// `status` shows it at the end of the line.
fn join_line(store: &Store, name: &str, slots: u32, id: usize, log: &std::path::Path) -> Running {
    join_line_with(store, name, slots, id, log, &[])
}

/// Like `join_line`, with more options.
fn join_line_with(
    store: &Store,
    name: &str,
    slots: u32,
    id: usize,
    log: &std::path::Path,
    extra: &[&str],
) -> Running {
    let script = format!("echo {id} $LOCKRUN_FENCE >> '{}'", log.display());
    join_line_running(store, name, slots, &script, extra, Stdio::null())
}

/// Starts a waiter on `name` that runs the shell code `script`, its stderr
/// to `stderr`, once `status` shows it at the end of the line.
fn join_line_running(
    store: &Store,
    name: &str,
    slots: u32,
    script: &str,
    extra: &[&str],
    stderr: Stdio,
) -> Running {
    let before = waiting_pids(store, name).len();
    let waiter = store
        .lockrun()
        .args(["--name", name, "-p", &slots.to_string(), "-w", "60"])
        .args(extra)
        // Slow polls: only the line's own wake-ups hand the slots on in time.
        .args(["--initial-delay", "30", "-c", script])
        .stdout(Stdio::null())
        .stderr(stderr)
        .start();
    wait_until(&format!("waiter {} to join the line", waiter.id()), || {
        let pids = waiting_pids(store, name);
        pids.len() == before + 1 && pids.last() == Some(&u64::from(waiter.id()))
    });
    waiter
}

/// The place in line that the last `waiting` or `retry` event in the JSON
/// events at `path` gives.
fn last_position(path: &std::path::Path) -> Option<u64> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| event["position"].as_u64())
        .next_back()
}

/// `waiter` runs its command and exits 0 within seconds of `since`: woken, not
/// at its next poll, 30 s away (`join_line`).
fn runs_soon(waiter: &mut Running, since: Instant, what: &str) {
    assert_eq!(wait(waiter).code(), Some(0), "{what}");
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{what} only after {:?}, not at once",
        since.elapsed()
    );
}

fn first_come_first_served(store: &Store, slots: u32) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let name = format!("fifo{slots}");
    let holders = holders(store, &name, slots);
    let mut waiters: Vec<Running> = (1..=WAITERS)
        .map(|id| join_line(store, &name, slots, id, &log))
        .collect();
    let_go(holders);
    for waiter in &mut waiters {
        assert_eq!(wait(waiter).code(), Some(0));
    }
    // Fences follow the order in which slots were taken.
    let mut runs: Vec<(u64, usize)> = scratch
        .lines("order")
        .iter()
        .map(|line| {
            let (id, fence) = line.split_once(' ').expect("ID FENCE");
            (fence.parse().expect("a fence"), id.parse().expect("an id"))
        })
        .collect();
    runs.sort_unstable();
    let order: Vec<usize> = runs.into_iter().map(|(_, id)| id).collect();
    assert_eq!(
        order,
        (1..=WAITERS).collect::<Vec<_>>(),
        "served in arrival order"
    );
}

pub fn first_come_first_served_with_one_slot(store: &Store) {
    first_come_first_served(store, 1);
}

pub fn first_come_first_served_with_two_slots(store: &Store) {
    first_come_first_served(store, 2);
}

pub fn a_freed_slot_goes_to_the_head_of_the_line_at_once(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let mut holders = holders(store, "idle", 2);
    let mut waiter = join_line(store, "idle", 2, 1, &log);
    let (released, mut holder) = holders.remove(0);
    fs::write(released.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    runs_soon(
        &mut waiter,
        Instant::now(),
        "the waiter took the freed slot",
    );
    let_go(holders);
}

pub fn a_dead_waiter_at_the_head_is_skipped_at_once(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let holders = holders(store, "skip", 1);
    let mut dead = join_line(store, "skip", 1, 1, &log);
    let mut next = join_line(store, "skip", 1, 2, &log);
    dead.kill().unwrap();
    dead.wait().unwrap();
    let_go(holders);
    runs_soon(
        &mut next,
        Instant::now(),
        "the dead waiter let the next one by",
    );
    assert_eq!(scratch.lines("order").len(), 1, "only the live waiter ran");
    assert_eq!(waiting_pids(store, "skip"), Vec::<u64>::new());
}

/// A waiter stopped and continued while it waits (Ctrl-Z and `fg`) takes the
/// slot freed meanwhile at once, not at its next poll: Linux cuts short a
/// socket read with a timeout then, and that is no trouble with the store.
pub fn a_waiter_stopped_and_continued_takes_the_freed_slot_at_once(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let holders = holders(store, "resumed", 1);
    let mut waiter = join_line(store, "resumed", 1, 1, &log);
    signal(waiter.id(), Signal::SIGSTOP);
    let pid = waiter.id().cast_signed();
    wait_until("the waiter to stop", || process_state(pid) == Some('T'));
    let_go(holders);
    signal(waiter.id(), Signal::SIGCONT);
    runs_soon(
        &mut waiter,
        Instant::now(),
        "the continued waiter took the slot",
    );
}

/// A waiter behind a holder on this host checks the holder's process every
/// 100 ms. Its place in line, which lapses after `--ttl` on a backend with
/// leases unless the waiter looks again, is still kept alive meanwhile: a
/// lapsed place would let a later arrival from another host overtake it.
pub fn a_waiter_behind_a_holder_on_this_host_keeps_its_place_past_its_ttl(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let holders = holders(store, "kept", 1);
    let mut waiter = join_line_with(store, "kept", 1, 1, &log, &["--ttl", "1"]);
    // Three times the TTL (the tests' etcd, electing within 250 ms, grants 1 s as asked).
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            waiting_pids(store, "kept"),
            vec![u64::from(waiter.id())],
            "the waiter's place lapsed after {:?}",
            watched.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let_go(holders);
    runs_soon(&mut waiter, Instant::now(), "the waiter took the slot");
}

/// A writer's release lets every reader waiting behind it in at once: each
/// reader's command runs until all of them have started, so they can only end
/// together, and with 30 s between their polls only wake-ups start them.
pub fn a_writers_release_starts_every_waiting_reader_at_once(store: &Store) {
    const READERS: usize = 8;
    let scratch = Scratch::new();
    let writer = holders(store, "group", 1);
    let script = format!(
        "touch '{dir}/in.'$$; until [ $(ls '{dir}' | grep -c in.) -ge {READERS} ]; do sleep 0.01; done",
        dir = scratch.dir().display()
    );
    let mut readers: Vec<Running> = (0..READERS)
        .map(|_| join_line_running(store, "group", 1, &script, &["-s"], Stdio::null()))
        .collect();
    let released = Instant::now();
    let_go(writer);
    for reader in &mut readers {
        runs_soon(reader, released, "a reader ran with the others");
    }
}

/// Readers at the head of the line that died while they waited hold nobody
/// up: not the reader behind them, which goes with them, nor the writer
/// behind it, which watches each of them (not only the one just ahead).
pub fn dead_readers_at_the_head_hold_nobody_up(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let writer = holders(store, "dropped", 1);
    let dead: Vec<Running> = (1..=2)
        .map(|id| join_line_with(store, "dropped", 1, id, &log, &["-s"]))
        .collect();
    let mut reader = join_line_with(store, "dropped", 1, 3, &log, &["-s"]);
    let mut next_writer = join_line(store, "dropped", 1, 4, &log);
    for mut waiter in dead {
        waiter.kill().unwrap();
        waiter.wait().unwrap();
    }
    let released = Instant::now();
    let_go(writer);
    runs_soon(&mut reader, released, "the live reader ran");
    runs_soon(
        &mut next_writer,
        released,
        "the writer behind the readers ran",
    );
    let ran: Vec<String> = scratch
        .lines("order")
        .iter()
        .map(|line| line.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(ran, ["3", "4"], "only the live waiters ran, in order");
}

/// Waiters of this host killed together at the head of the line hold nobody
/// up: the live waiter behind them sees them gone and stands first, by its
/// own account as in `status`, within seconds (not when their places lapse
/// after the TTL), and takes the slot at once when it is freed (docs/guide.md: "The waiting line").
pub fn dead_waiters_at_the_head_hold_nobody_up(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("order");
    let holder = holders(store, "ghosts", 1);
    let dead: Vec<Running> = (1..=3)
        .map(|id| join_line(store, "ghosts", 1, id, &log))
        .collect();
    let events = scratch.path("events");
    let script = format!("echo 4 $LOCKRUN_FENCE >> '{}'", log.display());
    let mut live = join_line_running(
        store,
        "ghosts",
        1,
        &script,
        &["--log-format", "json"],
        fs::File::create(&events).unwrap().into(),
    );
    wait_until("the live waiter to say it stands fourth", || {
        last_position(&events) == Some(4)
    });
    for mut waiter in dead {
        waiter.kill().unwrap();
        waiter.wait().unwrap();
    }
    wait_until_within(
        "the live waiter to say it stands first",
        Duration::from_secs(5),
        || last_position(&events) == Some(1),
    );
    assert_eq!(waiting_pids(store, "ghosts"), [u64::from(live.id())]);
    let released = Instant::now();
    let_go(holder);
    runs_soon(&mut live, released, "the live waiter ran");
    let ran: Vec<String> = scratch
        .lines("order")
        .iter()
        .map(|line| line.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(ran, ["4"], "only the live waiter ran");
}
