//! Lock servers failing under load (issue 21, SPEC §5 "Transient trouble is
//! ridden out"), on real servers of the test's own: a 3-member etcd cluster
//! whose leader is killed and restarted or whose members are paused, a
//! PostgreSQL restarted fast or immediately or whose sessions are
//! terminated, a Redis restarted. Eight contenders take one `-p 1` name in
//! bounded loops (`--ttl 2s`, the default `--timeout`, a 0.2 s command) while
//! a fault is injected every few seconds. Then: no two commands overlapped,
//! fences increased in the order the commands began, every run exited 0 (no
//! 69: a restart of a few seconds fails no run), and after every fault a
//! command began and ended again. Each test prints one `faults:` line.
//!
//! And a lockrun that is itself paused (SIGSTOP) past its lease's deadline
//! (SPEC §2, 76): a command that ended before the deadline keeps its own
//! status; one still running when lockrun wakes is stopped, 76.
//!
//! Ignored by default, like the partition suite: `.ci/run` runs them with
//! `cargo test --test integration -- --ignored faults --test-threads 1` (one
//! at a time: their timing is what they test, on a machine of two cores).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::support::*;

/// Lockruns taking the name at once.
const CONTENDERS: usize = 8;
/// Each contender's runs at most, so its loop is bounded whatever the schedule.
const RUNS_PER_CONTENDER: usize = 400;
/// Faults injected per test.
const FAULTS: usize = 5;
/// Normal running between one fault's end and the next fault.
const BETWEEN_FAULTS: Duration = Duration::from_secs(2);
/// Longest one run may take, waiting included: longer than any ride-out of
/// a few seconds' fault behind seven others, far shorter than the default
/// `--timeout` (600 s); a run still going then has hung.
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// Longest wait for a command to begin and end after a fault.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// The contenders' command: `enter ID NS FENCE`, 0.2 s, `exit ID NS` (wall
/// clock, `date +%s%N`), appended to one log; `exit ID NS stopped` when
/// lockrun stops it with SIGTERM.
const SCRIPT: &str = r#"d=$1 id=$2
trap 'echo "exit $id $(date +%s%N) stopped" >> "$d/log"; exit 143' TERM
echo "enter $id $(date +%s%N) $LOCKRUN_FENCE" >> "$d/log"
sleep 0.2
echo "exit $id $(date +%s%N)" >> "$d/log""#;

fn now_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos()
        .cast_signed()
}

fn seconds(nanos: i128) -> f64 {
    nanos as f64 / 1e9
}

/// How one run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Code(i32),
    Signal(i32),
    /// Still running after `RUN_LIMIT`: killed by the test.
    Hung,
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(code) => write!(f, "exit {code}"),
            Self::Signal(signal) => write!(f, "signal {signal}"),
            Self::Hung => write!(f, "hung"),
        }
    }
}

struct Run {
    id: usize,
    ended_at: i128,
    ending: Ending,
}

/// A fault that `inject` brings about and heals (returning once it has), described by `what`.
pub struct Fault<'a> {
    pub what: &'a str,
    pub inject: Box<dyn FnMut() + 'a>,
}

/// A command's time holding the name, from its log lines (the end, when it
/// wrote none, is when its lockrun was seen to exit: the latest it can be).
#[derive(Clone, Copy, Debug)]
struct Span {
    id: usize,
    enter: i128,
    exit: Option<i128>,
    end: i128,
    fence: u64,
}

/// One injected fault: when it began and ended (wall-clock nanoseconds), and
/// how long after its end a command had begun and ended since it began.
struct FaultRound {
    injected: i128,
    healed: i128,
    recovered: Option<Duration>,
}

