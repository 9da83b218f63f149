//! A cron minute on a fleet, simulated on one machine (CONTRIBUTING.md: "The ignored suites",
//! BENCHMARKS.md: "Scale"): many lockrun processes at once against real
//! servers of the test's own. Ignored by default, like the stress suite;
//! `.ci/run` runs a small version and `scripts/fleet` the full one, which sets:
//!
//! - `LOCKRUN_FLEET_HERD` (default 100): lockruns started at one instant with
//!   `--no-wait -p 3` on one name: 3 run, the rest exit 75, none 69 or hangs;
//!   and on PostgreSQL behind a transaction-pooling pgbouncer, with `-p 2`;
//! - `LOCKRUN_FLEET_LINE` (default 50): waiters queued one after another
//!   behind a holder, then served: in arrival order, the handoff flat;
//! - `LOCKRUN_FLEET_NAMES` (default 300): names held at once (with
//!   `--min-hold`, no process per name), then `status` over all of them.
//!
//! Each prints one `fleet:` line of figures per measure; the server's work is
//! read from the server itself (Redis `INFO`, PostgreSQL's statistics and its
//! processes' CPU time, etcd's metrics).

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// The fleet tests for one backend, on a store and a gauge of its server's work.
macro_rules! fleet_tests {
    ($module:ident, $setup:expr) => {
        mod $module {
            use super::*;

            #[test]
            #[ignore = "fleet suite: cargo test --test integration -- --ignored fleet --test-threads 1"]
            fn herd() {
                if let Some((store, gauge)) = $setup {
                    super::herd(stringify!($module), &store, &gauge, super::SLOTS);
                }
            }
            #[test]
            #[ignore = "fleet suite: cargo test --test integration -- --ignored fleet --test-threads 1"]
            fn long_line() {
                if let Some((store, gauge)) = $setup {
                    super::long_line(stringify!($module), &store, &gauge);
                }
            }
            #[test]
            #[ignore = "fleet suite: cargo test --test integration -- --ignored fleet --test-threads 1"]
            fn many_names() {
                if let Some((store, _gauge)) = $setup {
                    super::many_names(stringify!($module), &store);
                }
            }
        }
    };
}

fleet_tests!(file, Some((Store::file(), Gauge::none())));
fleet_tests!(sqlite, Some((Store::sqlite(), Gauge::none())));
fleet_tests!(redis, redis_store());
#[cfg(feature = "postgres")]
fleet_tests!(postgres, postgres_store());
#[cfg(feature = "etcd")]
fleet_tests!(etcd, etcd_store());

/// The herd's slots.
const SLOTS: usize = 3;
/// Lockruns taking names at once in `many_names`.
const WORKERS: usize = 8;
/// Longer than any answer may take: a lockrun still running then has hung.
const PATIENCE_PER_RUN: Duration = Duration::from_millis(200);

fn scale(variable: &str, default: usize) -> usize {
    std::env::var(variable)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// What a server has done so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Work {
    /// Commands, transactions or calls, as the server counts them.
    calls: u64,
    /// CPU time of the server's processes.
    cpu: Duration,
    /// Clients connected now, where the server says (not etcd's gateway).
    connections: Option<u64>,
    /// Memory the server uses for data, where it says (Redis).
    memory: Option<u64>,
}

/// Reads a server's [`Work`]; none for the file and SQLite backends.
pub struct Gauge {
    read: Option<Box<dyn Fn() -> Work + Send + Sync>>,
    /// What `calls` counts.
    unit: &'static str,
}

impl Gauge {
    fn none() -> Self {
        Self {
            read: None,
            unit: "",
        }
    }

    fn read(&self) -> Option<Work> {
        self.read.as_ref().map(|read| read())
    }
}

