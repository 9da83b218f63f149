//! Crash and contention: many lockrun processes on one name while random ones
//! are killed with SIGKILL, holders and waiters alike (CONTRIBUTING.md: "The ignored suites"). Ignored by
//! default; `.ci/run` runs it with `cargo test --test integration -- --ignored stress`.
//! `LOCKRUN_STRESS_SCALE` (default 1) multiplies the runs per process.
//!
//! Every command appends `enter ID SLOT NS` and `exit ID SLOT NS` (wall clock,
//! `date +%s%N`) to one log; a killed holder's span ends when the kill was sent.
//! From those spans: never more than N holders, never two in one slot; a slot
//! whose holder was killed is taken again within its TTL (file: at once); every
//! run exits 0 or, when it was killed, by SIGKILL.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use rand::RngExt;

use crate::support::*;

/// Instantiates the stress tests for one backend: `stress_tests!(file, Store::file());`.
/// Like `backend_tests!`, the store may be an `Option<Store>` (`None`: its server is missing).
macro_rules! stress_tests {
    ($module:ident, $store:expr) => {
        mod $module {
            use $crate::support::{MaybeStore, Store};

            #[test]
            #[ignore = "stress suite: cargo test --test integration -- --ignored stress"]
            fn one_slot() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::stress::contend(&store, 1);
                }
            }
            #[test]
            #[ignore = "stress suite: cargo test --test integration -- --ignored stress"]
            fn three_slots() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::stress::contend(&store, 3);
                }
            }
        }
    };
}

stress_tests!(file, Store::file());
stress_tests!(sqlite, Store::sqlite());
stress_tests!(redis, Store::redis());
#[cfg(feature = "etcd")]
stress_tests!(etcd, Store::etcd());
#[cfg(feature = "s3")]
stress_tests!(s3, Store::s3());

const WORKERS: usize = 8;
const RUNS_PER_WORKER: usize = 10;
/// Lease length on lease backends: a killed holder's slot is free again by then.
const TTL: Duration = Duration::from_secs(1);
/// Polling, scheduling on a loaded machine and the command's own start-up.
const SLACK: Duration = Duration::from_secs(2);
/// Longest one run may take, waiting included: far more than a queue of
/// `WORKERS` holders (each killed at worst) needs, far less than a lost wake-up.
const RUN_LIMIT: Duration = Duration::from_secs(30);

const SCRIPT: &str = r#"d=$1 id=$2
echo "enter $id $LOCKRUN_SLOT $(date +%s%N)" >> "$d/log"
: > "$d/entered-$id"
sleep 0.02
echo "exit $id $LOCKRUN_SLOT $(date +%s%N)" >> "$d/log""#;

/// What became of one run, as its worker saw it.
struct Run {
    id: usize,
    /// When SIGKILL was sent to its lockrun (wall-clock nanoseconds).
    killed_at: Option<i128>,
    status: ExitStatus,
}

/// How a worker treats one run.
enum Fate {
    Finish,
    /// Killed a few milliseconds after its command began.
    KillHolder,
    /// Killed at a random moment, waiting or holding.
    KillAnytime,
}