/// Sets its flag when dropped: the contenders stop however the schedule ends.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `CONTENDERS` lockruns (`contender(i)`: lockrun with the store's flags, for
/// contender `i`) in loops on one name while `fault` is injected `FAULTS`
/// times, `BETWEEN_FAULTS` apart; then the assertions of the module's doc.
pub fn under_faults(
    backend: &str,
    contender: &(dyn Fn(usize) -> Command + Sync),
    mut fault: Fault,
) {
    let scratch = Scratch::new();
    let began = Instant::now();
    let (runs, faults) = contend(contender, &mut fault, &scratch);
    let took = began.elapsed();

    let spans = spans(&scratch.lines("log"), &runs);
    let mut endings: BTreeMap<Ending, usize> = BTreeMap::new();
    for run in &runs {
        *endings.entry(run.ending).or_default() += 1;
    }
    let overlaps = overlaps(&spans);
    let fences_back = fences_back(&spans);
    let gap = spans
        .windows(2)
        .map(|pair| pair[1].enter - pair[0].end)
        .max()
        .unwrap_or(0);
    let slowest_recovery = faults
        .iter()
        .filter_map(|fault| fault.recovered)
        .max()
        .unwrap_or_default();
    let endings_text = endings
        .iter()
        .map(|(ending, count)| format!("{count} {ending}"))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "faults: {backend}, {} ({:.0} s): {CONTENDERS} contenders, {} runs ({endings_text}), \
         {} faults, {} overlaps, {} fences back, max handoff gap {:.2} s, a run done {:.2} s \
         after a fault at worst",
        fault.what,
        took.as_secs_f64(),
        runs.len(),
        faults.len(),
        overlaps.len(),
        fences_back.len(),
        seconds(gap),
        slowest_recovery.as_secs_f64(),
    );

    let stuck: Vec<String> = faults
        .iter()
        .filter(|fault| fault.recovered.is_none())
        .map(|fault| {
            format!(
                "no run began and ended within {RECOVERY_LIMIT:?} of a fault \
                 (injected for {:.2} s)",
                seconds(fault.healed - fault.injected)
            )
        })
        .collect();
    let describe = |id: usize| describe(id, &spans, &runs, &scratch);
    assert!(
        overlaps.is_empty(),
        "commands overlapped:\n{}",
        overlaps
            .iter()
            .map(|&(a, b)| format!("{}\n  and {}", describe(a), describe(b)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        fences_back.is_empty(),
        "fences went back in the order the commands began: {fences_back:?}"
    );
    assert!(stuck.is_empty(), "acquisitions stopped: {stuck:?}");
    // A holder that cannot renew in time stops its command (76): fail-stop, as
    // the README promises, not unavailability. A loaded machine (CI's two cores)
    // can starve a 2 s lease now and then; a few such runs are allowed, and no
    // other status at all.
    let lease_lost = runs
        .iter()
        .filter(|run| run.ending == Ending::Code(76))
        .count();
    let unexpected = what_lockrun_said(&runs, &scratch);
    assert!(
        unexpected.iter().all(|line| line.contains("× exit 76:")) && lease_lost * 20 <= runs.len(),
        "every run must exit 0, or a few 76 ({endings_text}):\n{}",
        unexpected.join("\n")
    );
    assert_eq!(faults.len(), FAULTS, "every fault was injected");
}

/// Run `id`'s span (seconds since the first command began), fence, status and last words.
fn describe(id: usize, spans: &[Span], runs: &[Run], scratch: &Scratch) -> String {
    let origin = spans.first().map_or(0, |span| span.enter);
    let at = |nanos: i128| format!("{:.3}", seconds(nanos - origin));
    let span = spans.iter().find(|span| span.id == id);
    let run = runs.iter().find(|run| run.id == id);
    let said = fs::read_to_string(scratch.path(&format!("stderr.{id}"))).unwrap_or_default();
    format!(
        "run {id}: began {}, {} {}, fence {}, {}{}",
        span.map_or("?".to_owned(), |span| at(span.enter)),
        if span.is_some_and(|span| span.exit.is_some()) {
            "ended"
        } else {
            "gone by (lockrun exited)"
        },
        span.map_or("?".to_owned(), |span| at(span.end)),
        span.map_or(0, |span| span.fence),
        run.map_or("?".to_owned(), |run| run.ending.to_string()),
        if said.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", said.trim())
        },
    )
}