fn redis_store() -> Option<(Store, Gauge)> {
    let server = Arc::new(RedisServer::start(&["--maxclients", "4000"])?);
    let store = Store::on_redis(&server);
    let read = move || {
        let info: String = ::redis::cmd("INFO")
            .arg("all")
            .query(&mut server.client())
            .expect("INFO");
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Work {
            calls: server.command_calls().values().sum(),
            cpu: Duration::from_secs_f64(field("used_cpu_sys") + field("used_cpu_user")),
            // Less the connection that asks.
            connections: Some((field("connected_clients") as u64).saturating_sub(1)),
            memory: Some(field("used_memory") as u64),
        }
    };
    let gauge = Gauge {
        read: Some(Box::new(read)),
        unit: "Redis commands",
    };
    Some((store, gauge))
}

#[cfg(feature = "postgres")]
fn postgres_store() -> Option<(Store, Gauge)> {
    use crate::support::postgres::PostgresServer;

    // PostgreSQL's default: a thousand waiters must not need a connection each.
    let server = Arc::new(PostgresServer::start_with(&["max_connections=100"])?);
    let store = Store::on_postgres(&server);
    Some((store, postgres_gauge(server)))
}

/// The work of `server`, read from the server itself.
#[cfg(feature = "postgres")]
fn postgres_gauge(server: Arc<crate::support::postgres::PostgresServer>) -> Gauge {
    let read = move || {
        let calls = server.transactions();
        // Kept open until the postmaster is found from its server process,
        // which may otherwise have exited already.
        let mut client = server.client();
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend'), pg_backend_pid()",
                &[],
            )
            .expect("PostgreSQL's activity");
        // The postmaster: the parent of this session's server process; its
        // children's CPU time (running and reaped sessions) counts as its own.
        let backend: i32 = row.get(1);
        let postmaster =
            parent_of(backend.unsigned_abs()).expect("the postmaster, from its server process");
        drop(client);
        Work {
            calls,
            cpu: cpu_time_with_children(postmaster),
            connections: Some(row.get::<_, i64>(0).unsigned_abs().saturating_sub(1)),
            memory: None,
        }
    };
    Gauge {
        read: Some(Box::new(read)),
        unit: "PostgreSQL transactions",
    }
}

/// The herd through a transaction-pooling pgbouncer in front of a PostgreSQL
/// of the default size, as a fleet would meet it: `--no-wait -p 2`, exactly 2
/// run, the rest exit 75, none 69 (issue 21).
#[cfg(feature = "postgres")]
mod postgres_behind_pgbouncer {
    use super::*;
    use crate::support::pgbouncer::{Pgbouncer, PoolMode};
    use crate::support::postgres::PostgresServer;

    #[test]
    #[ignore = "fleet suite: cargo test --test integration -- --ignored fleet --test-threads 1"]
    fn herd() {
        let Some(server) = PostgresServer::start_with(&["max_connections=100"]).map(Arc::new)
        else {
            return;
        };
        let Some(bouncer) = Pgbouncer::start(&server, PoolMode::Transaction) else {
            return;
        };
        let url = bouncer.url();
        let store = Store::on_postgres_at(&url, Box::new(bouncer));
        super::herd(
            "postgres behind pgbouncer (transaction pooling)",
            &store,
            &postgres_gauge(server),
            2,
        );
    }
}

#[cfg(feature = "etcd")]
fn etcd_store() -> Option<(Store, Gauge)> {
    use crate::support::etcd::EtcdServer;

    let server = Arc::new(EtcdServer::start()?);
    let store = Store::on_etcd(server.url(), Box::new(Arc::clone(&server)));
    let read = move || {
        let cpu = server
            .metrics()
            .lines()
            .find_map(|line| {
                line.strip_prefix("process_cpu_seconds_total ")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0);
        Work {
            calls: server.calls().values().sum(),
            cpu: Duration::from_secs_f64(cpu),
            connections: None,
            memory: None,
        }
    };
    let gauge = Gauge {
        read: Some(Box::new(read)),
        unit: "etcd calls",
    };
    Some((store, gauge))
}

/// The parent process of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// A process's CPU time with that of its children, reaped (cutime, cstime) and
/// running: a pooler's server sessions live through the herd.
fn cpu_time_with_children(pid: u32) -> Duration {
    let running: u64 = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .map(|child| cpu_ticks(child, 2))
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis((cpu_ticks(pid, 4) + running) * 10)
}

/// The first `fields` of utime, stime, cutime and cstime of `pid`, in ticks.
fn cpu_ticks(pid: u32, fields: usize) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rfind(')').map_or("", |end| &stat[end + 1..]);
    after_name
        .split_whitespace()
        .skip(11)
        .take(fields)
        .filter_map(|field| field.parse::<u64>().ok())
        .sum()
}

