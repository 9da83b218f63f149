//! lockrun on PostgreSQL behind pgbouncer (tests/support/pgbouncer.rs), as
//! the README's PostgreSQL section promises: behind transaction pooling
//! `LISTEN` does not work, and lockrun still works, correctly, just slower
//! (a handoff waits for the head's next backoff step, so `--max-delay` is
//! made small); session pooling keeps the wake-ups. The fleet herd through
//! pgbouncer is in the fleet suite (tests/fleet.rs).

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use crate::support::pgbouncer::{Pgbouncer, PoolMode};
use crate::support::postgres::PostgresServer;
use crate::support::*;

/// Waiters queued behind the holder.
const WAITERS: usize = 3;

/// A server and a pgbouncer in front of it; `None` when either is not installed.
fn behind_pgbouncer(mode: PoolMode) -> Option<(Arc<PostgresServer>, Pgbouncer)> {
    let server = Arc::new(PostgresServer::start()?);
    let bouncer = Pgbouncer::start(&server, mode)?;
    Some((server, bouncer))
}

/// A holder of one name through `bouncer`, then `WAITERS` waiters (each with
/// `flags`) queued one after another; the holder leaves. Every command
/// appends `enter PLACE NS FENCE` and `exit PLACE NS` to one log: they must
/// not overlap, come in the order of arrival with increasing fences, and
/// each one begin within `handoff` of the end of the one before.
fn a_line_through(bouncer: &Pgbouncer, flags: &[&str], handoff: Duration) {
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let url = bouncer.url();
    let lockrun_at = |place: usize, script: &str| {
        let mut command = lockrun();
        command
            .args(["--backend", "postgres", "--postgres-url", &url])
            .args(["--name", "pooled", "--log-format", "json"])
            .stdout(fs::File::create(scratch.path(&format!("out.{place}"))).unwrap())
            .stderr(fs::File::create(scratch.path(&format!("events.{place}"))).unwrap());
        command.args(["-c", script]);
        command
    };
    let enter = |place: usize| {
        format!(
            "echo \"enter {place} $(date +%s%N) $LOCKRUN_FENCE\" >> '{}'",
            log.display()
        )
    };
    let exit = |place: usize| format!("echo \"exit {place} $(date +%s%N)\" >> '{}'", log.display());
    let events = |place: usize| {
        fs::read_to_string(scratch.path(&format!("events.{place}"))).unwrap_or_default()
    };
    let holder_script = format!(
        "{}; touch '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done; {}",
        enter(0),
        exit(0),
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
    );
    let mut holder = lockrun_at(0, &holder_script).start();
    wait_until("the holder's command to start", || {
        assert!(
            holder.try_wait().unwrap().is_none(),
            "the holder exited: {}",
            events(0)
        );
        scratch.path("ready").exists()
    });
    let mut waiters: Vec<Running> = (1..=WAITERS)
        .map(|place| {
            let script = format!("{}; sleep 0.1; {}", enter(place), exit(place));
            let mut waiter = lockrun_at(place, &script);
            let mut waiter = waiter.args(flags).start();
            wait_until("a waiter to join the line", || {
                assert!(
                    waiter.try_wait().unwrap().is_none(),
                    "waiter {place} exited: {}",
                    events(place)
                );
                events(place).contains(r#""event":"waiting""#)
            });
            waiter
        })
        .collect();
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0), "{}", events(0));
    for (at, waiter) in waiters.iter_mut().enumerate() {
        let status = wait_within(waiter, PATIENCE + handoff * 4);
        assert_eq!(status.code(), Some(0), "{}", events(at + 1));
    }

    // (place, enter, exit, fence) in the order the log has them.
    let mut spans: Vec<(usize, i128, i128, u64)> = Vec::new();
    for line in scratch.lines("log") {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["enter", place, at, fence] => spans.push((
                place.parse().unwrap(),
                at.parse().unwrap(),
                i128::MAX,
                fence.parse().unwrap(),
            )),
            ["exit", place, at] => {
                let span = spans.last_mut().expect("an exit after its enter");
                assert_eq!(span.0, place.parse::<usize>().unwrap(), "{line}: overlap");
                span.2 = at.parse().unwrap();
            }
            _ => panic!("a line of the log: {line:?}"),
        }
    }
    let order: Vec<usize> = spans.iter().map(|span| span.0).collect();
    assert_eq!(
        order,
        (0..=WAITERS).collect::<Vec<_>>(),
        "one at a time, first come first served"
    );
    for pair in spans.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        assert!(after.3 > before.3, "fences increase: {spans:?}");
        let gap = Duration::from_nanos(u64::try_from(after.1 - before.2).expect("no overlap"));
        assert!(
            gap < handoff,
            "place {} began {gap:?} after place {} ended; at most {handoff:?}",
            after.0,
            before.0
        );
    }
}

/// A line through transaction pooling, where `LISTEN` is lost: it moves by
/// polling, with the README's advice there, a small --max-delay. A handoff
/// waits for the head's next look: at most 1.5 × 0.5 s, and a second for a busy machine.
fn a_polled_line_through(mode: PoolMode) {
    let Some((_server, bouncer)) = behind_pgbouncer(mode) else {
        return;
    };
    a_line_through(
        &bouncer,
        &["-w", "60", "--initial-delay", "0.2", "--max-delay", "0.5"],
        Duration::from_millis(1750),
    );
}

#[test]
fn transaction_pooling_serialises_and_the_line_moves_by_polling() {
    a_polled_line_through(PoolMode::Transaction);
}

/// A waiter readies its release in its session (docs/backends/postgres.md:
/// "PostgreSQL backend"); here no later transaction finds it, and every
/// release is made again as a plain one: none waits for a lease to lapse.
#[test]
fn a_pooler_that_resets_its_sessions_loses_no_release() {
    a_polled_line_through(PoolMode::TransactionReset);
}

#[test]
fn session_pooling_keeps_the_wake_ups() {
    let Some((_server, bouncer)) = behind_pgbouncer(PoolMode::Session) else {
        return;
    };
    // Polls far apart (at least 5 s, and at least every TTL/3 = 10 s): a
    // handoff within a second and a half is a wake-up (NOTIFY).
    a_line_through(
        &bouncer,
        &["-w", "60", "--initial-delay", "10", "--max-delay", "10"],
        Duration::from_millis(1500),
    );
}