/// The contenders' loops, and the faults injected meanwhile: each once a
/// command has begun and ended since the fault before (or the start), and
/// `BETWEEN_FAULTS` later; the schedule ends at the first fault after which
/// no command does within `RECOVERY_LIMIT`.
fn contend(
    contender: &(dyn Fn(usize) -> Command + Sync),
    fault: &mut Fault,
    scratch: &Scratch,
) -> (Vec<Run>, Vec<FaultRound>) {
    let stop = AtomicBool::new(false);
    let mut faults = Vec::new();
    let runs = thread::scope(|scope| {
        let workers: Vec<_> = (0..CONTENDERS)
            .map(|worker| {
                let stop = &stop;
                scope.spawn(move || {
                    let mut runs = Vec::new();
                    for i in 0..RUNS_PER_CONTENDER {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        runs.push(one_run(contender(worker), scratch, worker * 10_000 + i));
                    }
                    runs
                })
            })
            .collect();
        let stopping = StopOnDrop(&stop);
        let completed_since = |since: i128| {
            spans(&scratch.lines("log"), &[])
                .iter()
                .any(|span| span.enter > since && span.exit.is_some())
        };
        await_within("a first run before any fault", RECOVERY_LIMIT, || {
            completed_since(0)
        });
        for _ in 0..FAULTS {
            let injected = now_nanos();
            (fault.inject)();
            let healed = now_nanos();
            let waited = Instant::now();
            let recovered = wait_within_limit(RECOVERY_LIMIT, || completed_since(injected));
            faults.push(FaultRound {
                injected,
                healed,
                recovered: recovered.then(|| waited.elapsed()),
            });
            if !recovered {
                break;
            }
            thread::sleep(BETWEEN_FAULTS);
        }
        drop(stopping);
        workers
            .into_iter()
            .flat_map(|worker| worker.join().expect("a contender"))
            .collect()
    });
    (runs, faults)
}

/// What lockrun said when a run did not exit 0: each different last line of
/// stderr once (numbers of three digits or more masked: ports, times), with
/// how often and the status.
fn what_lockrun_said(runs: &[Run], scratch: &Scratch) -> Vec<String> {
    let mut said: BTreeMap<String, (usize, Ending)> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.ending != Ending::Code(0)) {
        let stderr =
            fs::read_to_string(scratch.path(&format!("stderr.{}", run.id))).unwrap_or_default();
        let line = mask_numbers(stderr.lines().last().unwrap_or("(nothing on stderr)"));
        said.entry(line).or_insert((0, run.ending)).0 += 1;
    }
    said.iter()
        .map(|(line, (count, ending))| format!("{count} × {ending}: {line}"))
        .collect()
}

/// One lockrun on the name, waited for up to `RUN_LIMIT`.
fn one_run(mut command: Command, scratch: &Scratch, id: usize) -> Run {
    let mut child = command
        .args([
            "--ttl", "2s", "--name", "faults", "--", "sh", "-c", SCRIPT, "sh",
        ])
        .arg(scratch.dir())
        .arg(id.to_string())
        .stdout(Stdio::null())
        .stderr(fs::File::create(scratch.path(&format!("stderr.{id}"))).unwrap())
        .start();
    let started = Instant::now();
    let ending = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break match (status.code(), status.signal()) {
                (Some(code), _) => Ending::Code(code),
                (None, Some(signal)) => Ending::Signal(signal),
                (None, None) => unreachable!("an exit status is a code or a signal"),
            };
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break Ending::Hung;
        }
        thread::sleep(Duration::from_millis(10));
    };
    Run {
        id,
        ended_at: now_nanos(),
        ending,
    }
}