/// The `p`-th percentile of `values` (sorted here).
fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    let at = ((values.len() as f64 - 1.0) * p / 100.0).round() as usize;
    values[at]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// The server's work between `before` and `after`, per `per` of something.
fn work_text(
    gauge: &Gauge,
    (before, after): (Option<Work>, Option<Work>),
    per: usize,
    each: &str,
) -> String {
    let (Some(before), Some(after)) = (before, after) else {
        return String::new();
    };
    let per = per as f64;
    format!(
        "; server: {:.2} {} and {:.3} ms CPU per {each}",
        (after.calls - before.calls) as f64 / per,
        gauge.unit,
        (after.cpu.saturating_sub(before.cpu)).as_secs_f64() * 1000.0 / per,
    )
}

/// The herd's flock(1) processes, each leading a process group with its
/// lockrun: killed with them if the test ends early (the watchdogs then stop the commands).
struct Herd(Vec<Running>);

impl Drop for Herd {
    fn drop(&mut self) {
        for run in &self.0 {
            let group = nix::unistd::Pid::from_raw(run.id().cast_signed());
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Waits for every lockrun of the herd to have its answer: an exit, or its
/// command running (the holders). When each came, and the exits' statuses.
fn answers(
    runs: &mut Herd,
    scratch: &Scratch,
    started: Instant,
) -> (Vec<Option<Duration>>, Vec<Option<i32>>) {
    let herd = runs.0.len();
    let limit = PATIENCE_PER_RUN * u32::try_from(herd).unwrap() + Duration::from_secs(10);
    let mut answered = vec![None; herd];
    let mut codes = vec![None; herd];
    // flock(1) runs lockrun as its child, and lockrun the holder's shell, which names its file.
    let holding = || -> Vec<u32> {
        fs::read_dir(scratch.dir())
            .unwrap()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                let shell = name.to_str()?.strip_prefix("held.")?.parse().ok()?;
                parent_of(shell).and_then(parent_of)
            })
            .collect()
    };
    while answered.iter().any(Option::is_none) {
        assert!(
            started.elapsed() < limit,
            "{} of {herd} lockruns had no answer after {:?}",
            answered.iter().filter(|a| a.is_none()).count(),
            started.elapsed()
        );
        let holders = holding();
        for (at, run) in runs.0.iter_mut().enumerate() {
            if answered[at].is_some() {
                continue;
            }
            if let Some(status) = run.try_wait().unwrap() {
                answered[at] = Some(started.elapsed());
                codes[at] = status.code();
            } else if holders.contains(&run.id()) {
                answered[at] = Some(started.elapsed());
            }
        }
        // Each round asks every run: at a thousand, more often would take the CPU they need.
        thread::sleep(Duration::from_millis(20));
    }
    (answered, codes)
}

/// `herd` lockruns with `--no-wait -p SLOTS` let go at one instant (all blocked on
/// one flock(1) barrier first): exactly SLOTS run, the rest exit 75 at once.
pub fn herd(backend: &str, store: &Store, gauge: &Gauge, slots: usize) {
    let herd = scale("LOCKRUN_FLEET_HERD", 100);
    let scratch = Scratch::new();
    let barrier = scratch.path("barrier");
    fs::write(&barrier, "").unwrap();
    let gate = fs::File::open(&barrier).unwrap();
    gate.lock().unwrap();
    let holder = format!(
        "touch '{held}'.$$; while [ ! -e '{release}' ]; do sleep 0.05; done",
        held = scratch.path("held").display(),
        release = scratch.path("release").display(),
    );
    let slots_text = slots.to_string();
    let argv = store.argv(&[
        "--name",
        "herd",
        "-p",
        &slots_text,
        "--no-wait",
        "-c",
        &holder,
    ]);
    let mut runs = Herd(
        (0..herd)
            .map(|at| {
                Command::new("flock")
                    .arg("-s")
                    .arg(&barrier)
                    .args(&argv)
                    .stdout(Stdio::null())
                    .stderr(fs::File::create(scratch.path(&format!("stderr.{at}"))).unwrap())
                    .process_group(0)
                    .start()
            })
            .collect(),
    );
    wait_until("the herd to line up at the barrier", || {
        blocked_on(&barrier).len() == herd
    });
    let before = gauge.read();
    let started = Instant::now();
    gate.unlock().unwrap();
    let (answered, mut codes) = answers(&mut runs, &scratch, started);
    let after = gauge.read();
    fs::write(scratch.path("release"), "").unwrap();
    for (at, run) in runs.0.iter_mut().enumerate() {
        if codes[at].is_none() {
            codes[at] = wait(run).code();
        }
    }
    let count = |code: i32| codes.iter().filter(|c| **c == Some(code)).count();
    let mut times: Vec<Duration> = answered.into_iter().flatten().collect();
    let (p50, p99, last) = (
        percentile(&mut times, 50.0),
        percentile(&mut times, 99.0),
        percentile(&mut times, 100.0),
    );
    eprintln!(
        "fleet: {backend} herd of {herd} (--no-wait -p {slots}): {} ran, {} busy (75), {} other; \
         answer after p50 {}, p99 {}, last {}{}",
        count(0),
        count(75),
        herd - count(0) - count(75),
        ms(p50),
        ms(p99),
        ms(last),
        work_text(gauge, (before, after), herd, "attempt"),
    );
    let mut statuses = std::collections::BTreeMap::new();
    for code in &codes {
        *statuses.entry(*code).or_insert(0) += 1;
    }
    let other = codes
        .iter()
        .position(|code| !matches!(code, Some(0 | 75)))
        .map(|at| {
            let said =
                fs::read_to_string(scratch.path(&format!("stderr.{at}"))).unwrap_or_default();
            format!("{said} (statuses: {statuses:?})")
        });
    assert_eq!(
        count(0),
        slots,
        "exactly {slots} ran; another said: {other:?}"
    );
    assert_eq!(
        count(75),
        herd - slots,
        "the rest were busy; another said: {other:?}"
    );
}

/// `line` waiters queued one after another behind a holder, then served: every
/// one runs, in arrival order; the handoff does not grow along the line; the
/// server's connections and memory stay bounded.
pub fn long_line(backend: &str, store: &Store, gauge: &Gauge) {
    let line = scale("LOCKRUN_FLEET_LINE", 50);
    let scratch = Scratch::new();
    let mut holder = crate::core::hold(store, &scratch, "line", &[]);
    let joined = Instant::now();
    let mut waiters = crate::core::line_up(store, &scratch, "line", line, &["-w", "600"]);
    let joining = joined.elapsed();
    let before = gauge.read();
    // The waiters' own work from here to their commands' starts (as BENCHMARKS.md's (iii)).
    let in_line: Vec<Option<(u64, Duration)>> = waiters
        .iter()
        .map(|waiter| crate::core::counters_of(waiter.id()))
        .collect();
    let sampling = AtomicBool::new(true);
    let peak = thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = Work::default();
            while sampling.load(Ordering::SeqCst) {
                if let Some(work) = gauge.read() {
                    peak.connections = peak.connections.max(work.connections);
                    peak.memory = peak.memory.max(work.memory);
                }
                thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        fs::write(scratch.path("release"), "").unwrap();
        assert_eq!(wait(&mut holder).code(), Some(0));
        for waiter in &mut waiters {
            assert_eq!(wait(waiter).code(), Some(0));
        }
        sampling.store(false, Ordering::SeqCst);
        sampler.join().unwrap()
    });
    let after = gauge.read();
    let waited = crate::core::waited(&scratch, &in_line);
    let acquisitions = waited.len().max(1) as f64;
    let wakeups = waited
        .iter()
        .map(|(wakeups, _)| *wakeups as f64)
        .sum::<f64>()
        / acquisitions;
    let cpu = waited.iter().map(|(_, cpu)| cpu.as_secs_f64()).sum::<f64>() / acquisitions;
    let served = crate::core::served(&scratch);
    let order: Vec<usize> = served.iter().map(|(place, _)| *place).collect();
    let intervals: Vec<Duration> = served
        .windows(2)
        .map(|pair| Duration::from_nanos((pair[1].1 - pair[0].1).max(0).unsigned_abs() as u64))
        .collect();
    let longest = intervals.iter().max().copied().unwrap_or_default();
    let tenth = (intervals.len() / 10).max(1);
    let mut front = intervals[..tenth].to_vec();
    let mut back = intervals[intervals.len() - tenth..].to_vec();
    let (front, back) = (percentile(&mut front, 50.0), percentile(&mut back, 50.0));
    let bounded = match (before, after) {
        (Some(_), Some(after)) => format!(
            "; server:{}{}{}",
            peak.connections
                .map(|connections| format!(" peak {connections} connections,"))
                .unwrap_or_default(),
            peak.memory
                .map(|memory| format!(" peak {:.1} MiB used,", memory as f64 / 1_048_576.0))
                .unwrap_or_default(),
            work_text(gauge, (before, Some(after)), line, "acquisition").replace("; server:", ""),
        ),
        _ => String::new(),
    };
    eprintln!(
        "fleet: {backend} line of {line}: joined in {:.1} s; served in arrival order: {}; \
         start-to-start median, first tenth {} → last tenth {}, longest {}; per acquisition, \
         the waiters' {wakeups:.1} wake-ups and {:.3} ms CPU{bounded}",
        joining.as_secs_f64(),
        order.iter().copied().eq(0..line),
        ms(front),
        ms(back),
        ms(longest),
        cpu * 1000.0,
    );
    assert_eq!(
        order,
        (0..line).collect::<Vec<_>>(),
        "first come, first served"
    );
}