fn scale() -> usize {
    std::env::var("LOCKRUN_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn now_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos()
        .cast_signed()
}

pub fn contend(store: &Store, slots: u32) {
    let scratch = Scratch::new();
    let after_death = match store.kind {
        "file" => Duration::ZERO,
        // An entry on S3 is recorded with a TTL of at least 2 s, whatever
        // `--ttl` asks (docs/backends/s3.md: "S3 backend").
        "s3" => TTL.max(Duration::from_secs(2)),
        _ => TTL,
    };
    let flags: Vec<OsString> = store.args().to_vec();
    let runs_per_worker = RUNS_PER_WORKER * scale();
    let (runs, finished): (Vec<Vec<Run>>, Vec<i128>) = thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (flags, scratch) = (&flags, &scratch);
                scope.spawn(move || {
                    let runs = (0..runs_per_worker)
                        .map(|i| one_run(flags, scratch, slots, worker * 100_000 + i))
                        .collect();
                    (runs, now_nanos())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker"))
            .unzip()
    });
    let runs: Vec<Run> = runs.into_iter().flatten().collect();

    let spans = spans(&scratch.lines("log"), &runs);
    let mut problems = statuses(&runs, &spans);
    problems.extend(overlaps(&spans, slots));
    // A slot can only be seen taken again while more processes than slots still want one.
    let mut finished = finished;
    finished.sort_unstable_by(|a, b| b.cmp(a));
    let demand_until = finished.get(slots as usize).copied().unwrap_or(0);
    let (retaken, stale) = stale_slots(&spans, after_death, demand_until);
    problems.extend(stale);
    assert!(
        problems.is_empty(),
        "{} problems in {} runs:\n{}",
        problems.len(),
        runs.len(),
        problems[..problems.len().min(20)].join("\n")
    );
    assert!(
        retaken > 0,
        "no killed holder's slot was taken again: the test proved nothing"
    );

    // Once everyone is gone, every slot is free within the TTL (file: at once).
    let deadline = Instant::now() + after_death + SLACK;
    loop {
        let output = run(store.status().args(["stress", "--json"]));
        let holders = stdout(&output);
        if holders.trim() == "[]" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slots still taken after every holder ended: {holders}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

fn one_run(flags: &[OsString], scratch: &Scratch, slots: u32, id: usize) -> Run {
    let mut rng = rand::rng();
    let fate = match rng.random_range(0..10) {
        0 | 1 => Fate::KillHolder,
        2 => Fate::KillAnytime,
        _ => Fate::Finish,
    };
    let mut child = lockrun()
        .args(flags)
        .args(["--name", "stress", "-p", &slots.to_string(), "-w", "60"])
        .args(["--initial-delay", "0.01", "--max-delay", "0.05"])
        .args(["--ttl", &TTL.as_secs_f64().to_string()])
        .args(["--", "sh", "-c", SCRIPT, "sh"])
        .arg(scratch.dir())
        .arg(id.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lockrun");
    let kill = |child: &std::process::Child| {
        let at = now_nanos();
        signal(child.id(), Signal::SIGKILL);
        at
    };
    let killed_at = match fate {
        Fate::Finish => None,
        Fate::KillAnytime => {
            thread::sleep(Duration::from_millis(rng.random_range(0..30)));
            Some(kill(&child))
        }
        Fate::KillHolder => {
            let entered = scratch.path(&format!("entered-{id}"));
            let started = Instant::now();
            loop {
                if entered.exists() {
                    thread::sleep(Duration::from_millis(rng.random_range(0..15)));
                    break Some(kill(&child));
                }
                if child.try_wait().expect("try_wait").is_some() {
                    break None;
                }
                assert!(
                    started.elapsed() < RUN_LIMIT,
                    "run {id} never got a slot within {RUN_LIMIT:?}"
                );
                thread::sleep(Duration::from_millis(2));
            }
        }
    };
    let status = wait_within(&mut child, RUN_LIMIT);
    Run {
        id,
        killed_at,
        status,
    }
}

/// One command's time in its slot.
struct Span {
    id: usize,
    slot: u32,
    start: i128,
    end: i128,
    /// Its holder was killed while the command ran.
    holder_killed: bool,
}

/// The spans from the log: a run that was killed ends at the kill at the latest.
fn spans(log: &[String], runs: &[Run]) -> Vec<Span> {
    let killed: HashMap<usize, i128> = runs
        .iter()
        .filter_map(|r| Some((r.id, r.killed_at?)))
        .collect();
    let mut enters = HashMap::new();
    let mut exits = HashMap::new();
    for line in log {
        let fields: Vec<&str> = line.split(' ').collect();
        let [event, id, slot, at] = fields[..] else {
            panic!("malformed log line: {line}");
        };
        let parsed = (
            id.parse::<usize>().expect("a run id"),
            slot.parse::<u32>().expect("a slot"),
            at.parse::<i128>().expect("a time"),
        );
        match event {
            "enter" => enters.insert(parsed.0, (parsed.1, parsed.2)),
            _ => exits.insert(parsed.0, (parsed.1, parsed.2)),
        };
    }
    enters
        .into_iter()
        .map(|(id, (slot, start))| {
            let exit = exits.get(&id).map(|&(_, at)| at);
            let kill = killed.get(&id).copied();
            let end = match (exit, kill) {
                (Some(exit), Some(kill)) => exit.min(kill),
                (Some(at), None) | (None, Some(at)) => at,
                // Never ended: `statuses` reports it; treat it as holding to the end.
                (None, None) => i128::MAX,
            };
            Span {
                id,
                slot,
                start,
                end,
                holder_killed: kill.is_some_and(|k| exit.is_none_or(|e| e > k)),
            }
        })
        .collect()
}

/// Every run ends with 0, or by SIGKILL when it was killed; a finished command left its exit mark.
fn statuses(runs: &[Run], spans: &[Span]) -> Vec<String> {
    let span_of: HashMap<usize, &Span> = spans.iter().map(|s| (s.id, s)).collect();
    let mut problems = Vec::new();
    for run in runs {
        let sigkilled = run.status.signal() == Some(Signal::SIGKILL as i32);
        let accounted = run.status.success() || (run.killed_at.is_some() && sigkilled);
        if !accounted {
            problems.push(format!(
                "run {} (killed: {}) ended with {}",
                run.id,
                run.killed_at.is_some(),
                run.status
            ));
        }
        if run.killed_at.is_none() && span_of.get(&run.id).is_none_or(|s| s.end == i128::MAX) {
            problems.push(format!(
                "run {} exited {} but its command did not run to its end",
                run.id, run.status
            ));
        }
    }
    problems
}

/// Never more than `slots` commands at once, never two in one slot.
fn overlaps(spans: &[Span], slots: u32) -> Vec<String> {
    let mut problems = Vec::new();
    let mut events: Vec<(i128, i32, usize)> = spans
        .iter()
        .filter(|s| s.start < s.end)
        .flat_map(|s| [(s.start, 1, s.id), (s.end, -1, s.id)])
        .collect();
    // At equal times the end comes first: one holder handing over is no overlap.
    events.sort_unstable();
    let mut holding = 0;
    for (at, change, id) in events {
        holding += change;
        if holding > slots.cast_signed() {
            problems.push(format!(
                "{holding} commands at once (> {slots}) when run {id} began at {at}"
            ));
        }
    }
    let mut by_slot: HashMap<u32, Vec<&Span>> = HashMap::new();
    for span in spans.iter().filter(|s| s.start < s.end) {
        by_slot.entry(span.slot).or_default().push(span);
    }
    for (slot, mut in_slot) in by_slot {
        if slot >= slots {
            problems.push(format!("slot {slot} is out of range for {slots} slots"));
        }
        in_slot.sort_unstable_by_key(|s| s.start);
        for pair in in_slot.windows(2) {
            if pair[1].start < pair[0].end {
                problems.push(format!(
                    "runs {} and {} both held slot {slot}",
                    pair[0].id, pair[1].id
                ));
            }
        }
    }
    problems
}

/// A slot whose holder was killed is taken again within `after_death` plus
/// slack; only while more processes than slots still wanted one (until
/// `demand_until`) is a slot that nobody took again a problem. Returns how many
/// killed holders' slots were seen taken again, and the problems.
fn stale_slots(spans: &[Span], after_death: Duration, demand_until: i128) -> (usize, Vec<String>) {
    let limit = (after_death + SLACK).as_nanos().cast_signed();
    let mut retaken = 0;
    let mut problems = Vec::new();
    for dead in spans.iter().filter(|s| s.holder_killed) {
        let next = spans
            .iter()
            .filter(|s| s.slot == dead.slot && s.start > dead.end)
            .map(|s| s.start)
            .min();
        match next {
            Some(next) if next - dead.end <= limit => retaken += 1,
            None if dead.end + limit > demand_until => {}
            _ => problems.push(format!(
                "slot {} stayed taken more than {:?} after its holder (run {}) was killed",
                dead.slot,
                after_death + SLACK,
                dead.id
            )),
        }
    }
    (retaken, problems)
}