/// `line` with every run of three digits or more as `N`.
fn mask_numbers(line: &str) -> String {
    let mut masked = String::new();
    let mut digits = String::new();
    for c in line.chars().chain(std::iter::once('\n')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if digits.len() >= 3 {
            masked.push('N');
        } else {
            masked.push_str(&digits);
        }
        digits.clear();
        masked.push(c);
    }
    masked.pop();
    masked
}

/// Polls `condition` until it holds (true) or `limit` passes (false).
fn wait_within_limit(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !condition() {
        if started.elapsed() > limit {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

fn await_within(what: &str, limit: Duration, condition: impl FnMut() -> bool) {
    assert!(
        wait_within_limit(limit, condition),
        "timed out after {limit:?} waiting for {what}"
    );
}

/// The commands' spans from the log, in the order they began.
fn spans(lines: &[String], runs: &[Run]) -> Vec<Span> {
    let mut spans: BTreeMap<usize, Span> = BTreeMap::new();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["enter", id, at, fence] => {
                let id: usize = id.parse().expect("an id");
                let at: i128 = at.parse().expect("a time");
                spans.insert(
                    id,
                    Span {
                        id,
                        enter: at,
                        exit: None,
                        end: i128::MAX,
                        fence: fence.parse().expect("a fence"),
                    },
                );
            }
            ["exit", id, at, ..] => {
                let id: usize = id.parse().expect("an id");
                let at: i128 = at.parse().expect("a time");
                if let Some(span) = spans.get_mut(&id) {
                    span.exit = Some(at);
                    span.end = at;
                }
            }
            // A line cut short by a killed command: its span ends when its lockrun did.
            _ => {}
        }
    }
    for run in runs {
        if let Some(span) = spans.get_mut(&run.id)
            && span.exit.is_none()
        {
            span.end = run.ended_at;
        }
    }
    let mut spans: Vec<Span> = spans.into_values().collect();
    spans.sort_by_key(|span| span.enter);
    spans
}

/// Pairs of commands that held the one slot at once.
fn overlaps(spans: &[Span]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut latest: Option<Span> = None;
    for span in spans {
        if let Some(before) = latest {
            if span.enter < before.end {
                found.push((before.id, span.id));
            }
            if span.end > before.end {
                latest = Some(*span);
            }
        } else {
            latest = Some(*span);
        }
    }
    found
}

/// Commands whose fence was not above that of the one that began before them.
fn fences_back(spans: &[Span]) -> Vec<(u64, u64)> {
    spans
        .windows(2)
        .filter(|pair| pair[1].fence <= pair[0].fence)
        .map(|pair| (pair[0].fence, pair[1].fence))
        .collect()
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use crate::support::etcd::EtcdCluster;

    /// A cluster with etcd's own heartbeat and election timeout (100 ms,
    /// 1 s), not the harness's fast ones: an election takes as long as in production.
    fn cluster() -> Option<EtcdCluster> {
        EtcdCluster::start_with(&["--heartbeat-interval", "100", "--election-timeout", "1000"])
    }

    /// Each contender lists the members starting from a different one.
    fn contender(cluster: &EtcdCluster) -> impl Fn(usize) -> Command + Sync + '_ {
        move |worker| {
            let mut command = lockrun();
            command.args(["--backend", "etcd", "--etcd-endpoints"]);
            command.arg(cluster.endpoints(worker % 3));
            command
        }
    }

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn the_leader_killed_and_restarted() {
        let Some(cluster) = cluster() else {
            return;
        };
        let fault = Fault {
            what: "leader killed, restarted 1.5 s later",
            inject: Box::new(|| {
                let leader = cluster.leader();
                cluster.kill(leader);
                thread::sleep(Duration::from_millis(1500));
                cluster.restart(leader);
            }),
        };
        under_faults("etcd", &contender(&cluster), fault);
    }

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn a_follower_paused_and_resumed() {
        let Some(cluster) = cluster() else {
            return;
        };
        // A follower, not the leader: etcd before 3.4.28 and 3.5.10 revokes every
        // lease when a leader stalled past the election timeout comes back (etcd
        // issues 12528 and 15247), so holders lose their leases early whatever the
        // client does (docs/backends/etcd.md: "etcd backend").
        let mut round = 0;
        let fault = Fault {
            what: "a follower (another each time) SIGSTOPped for 3 s, then SIGCONTed",
            inject: Box::new(|| {
                let leader = cluster.leader();
                let member = (leader + 1 + round % 2) % 3;
                round += 1;
                cluster.pause(member);
                thread::sleep(Duration::from_secs(3));
                cluster.resume(member);
            }),
        };
        under_faults("etcd", &contender(&cluster), fault);
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use super::*;
    use crate::support::postgres::{PostgresServer, Shutdown};

    fn contender(url: &str) -> impl Fn(usize) -> Command + Sync + '_ {
        move |_| {
            let mut command = lockrun();
            command.args(["--backend", "postgres", "--postgres-url", url]);
            command
        }
    }

    fn under_postgres_faults(what: &str, inject: impl Fn(&PostgresServer)) {
        let Some(server) = PostgresServer::start().map(Arc::new) else {
            return;
        };
        let url = server.url();
        let fault = Fault {
            what,
            inject: Box::new(|| inject(&server)),
        };
        under_faults("postgres", &contender(&url), fault);
    }

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn a_fast_restart() {
        under_postgres_faults("pg_ctl restart -m fast", |server| {
            server.stop(Shutdown::Fast);
            assert!(server.restart(), "restart:\n{}", server.log());
        });
    }

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn an_immediate_stop_then_a_start() {
        under_postgres_faults("pg_ctl stop -m immediate, started 1.5 s later", |server| {
            server.stop(Shutdown::Immediate);
            thread::sleep(Duration::from_millis(1500));
            assert!(server.restart(), "restart:\n{}", server.log());
        });
    }

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn lockruns_sessions_terminated() {
        under_postgres_faults("pg_terminate_backend of lockrun's sessions", |server| {
            // Once more half-way: holders, waiters and runs connecting are all hit.
            server.terminate_sessions("lockrun");
            thread::sleep(Duration::from_millis(700));
            server.terminate_sessions("lockrun");
        });
    }
}