/// `names` distinct names held at once (kept by `--min-hold` after each
/// lockrun exits), then `status` over all of them: its time and peak memory.
pub fn many_names(backend: &str, store: &Store) {
    let names = scale("LOCKRUN_FLEET_NAMES", 300);
    let took = Instant::now();
    let flags = store.args().to_vec();
    thread::scope(|scope| {
        for worker in 0..WORKERS {
            let flags = &flags;
            scope.spawn(move || {
                for name in (worker..names).step_by(WORKERS) {
                    let name = format!("name-{name:06}");
                    let args = ["--name", &name, "--min-hold", "1h", "--ttl", "1h", "true"];
                    assert_status(&run(lockrun().args(flags).args(args)), 0);
                }
            });
        }
    });
    let taking = took.elapsed();
    for json in [true, false] {
        let started = Instant::now();
        let argv = store.argv(&[]);
        let mut command = Command::new("/usr/bin/time");
        command
            .args(["-f", "peak %M KiB"])
            .arg(&argv[0])
            .arg("status")
            .args(&argv[1..]);
        if json {
            command.arg("--json");
        }
        let output = run(&mut command);
        let took = started.elapsed();
        assert!(output.status.success(), "{}", stderr(&output));
        let listed = if json {
            let entries: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            entries.as_array().map_or(0, Vec::len)
        } else {
            // Below the line that says where the locks are, and the table's header.
            stdout(&output).lines().count().saturating_sub(2)
        };
        let peak = stderr(&output)
            .lines()
            .find_map(|line| line.strip_prefix("peak "))
            .unwrap_or("?")
            .to_owned();
        eprintln!(
            "fleet: {backend} {names} names held (taken in {:.1} s): status{} listed {listed} in {}, peak {peak}",
            taking.as_secs_f64(),
            if json { " --json" } else { "" },
            ms(took),
        );
        assert_eq!(listed, names, "every name listed");
    }
}