mod redis {
    use std::sync::Arc;

    use super::*;

    #[test]
    #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
    fn a_restart() {
        // Every write on disk before it is answered: a restart loses nothing,
        // as with PostgreSQL, so leases and fences outlive it.
        let Some(server) =
            RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]).map(Arc::new)
        else {
            return;
        };
        let url = server.url();
        let contender = |_: usize| {
            let mut command = lockrun();
            command.args(["--backend", "redis", "--redis-url", &url]);
            command
        };
        let fault = Fault {
            what: "redis-server killed, restarted on its data 1 s later",
            inject: Box::new(|| {
                server.kill();
                thread::sleep(Duration::from_secs(1));
                assert!(server.restart(), "redis-server did not restart");
            }),
        };
        under_faults("redis", &contender, fault);
    }
}

/// A lockrun stopped (SIGSTOP) for this long while it holds a `--ttl 2s` lease: past its deadline.
const PAUSE: Duration = Duration::from_secs(3);

/// Instantiates the paused-lockrun tests for one backend.
macro_rules! paused_tests {
    ($module:ident, $store:expr) => {
        mod $module {
            use $crate::support::MaybeStore;

            #[test]
            #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
            fn past_the_deadline_after_the_command_ended_keeps_its_status() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::faults::paused_after_the_command_ended(&store);
                }
            }

            #[test]
            #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
            fn with_its_watchdog_past_the_deadline_after_the_command_ended_exits_76() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::faults::paused_with_its_watchdog_after_the_command_ended(&store);
                }
            }

            #[test]
            #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
            fn as_its_command_starts_has_the_command_stopped_within_the_lease() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::faults::paused_as_the_command_starts(&store);
                }
            }

            #[test]
            #[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
            fn past_the_deadline_while_the_command_runs_exits_76() {
                if let Some(store) = MaybeStore::into_store($store) {
                    $crate::faults::paused_while_the_command_runs(&store);
                }
            }
        }
    };
}

/// A lockrun paused past its deadline, on SQLite (no server) and each networked backend.
mod paused {
    paused_tests!(sqlite, crate::support::Store::sqlite());
    paused_tests!(redis, crate::support::Store::redis());
    #[cfg(feature = "postgres")]
    paused_tests!(postgres, crate::support::Store::postgres());
    #[cfg(feature = "etcd")]
    paused_tests!(etcd, crate::support::Store::etcd());
}

/// Stops `lockrun` (SIGSTOP), once it is stopped runs `meanwhile`, and lets
/// it go on (SIGCONT) `PAUSE` after it was stopped.
fn pause(lockrun: &Running, meanwhile: impl FnOnce()) {
    let pid = lockrun.id();
    signal(pid, Signal::SIGSTOP);
    let stopped = Instant::now();
    wait_until("lockrun to be stopped", || {
        process_state(pid.cast_signed()) == Some('T')
    });
    meanwhile();
    thread::sleep(PAUSE.saturating_sub(stopped.elapsed()));
    signal(pid, Signal::SIGCONT);
}

/// lockrun under `--ttl 2s`, its command started and waiting for `go`, after
/// which it prints "finished" and ends at once (writing `ended`).
fn start_command_that_waits_for_go(store: &Store, scratch: &Scratch) -> Running {
    let script = format!(
        ": > '{started}'; while [ ! -e '{go}' ]; do sleep 0.01; done; echo finished; : > '{ended}'",
        started = scratch.path("started").display(),
        go = scratch.path("go").display(),
        ended = scratch.path("ended").display(),
    );
    let mut lockrun = store
        .lockrun()
        .args(["--ttl", "2s", "--name", "paused", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .start();
    wait_until("the command to start", || {
        assert!(
            lockrun.try_wait().unwrap().is_none(),
            "lockrun exited early"
        );
        scratch.path("started").exists()
    });
    lockrun
}

/// The issue's case: lockrun is stopped while its command runs, the command
/// ends 0.x s after the acquisition (long before the 2 s deadline), and
/// lockrun wakes 3 s later: the command's status (0) and output, not 76.
pub fn paused_after_the_command_ended(store: &Store) {
    let scratch = Scratch::new();
    // The command waits for `go` so that it surely ends while lockrun is stopped.
    let lockrun = start_command_that_waits_for_go(store, &scratch);
    let acquired = Instant::now();
    let mut ended_after = Duration::ZERO;
    pause(&lockrun, || {
        fs::write(scratch.path("go"), "").unwrap();
        wait_for_file(&scratch.path("ended"));
        ended_after = acquired.elapsed();
        assert!(
            ended_after < Duration::from_millis(1500),
            "the command must end well before its 2 s deadline to test this; it took {ended_after:?}",
        );
    });
    let output = finish(lockrun);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the command ended {:?} after the acquisition, before the lease's deadline; \
         lockrun said: {}",
        ended_after,
        stderr(&output).trim()
    );
    assert_eq!(stdout(&output), "finished\n");
}

/// As above, but the watchdog is stopped too (the whole machine was, say)
/// and looks only after the lease's end: nobody can tell that the command
/// ended in time, so lockrun takes the worst, 76, and says that it cannot.
pub fn paused_with_its_watchdog_after_the_command_ended(store: &Store) {
    let scratch = Scratch::new();
    let lockrun = start_command_that_waits_for_go(store, &scratch);
    let acquired = Instant::now();
    let watchdog = watchdog_of(lockrun.id());
    pause(&lockrun, || {
        stop_before_its_first_moment(watchdog, acquired);
        fs::write(scratch.path("go"), "").unwrap();
        wait_for_file(&scratch.path("ended"));
        // The watchdog goes on once the lease has ended, before lockrun does.
        thread::sleep(Duration::from_millis(2500).saturating_sub(acquired.elapsed()));
        signal(watchdog, Signal::SIGCONT);
        wait_until("the watchdog to look and wait again", || {
            process_state(watchdog.cast_signed()) == Some('S')
        });
    });
    let output = finish(lockrun);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "its watchdog cannot say that the command ended before; the command exited with status 0"
        ),
        "{}",
        stderr(&output)
    );
    assert_eq!(stdout(&output), "finished\n", "its output is kept");
}

/// Stops `watchdog` (SIGSTOP), which must happen before its first moment,
/// 1.5 s into the 2 s lease of a command seen started at `started`.
fn stop_before_its_first_moment(watchdog: u32, started: Instant) {
    signal(watchdog, Signal::SIGSTOP);
    wait_until("the watchdog to be stopped", || {
        process_state(watchdog.cast_signed()) == Some('T')
    });
    assert!(
        started.elapsed() < Duration::from_millis(1300),
        "the watchdog must be stopped before its first moment (1.5 s) to test this; it took {:?}",
        started.elapsed()
    );
}

/// lockrun is stopped while its command runs, and wakes past the deadline
/// with the command still running: the command is stopped at once, 76.
pub fn paused_while_the_command_runs(store: &Store) {
    let scratch = Scratch::new();
    let script = format!(
        "echo $$ > '{pid}'; sleep 5; : > '{ended}'",
        pid = scratch.path("pid").display(),
        ended = scratch.path("ended").display(),
    );
    let mut lockrun = store
        .lockrun()
        .args(["--ttl", "2s", "--name", "paused", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .start();
    let command = read_pid(&scratch.path("pid"));
    assert!(
        lockrun.try_wait().unwrap().is_none(),
        "lockrun exited early"
    );
    pause(&lockrun, || {});
    let woke = Instant::now();
    let output = finish(lockrun);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        woke.elapsed() < Duration::from_secs(2),
        "the command is stopped at once: lockrun took {:?}",
        woke.elapsed()
    );
    assert!(!process_exists(command), "the command was stopped");
    assert!(
        !scratch.path("ended").exists(),
        "the command ran on to its end"
    );
}

/// The command stops lockrun (SIGSTOP) as its very first act, and so before
/// lockrun could do anything after starting it: the watchdog knows the lease's
/// moments already and stops the command before the lease ends; lockrun, let
/// go on later, says 76.
pub fn paused_as_the_command_starts(store: &Store) {
    let scratch = Scratch::new();
    let script = format!(
        "kill -STOP $PPID; echo $$ > '{pid}.new' && mv '{pid}.new' '{pid}'; sleep 5; : > '{ended}'",
        pid = scratch.path("pid").display(),
        ended = scratch.path("ended").display(),
    );
    // On one CPU, as a loaded host may leave it, the command's first act comes
    // before lockrun runs again after starting it. This thread's CPUs are
    // what lockrun inherits; they are given back once it has started.
    let cpus = sched_getaffinity(Pid::from_raw(0)).expect("this thread's CPUs");
    let mut one = CpuSet::new();
    let first = (0..CpuSet::count()).find(|&cpu| cpus.is_set(cpu).unwrap_or(false));
    one.set(first.expect("a CPU")).unwrap();
    sched_setaffinity(Pid::from_raw(0), &one).expect("one CPU");
    let started = Instant::now();
    let lockrun = store
        .lockrun()
        .args(["--ttl", "2s", "--name", "paused", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .start();
    sched_setaffinity(Pid::from_raw(0), &cpus).expect("the CPUs back");
    let command = read_pid(&scratch.path("pid"));
    wait_until("the command to stop lockrun", || {
        process_state(lockrun.id().cast_signed()) == Some('T')
    });
    wait_until_within(
        "the watchdog to stop the command within its 2 s lease",
        Duration::from_secs(4),
        || !process_exists(command),
    );
    let stopped_after = started.elapsed();
    signal(lockrun.id(), Signal::SIGCONT);
    let output = finish(lockrun);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        !scratch.path("ended").exists(),
        "the command ran on to its end"
    );
    assert!(
        stopped_after < Duration::from_secs(2),
        "stopped {stopped_after:?} after it started: past its lease"
    );
}

/// The watchdog alone is held up (SIGSTOP) past the moments it was first told,
/// while lockrun goes on renewing the lease and telling it newer ones: once it
/// runs again it reads those before it acts, and leaves the command alone.
#[test]
#[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
fn a_watchdog_held_up_while_lockrun_renews_leaves_the_command_alone() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let lockrun = start_command_that_waits_for_go(&store, &scratch);
    let started = Instant::now();
    let watchdog = watchdog_of(lockrun.id());
    stop_before_its_first_moment(watchdog, started);
    // Past the first lease's end: lockrun renewed it meanwhile (every 2/3 s).
    thread::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed()));
    signal(watchdog, Signal::SIGCONT);
    wait_until("the watchdog to read and wait again", || {
        process_state(watchdog.cast_signed()) == Some('S')
    });
    fs::write(scratch.path("go"), "").unwrap();
    let output = finish(lockrun);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "finished\n");
}

/// lockrun held up past its lease's end just before its command starts:
/// strace delays the entry of its fork of the watchdog (the first `clone`),
/// then, in a second run, of its spawn of the command (the second), by 2.5 s
/// of a 2 s lease. The command never runs, and lockrun says 76.
#[test]
#[ignore = "fault suite: cargo test --test integration -- --ignored faults --test-threads 1"]
fn held_up_past_the_lease_before_the_command_starts_never_runs_it() {
    if !strace_traces("lockrun held up in a system call") {
        return;
    }
    let store = Store::sqlite();
    for (clone, what) in [(1, "forking the watchdog"), (2, "spawning the command")] {
        let scratch = Scratch::new();
        let script = format!(": > '{}'", scratch.path("ran").display());
        let argv = store.argv(&[
            "--ttl", "2s", "--name", "held-up", "--", "sh", "-c", &script,
        ]);
        let output = without_lockrun_variables(Command::new("strace"))
            .args(["-o", "/dev/null", "-e", "trace=clone", "-e"])
            .arg(format!("inject=clone:delay_enter=2500000:when={clone}"))
            .args(&argv)
            .output()
            .expect("strace");
        assert_eq!(
            output.status.code(),
            Some(76),
            "held up {what}: {}",
            stderr(&output)
        );
        assert!(
            !scratch.path("ran").exists(),
            "held up {what}, the command ran after its lease's end: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("did not start the command"),
            "held up {what}: {}",
            stderr(&output)
        );
    }
}

/// The suite's own checks find what they look for (they run with `cargo test`).
#[test]
fn the_checks_find_an_overlap_and_a_fence_going_back() {
    let log: Vec<String> = [
        "enter 1 100 7",
        "exit 1 200",
        "enter 2 250 9",
        "enter 3 300 8",
        "exit 3 320 stopped",
        "exit 2 350",
        "enter 4 400 10",
        "exi",
    ]
    .iter()
    .map(|line| (*line).to_owned())
    .collect();
    let runs = [Run {
        id: 4,
        ended_at: 500,
        ending: Ending::Code(76),
    }];
    let spans = spans(&log, &runs);
    assert_eq!(overlaps(&spans), [(2, 3)]);
    assert_eq!(fences_back(&spans), [(9, 8)]);
    assert_eq!(spans.last().map(|span| span.end), Some(500));
    assert_eq!(
        mask_numbers("127.0.0.1:43053: no answer within 906.05ms"),
        "N.0.0.1:N: no answer within N.05ms"
    );
}
