//! lockrun against flock(1), measured side by side in one run on this machine
//! (`scripts/bench`, or `cargo bench --bench compare`). Prints every result
//! with PASS/MISS against its target and rewrites the generated part of
//! BENCHMARKS.md, keeping the hand-written notes below it.
//!
//! Two builds of lockrun are measured: the default one (this build's binary, or
//! `LOCKRUN_BENCH_BIN`) and the static opt-in build of the README
//! (`LOCKRUN_BENCH_STATIC_BIN`, else built here with the README's command).
//!
//! The same executable is also the tiny command the queue benchmarks run
//! (`compare stamp ...`) and the peak-RSS wrapper (`compare rss ...`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use nix::time::{ClockId, clock_gettime};

/// The tests' harness, for the servers the benchmark starts; most of it is for the tests alone.
#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;

use support::RedisServer;
use support::cluster::RedisCluster;
#[cfg(feature = "etcd")]
use support::etcd::EtcdServer;
#[cfg(feature = "postgres")]
use support::postgres::PostgresServer;

/// Runs of `COMMAND true` per contender for (a) and (d).
const SINGLE_RUNS: usize = 1000;
/// (b): processes, runs each, and how often the whole contention is repeated.
const CONTENDERS: usize = 8;
const CONTENDED_RUNS: usize = 25;
const CONTENTION_ROUNDS: usize = 9;
/// (c) and (ii): waiters queued behind the holders, each holding this long, per round.
const QUEUE: usize = 12;
const QUEUE_ROUNDS: usize = 3;
const QUEUE_HOLD: Duration = Duration::from_millis(20);
/// (c): time the waiters get to line up behind the first holder.
const QUEUE_SETTLE: Duration = Duration::from_millis(300);
/// (ii): slots.
const SLOTS: u32 = 4;
/// (i): waiters, the time between their arrivals, rounds.
const FAIR_WAITERS: usize = 10;
const FAIR_SPACING: Duration = Duration::from_millis(120);
const FAIR_ROUNDS: usize = 2;
/// (iii): the short and the long line.
const GROWTH: [usize; 2] = [10, 100];
/// (iii): the most a measure may grow from the short line to the long one and still count as flat.
const FLAT: f64 = 1.5;
/// A queue round that takes longer is stopped and reported incomplete.
const QUEUE_LIMIT: Duration = Duration::from_secs(90);
const RSS_RUNS: usize = 5;
/// Runs of `lockrun -- true` per Redis deployment for (f).
const DEPLOYED_RUNS: usize = 300;
/// (f)'s target: a deployment's run against a single node's.
const DEPLOYED_RATIO: f64 = 1.2;

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("stamp") => stamp(&args[1..]),
        Some("rss") => rss(&args[1..]),
        // `cargo bench` passes `--bench`; nothing else is expected.
        _ => benchmark(),
    }
}

/// A lockrun binary under test.
#[derive(Clone, Debug)]
struct Build {
    /// "default build" or "static opt-in build".
    label: &'static str,
    path: PathBuf,
}

/// The default build: this build's binary, or `LOCKRUN_BENCH_BIN` (another build of it).
fn default_build() -> Build {
    Build {
        label: "default build",
        path: std::env::var_os("LOCKRUN_BENCH_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_lockrun")),
            PathBuf::from,
        ),
    }
}

/// The static opt-in build: `LOCKRUN_BENCH_STATIC_BIN`, else built from this
/// source with the README's command, next to this build's own binaries.
fn static_build() -> Result<Build, String> {
    let path = match std::env::var_os("LOCKRUN_BENCH_STATIC_BIN") {
        Some(path) => PathBuf::from(path),
        None => build_static()?,
    };
    Ok(Build {
        label: "static opt-in build",
        path,
    })
}

fn build_static() -> Result<PathBuf, String> {
    let host = first_line("rustc", &["-vV"]);
    let host = Command::new("rustc")
        .arg("-vV")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .ok_or_else(|| format!("no host triple from rustc -vV ({host})"))?;
    // target/release/lockrun → target
    let own = PathBuf::from(env!("CARGO_BIN_EXE_lockrun"));
    let target_dir = own
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!(
        "building the static opt-in build: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target {host}"
    );
    let started = Instant::now();
    let output = Command::new(cargo)
        .args(["build", "--release", "--bin", "lockrun", "--target", &host])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run cargo: {err}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "the static build failed: {}",
            last.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    println!("built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(target_dir.join(host).join("release").join("lockrun"))
}

/// How one contender runs a command under the lock called `name`.
#[derive(Clone, Debug)]
enum Locker {
    Bare,
    Flock {
        dir: PathBuf,
    },
    Lockrun {
        build: Build,
        backend: &'static str,
        /// `--backend` and the store's own flag.
        flags: Vec<OsString>,
    },
}

impl Locker {
    fn label(&self) -> String {
        match self {
            Self::Bare => "bare".into(),
            Self::Flock { .. } => "flock(1)".into(),
            Self::Lockrun { backend, build, .. } if build.label == "default build" => {
                format!("lockrun {backend}")
            }
            Self::Lockrun { backend, build, .. } => format!("lockrun {backend} ({})", build.label),
        }
    }

    /// The same contender run by another build of lockrun.
    fn with_build(&self, other: &Build) -> Self {
        match self {
            Self::Lockrun { backend, flags, .. } => Self::Lockrun {
                build: other.clone(),
                backend,
                flags: flags.clone(),
            },
            other => other.clone(),
        }
    }

    fn command<S: AsRef<std::ffi::OsStr>>(&self, name: &str, argv: &[S]) -> Command {
        self.command_with_slots(name, 1, 0, argv)
    }

    /// `argv`, the `id`-th command of a round, under the lock `name` with
    /// `slots` slots. flock(1) has one slot per file: with more, the command
    /// is given file `id % slots` beforehand, so its waiter never looks for a
    /// free one (no line and no search: the least any slot handoff costs).
    fn command_with_slots<S: AsRef<std::ffi::OsStr>>(
        &self,
        name: &str,
        slots: u32,
        id: usize,
        argv: &[S],
    ) -> Command {
        let mut command = match self {
            Self::Bare => Command::new(&argv[0]),
            Self::Flock { dir } => {
                let slot = id % slots as usize;
                let mut command = Command::new("flock");
                command.arg(Self::flock_file(dir, name, slot)).arg(&argv[0]);
                command
            }
            Self::Lockrun { build, flags, .. } => {
                let mut command = Command::new(&build.path);
                command.args(flags);
                if slots > 1 {
                    command.args(["-p", &slots.to_string()]);
                }
                command.args(["--name", name, "--"]).arg(&argv[0]);
                command
            }
        };
        command.args(&argv[1..]);
        clean_environment(&mut command);
        command.stdin(Stdio::null()).stdout(Stdio::null());
        command
    }

    fn flock_file(dir: &Path, name: &str, slot: usize) -> PathBuf {
        dir.join(format!("{name}.{slot}.flock"))
    }

    /// The pids waiting in the line of `name`, in line order where the locker
    /// keeps one: lockrun's `status NAME --json`; for flock(1) the blocked
    /// requests on its files in /proc/locks. `None` when that cannot be read.
    fn waiting_pids(&self, name: &str) -> Option<Vec<u32>> {
        match self {
            Self::Bare => None,
            Self::Flock { dir } => {
                // Every slot's file that exists: a line of one file per slot has no order.
                let inodes: Vec<u64> = (0..SLOTS as usize)
                    .filter_map(|slot| fs::metadata(Self::flock_file(dir, name, slot)).ok())
                    .map(|meta| meta.ino())
                    .collect();
                let locks = fs::read_to_string("/proc/locks").ok()?;
                Some(
                    locks
                        .lines()
                        .filter_map(|line| {
                            // "2: -> FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
                            let fields: Vec<&str> = line.split_whitespace().collect();
                            if fields.get(1) != Some(&"->") || fields.get(2) != Some(&"FLOCK") {
                                return None;
                            }
                            let file_inode: u64 =
                                fields.get(6)?.rsplit(':').next()?.parse().ok()?;
                            inodes
                                .contains(&file_inode)
                                .then(|| fields.get(5)?.parse().ok())?
                        })
                        .collect(),
                )
            }
            Self::Lockrun { build, flags, .. } => {
                let mut command = Command::new(&build.path);
                command
                    .arg("status")
                    .args(flags)
                    .args([name, "--json"])
                    .stdin(Stdio::null())
                    .stderr(Stdio::null());
                clean_environment(&mut command);
                let output = command.output().ok()?;
                let entries: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
                let mut waiters: Vec<(u64, u32)> = entries
                    .as_array()?
                    .iter()
                    .filter(|entry| entry["state"] == "waiting")
                    .filter_map(|entry| {
                        Some((entry["position"].as_u64()?, entry["pid"].as_u64()? as u32))
                    })
                    .collect();
                waiters.sort_unstable();
                Some(waiters.into_iter().map(|(_, pid)| pid).collect())
            }
        }
    }
}

/// No `LOCKRUN_*` variable of the benchmark's own environment reaches a
/// contender, nor the directories cargo puts in front of `LD_LIBRARY_PATH` for
/// `cargo bench`: every dynamically linked program (flock(1), `true`, lockrun)
/// would look for each of its libraries in all of them first, about 0.3 ms per
/// run here, which no one running lockrun pays.
fn clean_environment(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKRUN_") {
            command.env_remove(key);
        }
    }
    match users_library_path() {
        Some(path) => command.env("LD_LIBRARY_PATH", path),
        None => command.env_remove("LD_LIBRARY_PATH"),
    };
}

/// `LD_LIBRARY_PATH` without the target directory's and the Rust toolchain's entries.
fn users_library_path() -> Option<&'static OsString> {
    static PATH: OnceLock<Option<OsString>> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var_os("LD_LIBRARY_PATH")?;
        let own = PathBuf::from(env!("CARGO_BIN_EXE_lockrun"));
        let target = own.parent().and_then(Path::parent)?.to_owned();
        let sysroot = PathBuf::from(first_line("rustc", &["--print", "sysroot"]));
        let kept: Vec<PathBuf> = std::env::split_paths(&path)
            .filter(|dir| !dir.starts_with(&target) && !dir.starts_with(&sysroot))
            .collect();
        (!kept.is_empty())
            .then(|| std::env::join_paths(kept).ok())
            .flatten()
    })
    .as_ref()
}

/// One result line: what was measured, the baseline beside it, and the target.
struct Outcome {
    what: String,
    measured: String,
    baseline: String,
    ratio: String,
    target: String,
    /// `None`: not measured (the reason is in `measured`), or no target.
    pass: Option<bool>,
}

impl Outcome {
    fn not_measured(what: String, target: &str, why: &str) -> Self {
        Self {
            what,
            measured: format!("not measured: {why}"),
            baseline: "-".into(),
            ratio: "-".into(),
            target: target.into(),
            pass: None,
        }
    }

    fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "-",
        }
    }
}

struct Bench {
    scratch: tempfile::TempDir,
    file: Locker,
    /// The file backend run by the static opt-in build, or why not.
    file_static: Result<Locker, String>,
    flock: Locker,
    /// Lease backends this build has, or why not.
    sqlite: Result<Locker, String>,
    redis: Result<Networked, String>,
    postgres: Result<Networked, String>,
    etcd: Result<Networked, String>,
    /// (c)'s flock(1) handoff gap: the baseline of (ii).
    flock_handoff: Option<Duration>,
    outcomes: Vec<Outcome>,
    notes: Vec<String>,
    /// Queue rounds run so far: each gets files of its own.
    rounds: usize,
}

fn benchmark() {
    if let Err(why) = Command::new("flock").arg("--version").output() {
        eprintln!("bench: flock(1) is needed as the baseline: {why}");
        std::process::exit(1);
    }
    let default = default_build();
    // (f) alone: `LOCKRUN_BENCH_ONLY=deployed scripts/bench` prints it and writes nothing.
    if std::env::var_os("LOCKRUN_BENCH_ONLY").is_some_and(|only| only == "deployed") {
        for outcome in deployed(&default) {
            println!(
                "{}: {} against {} ({}; target {}) {}",
                outcome.what,
                outcome.measured,
                outcome.baseline,
                outcome.ratio,
                outcome.target,
                outcome.verdict()
            );
        }
        return;
    }
    let statically = static_build();
    if let Err(why) = &statically {
        println!("static opt-in build: not measured: {why}");
    }
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let dir = |name: &str| {
        let dir = scratch.path().join(name);
        fs::create_dir_all(&dir).expect("a scratch subdirectory");
        dir
    };
    let lockrun = |backend: &'static str, flag: &str, value: OsString| Locker::Lockrun {
        build: default.clone(),
        backend,
        flags: vec!["--backend".into(), backend.into(), flag.into(), value],
    };
    let file = lockrun("file", "--dir", dir("file").into());
    let file_static = statically
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|build| available(file.with_build(build)));
    let flock = Locker::Flock { dir: dir("flock") };
    let sqlite = available(lockrun(
        "sqlite",
        "--db",
        dir("sqlite").join("locks.sqlite3").into(),
    ));
    let missing = |what: &str| format!("{what} is not installed or did not start");
    let redis = RedisServer::start(&[])
        .ok_or_else(|| missing("redis-server"))
        .and_then(|server| Server::Redis(server).locker(lockrun));
    #[cfg(feature = "postgres")]
    let postgres = PostgresServer::start()
        .ok_or_else(|| missing("PostgreSQL's server"))
        .and_then(|server| Server::Postgres(server).locker(lockrun));
    #[cfg(not(feature = "postgres"))]
    let postgres = Err("this build has no postgres backend".to_owned());
    // etcd's default timing and snapshots, not the tests' quicker elections and frequent snapshots.
    #[cfg(feature = "etcd")]
    let etcd = EtcdServer::start_with(
        None,
        &[
            "--heartbeat-interval",
            "100",
            "--election-timeout",
            "1000",
            "--snapshot-count",
            "100000",
        ],
    )
    .ok_or_else(|| missing("etcd"))
    .and_then(|server| Server::Etcd(server).locker(lockrun));
    #[cfg(not(feature = "etcd"))]
    let etcd = Err("this build has no etcd backend".to_owned());
    let mut bench = Bench {
        scratch,
        file,
        file_static,
        flock,
        sqlite,
        redis,
        postgres,
        etcd,
        flock_handoff: None,
        outcomes: Vec::new(),
        notes: Vec::new(),
        rounds: 0,
    };
    let machine = machine(&default, statically.as_ref().ok());
    println!("{machine}");
    let started = Instant::now();
    bench.single();
    bench.contention();
    bench.handoff();
    bench.handoff_with_slots();
    bench.fairness();
    bench.growth();
    bench.networked_against_file();
    bench.outcomes.extend(deployed(&default));
    bench.peak_rss();
    let took = started.elapsed();
    println!("\nbenchmark took {:.0} s", took.as_secs_f64());
    write_report(&machine, &bench, took);
}

/// (f) Redis as deployed: the wall time of `lockrun -- true` on a Sentinel
/// deployment (its primary asked of the Sentinels, then WAIT for its replica)
/// and on a three-primary Cluster, against a single node in the same
/// interleaved runs; and WAIT's own cost, on a single node with a replica.
fn deployed(build: &Build) -> Vec<Outcome> {
    let lockrun = |url: String, replicas: &str| Locker::Lockrun {
        build: build.clone(),
        backend: "redis",
        flags: [
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--redis-replicas",
            replicas,
        ]
        .map(OsString::from)
        .to_vec(),
    };
    let what = |label: &str| format!("(f) per-run wall time, redis {label}");
    let target = format!("≤ {DEPLOYED_RATIO:.1}× single node");
    let single = RedisServer::start(&[]);
    let sentinel = support::sentinel::SentinelDeployment::start(None);
    let cluster = RedisCluster::start();
    let (Some(single), Some(sentinel), Some(cluster)) = (single, sentinel, cluster) else {
        let why = "redis-server or redis-sentinel is not installed or did not start";
        return vec![Outcome::not_measured(what("as deployed"), &target, why)];
    };
    let with_replica = RedisServer::start(&[]).expect("a second redis-server");
    let port = with_replica.port().to_string();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]).expect("a replica");
    // WAIT counts a replica only once it is in sync.
    support::wait_until("the replica to be in sync", || {
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut replica.client())
            .is_ok_and(|info| info.contains("master_link_status:up"))
    });
    let contenders = [
        ("single node", lockrun(single.url(), "0")),
        (
            "single node + WAIT 1 (a replica)",
            lockrun(with_replica.url(), "1"),
        ),
        ("Sentinel, --redis-replicas 0", lockrun(sentinel.url(), "0")),
        ("Sentinel (default: WAIT 1)", lockrun(sentinel.url(), "1")),
        ("Cluster (3 primaries)", lockrun(cluster.url(1), "0")),
    ];
    let lockers: Vec<Locker> = contenders
        .iter()
        .map(|(_, locker)| locker.clone())
        .collect();
    let medians = interleaved_medians(&lockers, "deployed", DEPLOYED_RUNS);
    let baseline = medians[0];
    contenders
        .iter()
        .zip(&medians)
        .skip(1)
        .map(|((label, _), &measured)| Outcome {
            what: what(label),
            measured: ms(measured),
            baseline: ms(baseline),
            ratio: ratio_text(measured, baseline),
            target: target.clone(),
            pass: Some(measured.as_secs_f64() <= DEPLOYED_RATIO * baseline.as_secs_f64()),
        })
        .collect()
}

/// The locker, or why it cannot be measured (`lockrun --backend X -- true` fails).
fn available(locker: Locker) -> Result<Locker, String> {
    let output = locker
        .command("probe", &["true"])
        .stderr(Stdio::piped())
        .output()
        .map_err(|err| format!("cannot run lockrun: {err}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("backend unavailable: {}", stderr.trim()));
    }
    Ok(locker)
}

/// How the waiters of a queue round line up before the holders let go.
#[derive(Clone, Copy)]
enum Arrival {
    /// All at once, then this long to settle.
    Settle(Duration),
    /// All at once, until the line shows every one of them.
    AllInLine,
    /// One at a time, each once the one before it is in line, this far apart.
    Spaced(Duration),
}

/// What one queue round is.
struct Round<'a> {
    locker: &'a Locker,
    /// Slots; as many holders start the round, each holding until released.
    slots: u32,
    waiters: usize,
    arrival: Arrival,
}

/// A command's run under the lock, as its stamp logged it.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// `CLOCK_MONOTONIC` nanoseconds.
    start: i128,
    end: i128,
    /// Holders 0..slots, then waiters in the order they were started.
    id: usize,
    /// The waiting process's counters when its command started.
    at_start: Counters,
}

/// A process's work so far: wake-ups (voluntary context switches) and CPU time.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    wakeups: u64,
    cpu_ns: u64,
}

impl Counters {
    /// `/proc/PID/status` and `/proc/PID/schedstat`.
    fn of(pid: u32) -> Option<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let wakeups = status.lines().find_map(|line| {
            line.strip_prefix("voluntary_ctxt_switches:")?
                .trim()
                .parse()
                .ok()
        })?;
        let schedstat = fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
        Some(Self { wakeups, cpu_ns })
    }
}

/// What a queue round gave: every command's span and, with
/// [`Arrival::AllInLine`], each waiter's counters once all were in line.
struct Served {
    spans: Vec<Span>,
    in_line: BTreeMap<usize, Counters>,
    /// On a server: the work it had done once the waiters were in line.
    work_in_line: Option<u64>,
}

impl Served {
    /// The gaps between a slot's freeing and the next command's start: with
    /// `slots` slots the k-th start after the first `slots` fills the k-th end.
    fn gaps(&self, slots: u32) -> Vec<Duration> {
        let mut starts: Vec<i128> = self.spans.iter().map(|s| s.start).collect();
        let mut ends: Vec<i128> = self.spans.iter().map(|s| s.end).collect();
        starts.sort_unstable();
        ends.sort_unstable();
        starts
            .iter()
            .skip(slots as usize)
            .zip(&ends)
            .map(|(start, end)| Duration::from_nanos((start - end).max(0) as u64))
            .collect()
    }

    /// Pairs of waiters served out of their arrival order.
    fn inversions(&self, slots: u32) -> usize {
        let mut served: Vec<&Span> = self
            .spans
            .iter()
            .filter(|s| s.id >= slots as usize)
            .collect();
        served.sort_by_key(|s| s.start);
        let order: Vec<usize> = served.iter().map(|s| s.id).collect();
        let mut inversions = 0;
        for (i, earlier) in order.iter().enumerate() {
            inversions += order[i + 1..]
                .iter()
                .filter(|later| *later < earlier)
                .count();
        }
        inversions
    }

    /// Wake-ups and CPU time of the waiting processes from the moment all
    /// were in line until each one's command started, per acquisition.
    fn waiting_work(&self) -> Option<(f64, f64)> {
        let mut wakeups = 0;
        let mut cpu_ns = 0;
        let mut waiters = 0;
        for span in &self.spans {
            let Some(joined) = self.in_line.get(&span.id) else {
                continue;
            };
            wakeups += span.at_start.wakeups.checked_sub(joined.wakeups)?;
            cpu_ns += span.at_start.cpu_ns.checked_sub(joined.cpu_ns)?;
            waiters += 1;
        }
        (waiters > 0).then(|| {
            (
                wakeups as f64 / f64::from(waiters),
                cpu_ns as f64 / f64::from(waiters) / 1e6,
            )
        })
    }
}

impl Bench {
    /// (a) `lockrun --name x -- true` against `flock FILE true` and bare `true`, both builds.
    fn single(&mut self) {
        let mut lockers = vec![Locker::Bare, self.flock.clone(), self.file.clone()];
        lockers.extend(self.file_static.clone());
        let medians = interleaved_medians(&lockers, "x", SINGLE_RUNS);
        let (bare, flock) = (medians[0], medians[1]);
        println!(
            "\n(a) one run of `true`, median of {SINGLE_RUNS}: bare {}, flock(1) {}, lockrun {}{}",
            ms(bare),
            ms(flock),
            ms(medians[2]),
            medians
                .get(3)
                .map(|s| format!(", lockrun static {}", ms(*s)))
                .unwrap_or_default()
        );
        let what = |build: &str| {
            format!(
                "(a) wall time of `true` under the lock, {build} (bare `true`: {})",
                ms(bare)
            )
        };
        self.ratio(what("default build"), medians[2], flock, 1.15);
        match &self.file_static {
            Ok(_) => self.ratio(what("static opt-in build"), medians[3], flock, 1.10),
            Err(why) => self.outcomes.push(Outcome::not_measured(
                what("static opt-in build"),
                "≤ 1.10× flock(1)",
                &why.clone(),
            )),
        }
    }

    /// (b) 8 processes x 25 runs of `true` under one lock, both builds.
    fn contention(&mut self) {
        let mut lockers = vec![self.flock.clone(), self.file.clone()];
        lockers.extend(self.file_static.clone());
        let mut totals = vec![Vec::new(); lockers.len()];
        for _ in 0..CONTENTION_ROUNDS {
            for (locker, totals) in lockers.iter().zip(&mut totals) {
                let started = Instant::now();
                thread::scope(|scope| {
                    for _ in 0..CONTENDERS {
                        scope.spawn(|| {
                            for _ in 0..CONTENDED_RUNS {
                                run_ok(&mut locker.command("contended", &["true"]));
                            }
                        });
                    }
                });
                totals.push(started.elapsed());
            }
        }
        let totals: Vec<Duration> = totals.into_iter().map(median).collect();
        println!(
            "(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs, median of {CONTENTION_ROUNDS}: {}",
            lockers
                .iter()
                .zip(&totals)
                .map(|(locker, total)| format!("{} {}", locker.label(), ms(*total)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let what = |build: &str| {
            format!("(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs of `true`, total, {build}")
        };
        self.ratio(what("default build"), totals[1], totals[0], 1.20);
        match &self.file_static {
            Ok(_) => self.ratio(what("static opt-in build"), totals[2], totals[0], 1.20),
            Err(why) => self.outcomes.push(Outcome::not_measured(
                what("static opt-in build"),
                "≤ 1.20× flock(1)",
                &why.clone(),
            )),
        }
    }

    /// (c) handoff gap in a queue of 12 waiters, per backend, against flock(1).
    /// Rounds are interleaved across contenders, so load from elsewhere falls on all alike.
    fn handoff(&mut self) {
        let contenders: Vec<(&str, Result<Locker, String>, Target)> = vec![
            ("flock(1)", Ok(self.flock.clone()), Target::None),
            ("file", Ok(self.file.clone()), Target::Ratio(1.3)),
            (
                "sqlite",
                self.sqlite.clone(),
                Target::Absolute(Duration::from_millis(50)),
            ),
            ("redis", locker(&self.redis), Target::Ratio(2.0)),
            ("postgres", locker(&self.postgres), Target::Ratio(2.0)),
            ("etcd", locker(&self.etcd), Target::Ratio(3.0)),
        ];
        let summaries = self.queue_gaps(&contenders, 1, Arrival::Settle(QUEUE_SETTLE));
        let Ok(flock) = summaries[0] else {
            self.note("flock(1): no handoff baseline".into());
            return;
        };
        println!(
            "(c) handoff gap, flock(1): median {}, max {}",
            ms(flock.median),
            ms(flock.max)
        );
        self.flock_handoff = Some(flock.median);
        for ((backend, _, target), summary) in contenders.iter().zip(&summaries).skip(1) {
            let what =
                format!("(c) handoff gap, {backend}, median of {QUEUE_ROUNDS}x{QUEUE} handoffs");
            self.gap_outcome(what, backend, summary, &flock, target);
        }
    }

    /// (ii) the handoff gap with `-p 4`: four holders let go at once, then 12
    /// waiters hand four slots on, against flock(1)'s single-slot handoff.
    /// flock(1) with a file per slot runs in the same rounds: what four slots
    /// cost on this machine (two cores start four commands at once) when
    /// nothing keeps a line.
    fn handoff_with_slots(&mut self) {
        let contenders: Vec<(&str, Result<Locker, String>, Target)> = vec![
            ("flock(1)", Ok(self.flock.clone()), Target::None),
            ("file", Ok(self.file.clone()), Target::Ratio(1.3)),
            ("sqlite", self.sqlite.clone(), Target::Ratio(2.5)),
            ("redis", locker(&self.redis), Target::Ratio(1.5)),
            ("postgres", locker(&self.postgres), Target::Ratio(2.0)),
            ("etcd", locker(&self.etcd), Target::Ratio(3.0)),
        ];
        let summaries = self.queue_gaps(&contenders, SLOTS, Arrival::AllInLine);
        let Some(flock) = self.flock_handoff else {
            return;
        };
        let flock = Gaps {
            median: flock,
            max: flock,
        };
        let four_files = summaries[0].as_ref().ok().map(|gaps| gaps.median);
        if let Some(four_files) = four_files {
            self.outcomes.push(Outcome {
                what: format!(
                    "(ii) handoff gap, flock(1) with {SLOTS} slot files, each command given one beforehand, median of {QUEUE_ROUNDS}x{QUEUE} handoffs, against flock(1)'s single slot"
                ),
                measured: ms(four_files),
                baseline: ms(flock.median),
                ratio: ratio_text(four_files, flock.median),
                target: "- (reference)".into(),
                pass: None,
            });
        }
        for ((backend, _, target), summary) in contenders.iter().zip(&summaries).skip(1) {
            let against_files = match (four_files, summary) {
                (Some(files), Ok(gaps)) => {
                    format!(
                        " ({} flock(1)'s {SLOTS} files)",
                        ratio_text(gaps.median, files)
                    )
                }
                _ => String::new(),
            };
            let what = format!(
                "(ii) handoff gap with -p {SLOTS}, {backend}, median of {QUEUE_ROUNDS}x{QUEUE} handoffs, against flock(1)'s single slot{against_files}"
            );
            self.gap_outcome(what, backend, summary, &flock, target);
        }
    }

    /// Queue rounds of every contender, interleaved, and their gaps; an error
    /// once a round did not finish or the backend is missing.
    fn queue_gaps(
        &mut self,
        contenders: &[(&str, Result<Locker, String>, Target)],
        slots: u32,
        arrival: Arrival,
    ) -> Vec<Result<Gaps, String>> {
        let mut gaps: Vec<Result<Vec<Duration>, String>> = contenders
            .iter()
            .map(|(_, locker, _)| locker.as_ref().map(|_| Vec::new()).map_err(Clone::clone))
            .collect();
        for _ in 0..QUEUE_ROUNDS {
            for ((_, locker, _), gaps) in contenders.iter().zip(&mut gaps) {
                let (Ok(locker), Ok(collected)) = (locker, gaps.as_mut()) else {
                    continue;
                };
                let round = Round {
                    locker,
                    slots,
                    waiters: QUEUE,
                    arrival,
                };
                match self.queue_round(&round) {
                    Some(served) => collected.extend(served.gaps(slots)),
                    None => *gaps = Err("the queue did not finish".into()),
                }
            }
        }
        gaps.into_iter().map(|g| g.map(Gaps::of)).collect()
    }

    fn gap_outcome(
        &mut self,
        what: String,
        backend: &str,
        summary: &Result<Gaps, String>,
        flock: &Gaps,
        target: &Target,
    ) {
        let gaps = match summary {
            Ok(gaps) => gaps,
            Err(why) => {
                println!("{what}: not measured: {why}");
                self.outcomes
                    .push(Outcome::not_measured(what, &target.text(), why));
                return;
            }
        };
        println!(
            "{what}: lockrun {backend}: median {}, max {}",
            ms(gaps.median),
            ms(gaps.max)
        );
        let what = format!(
            "{what} (max {}, flock(1) max {})",
            ms(gaps.max),
            ms(flock.max)
        );
        match target {
            Target::Ratio(limit) => self.ratio(what, gaps.median, flock.median, *limit),
            Target::Absolute(limit) => self.outcomes.push(Outcome {
                what,
                measured: ms(gaps.median),
                baseline: ms(flock.median),
                ratio: ratio_text(gaps.median, flock.median),
                target: target.text(),
                pass: Some(gaps.median <= *limit),
            }),
            Target::None => {}
        }
    }

    /// (i) first come, first served: one holder, then waiters arriving one at a
    /// time, each once the one before it is in line; pairs served out of their
    /// arrival order, per backend and for flock(1).
    fn fairness(&mut self) {
        let contenders: Vec<(&str, Result<Locker, String>)> = vec![
            ("flock(1)", Ok(self.flock.clone())),
            ("file", Ok(self.file.clone())),
            ("sqlite", self.sqlite.clone()),
            ("redis", locker(&self.redis)),
            ("postgres", locker(&self.postgres)),
            ("etcd", locker(&self.etcd)),
        ];
        let mut counts: Vec<Result<Vec<usize>, String>> = contenders
            .iter()
            .map(|(_, locker)| locker.as_ref().map(|_| Vec::new()).map_err(Clone::clone))
            .collect();
        for _ in 0..FAIR_ROUNDS {
            for ((_, locker), counts) in contenders.iter().zip(&mut counts) {
                let (Ok(locker), Ok(collected)) = (locker, counts.as_mut()) else {
                    continue;
                };
                let round = Round {
                    locker,
                    slots: 1,
                    waiters: FAIR_WAITERS,
                    arrival: Arrival::Spaced(FAIR_SPACING),
                };
                match self.queue_round(&round) {
                    Some(served) => collected.push(served.inversions(1)),
                    None => *counts = Err("a round did not finish".into()),
                }
            }
        }
        let pairs = FAIR_WAITERS * (FAIR_WAITERS - 1) / 2 * FAIR_ROUNDS;
        let text = |counts: &[usize]| {
            format!(
                "{} of {pairs} pairs (rounds: {})",
                counts.iter().sum::<usize>(),
                counts
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let flock = match &counts[0] {
            Ok(counts) => text(counts),
            Err(why) => format!("not measured: {why}"),
        };
        println!("(i) inversions, flock(1): {flock}");
        for ((backend, _), counts) in contenders.iter().zip(&counts).skip(1) {
            let what = format!(
                "(i) fairness, {backend}: waiters served out of arrival order, {FAIR_ROUNDS} rounds of {FAIR_WAITERS} arriving {} ms apart",
                FAIR_SPACING.as_millis()
            );
            let target = "0 (first come, first served)";
            match counts {
                Ok(counts) => {
                    println!("(i) inversions, lockrun {backend}: {}", text(counts));
                    self.outcomes.push(Outcome {
                        what,
                        measured: text(counts),
                        baseline: format!("{flock} (flock(1))"),
                        ratio: "-".into(),
                        target: target.into(),
                        pass: Some(counts.iter().all(|n| *n == 0)),
                    });
                }
                Err(why) => self.outcomes.push(Outcome::not_measured(what, target, why)),
            }
        }
    }

    /// (iii) a line of 10 waiters against one of 100: the handoff gap and the
    /// waiting processes' work per acquisition (wake-ups, CPU time; on a
    /// server: its work) should not grow with the line.
    fn growth(&mut self) {
        let contenders: Vec<(&str, Result<Locker, String>)> = vec![
            ("flock(1)", Ok(self.flock.clone())),
            ("file", Ok(self.file.clone())),
            ("sqlite", self.sqlite.clone()),
            ("redis", locker(&self.redis)),
            ("postgres", locker(&self.postgres)),
            ("etcd", locker(&self.etcd)),
        ];
        let mut lines: Vec<Result<Vec<Line>, String>> = contenders
            .iter()
            .map(|(_, locker)| locker.as_ref().map(|_| Vec::new()).map_err(Clone::clone))
            .collect();
        for waiters in GROWTH {
            for ((backend, locker), lines) in contenders.iter().zip(&mut lines) {
                let (Ok(locker), Ok(collected)) = (locker, lines.as_mut()) else {
                    continue;
                };
                // One at a time, each once the one before is in line: a hundred
                // SQLite waiters joining at once would keep the database busy
                // past the 2 s a newcomer waits for it (exit 69).
                let round = Round {
                    locker,
                    slots: 1,
                    waiters,
                    arrival: Arrival::Spaced(Duration::ZERO),
                };
                let served = self.queue_round(&round);
                let after = self.server_work(locker);
                let line = served.and_then(|served| {
                    let (wakeups, cpu_ms) = served.waiting_work()?;
                    let work = match (served.work_in_line, after) {
                        (Some(before), Some(after)) => {
                            Some((after - before) as f64 / waiters as f64)
                        }
                        _ => None,
                    };
                    Some(Line {
                        gap: median(served.gaps(1)),
                        wakeups,
                        cpu_ms,
                        work,
                    })
                });
                match line {
                    Some(line) => {
                        println!(
                            "(iii) {waiters} waiters, {backend}: gap {}, per acquisition {:.1} wake-ups, {:.3} ms CPU{}",
                            ms(line.gap),
                            line.wakeups,
                            line.cpu_ms,
                            line.work
                                .map(|work| format!(", {work:.1} {}", work_unit(backend)))
                                .unwrap_or_default()
                        );
                        collected.push(line);
                    }
                    None => *lines = Err(format!("the line of {waiters} did not finish")),
                }
            }
        }
        self.growth_outcomes(&contenders, &lines);
    }

    /// (iii)'s result lines: per backend, each measure at the short and the long line.
    fn growth_outcomes(
        &mut self,
        contenders: &[(&str, Result<Locker, String>)],
        lines: &[Result<Vec<Line>, String>],
    ) {
        let flock = lines[0].as_ref().ok().map(|lines| (lines[0], lines[1]));
        let [short, long] = GROWTH;
        for ((backend, _), lines) in contenders.iter().zip(lines).skip(1) {
            let what =
                |measure: &str| format!("(iii) {short} → {long} waiters, {backend}: {measure}");
            let target = format!("≤ {FLAT:.2}× (flat)");
            let lines = match lines {
                Ok(lines) => (lines[0], lines[1]),
                Err(why) => {
                    self.outcomes.push(Outcome::not_measured(
                        what("handoff gap and work per acquisition"),
                        &target,
                        why,
                    ));
                    continue;
                }
            };
            let flock_text = |f: fn(&Line) -> String| {
                flock.map_or_else(String::new, |(a, b)| {
                    format!(" (flock(1): {} → {})", f(&a), f(&b))
                })
            };
            self.growth_outcome(
                what(&format!("median handoff gap{}", flock_text(|l| ms(l.gap)))),
                lines.0.gap.as_secs_f64() * 1000.0,
                lines.1.gap.as_secs_f64() * 1000.0,
                "ms",
            );
            self.growth_outcome(
                what(&format!(
                    "wake-ups of the waiting processes per acquisition{}",
                    flock_text(|l| format!("{:.1}", l.wakeups))
                )),
                lines.0.wakeups,
                lines.1.wakeups,
                "",
            );
            self.growth_outcome(
                what(&format!(
                    "CPU time of the waiting processes per acquisition{}",
                    flock_text(|l| format!("{:.3} ms", l.cpu_ms))
                )),
                lines.0.cpu_ms,
                lines.1.cpu_ms,
                "ms",
            );
            if let (Some(a), Some(b)) = (lines.0.work, lines.1.work) {
                self.growth_outcome(
                    what(&format!("{} per acquisition", work_unit(backend))),
                    a,
                    b,
                    "",
                );
            }
        }
    }

    fn growth_outcome(&mut self, what: String, short: f64, long: f64, unit: &str) {
        let number = |value: f64| {
            if unit.is_empty() {
                format!("{value:.1}")
            } else {
                format!("{value:.3} {unit}")
            }
        };
        let ratio = long / short.max(f64::MIN_POSITIVE);
        self.outcomes.push(Outcome {
            what,
            measured: format!("{} ({} waiters)", number(long), GROWTH[1]),
            baseline: format!("{} ({} waiters)", number(short), GROWTH[0]),
            ratio: format!("{ratio:.2}×"),
            target: format!("≤ {FLAT:.2}× (flat)"),
            pass: Some(ratio <= FLAT),
        });
    }

    /// The work the server of `locker`'s backend has done so far (see [`Server::work`]).
    fn server_work(&self, locker: &Locker) -> Option<u64> {
        let Locker::Lockrun { backend, .. } = locker else {
            return None;
        };
        let networked = match *backend {
            "redis" => &self.redis,
            "postgres" => &self.postgres,
            "etcd" => &self.etcd,
            _ => return None,
        };
        Some(networked.as_ref().ok()?.server.work().values().sum())
    }

    /// One queue round: `slots` holders that hold until released, then the
    /// waiters, each holding `QUEUE_HOLD`; `None` when it did not finish.
    fn queue_round(&mut self, round: &Round) -> Option<Served> {
        self.rounds += 1;
        let locker = round.locker;
        let stamper = std::env::current_exe().expect("the benchmark's own path");
        let base = self.scratch.path().join(format!("round-{}", self.rounds));
        let log = base.with_extension("log");
        let release = base.with_extension("release");
        let name = format!("queue-{}", self.rounds);
        let hold_ms = QUEUE_HOLD.as_millis().to_string();
        let stamp = |id: usize, mode: &str, value: &std::ffi::OsStr| {
            let id_text = id.to_string();
            let argv = [
                stamper.as_os_str(),
                "stamp".as_ref(),
                log.as_os_str(),
                id_text.as_ref(),
                mode.as_ref(),
                value,
            ];
            locker
                .command_with_slots(&name, round.slots, id, &argv)
                .spawn()
                .expect("spawn a queued command")
        };
        let holders = round.slots as usize;
        let mut children: Vec<Child> = (0..holders)
            .map(|id| stamp(id, "until", release.as_os_str()))
            .collect();
        let held = |id: usize| release.with_extension(format!("held.{id}"));
        if !(0..holders).all(|id| await_path(&held(id), QUEUE_LIMIT)) {
            self.note(format!(
                "{}: the holders never got the lock",
                locker.label()
            ));
            stop_all(&mut children);
            return None;
        }
        let mut in_line = BTreeMap::new();
        let lined_up = line_up(round, &name, &mut children, &mut in_line, |id| {
            stamp(id, "hold", hold_ms.as_ref())
        });
        let work_in_line = self.server_work(locker);
        if !lined_up {
            self.note(format!(
                "{}: the waiters did not line up within {} s",
                locker.label(),
                QUEUE_LIMIT.as_secs()
            ));
            stop_all(&mut children);
            return None;
        }
        fs::write(&release, "").expect("write the release marker");
        let deadline = Instant::now() + QUEUE_LIMIT;
        let statuses: Vec<Option<ExitStatus>> = children
            .iter_mut()
            .map(|child| wait_until(child, deadline))
            .collect();
        if statuses.iter().any(|s| !s.is_some_and(|s| s.success())) {
            self.note(format!(
                "{}: a queue round did not finish within {} s ({statuses:?})",
                locker.label(),
                QUEUE_LIMIT.as_secs()
            ));
            stop_all(&mut children);
            return None;
        }
        let spans: Vec<Span> = fs::read_to_string(&log)
            .expect("the stamp log")
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let [start, end, id, wakeups, cpu_ns] = fields[..] else {
                    return None;
                };
                Some(Span {
                    start: start.parse().ok()?,
                    end: end.parse().ok()?,
                    id: id.parse().ok()?,
                    at_start: Counters {
                        wakeups: wakeups.parse().ok()?,
                        cpu_ns: cpu_ns.parse().ok()?,
                    },
                })
            })
            .collect();
        let served = Served {
            spans,
            in_line,
            work_in_line,
        };
        self.check_overlap(locker, &served, round.slots);
        Some(served)
    }

    /// Notes when more commands ran at once than there are slots.
    fn check_overlap(&mut self, locker: &Locker, served: &Served, slots: u32) {
        let mut events: Vec<(i128, i64)> = served
            .spans
            .iter()
            .flat_map(|s| [(s.start, 1), (s.end, -1)])
            .collect();
        // An end and a start at the same instant: the end first.
        events.sort_unstable();
        let mut running = 0;
        for (_, change) in events {
            running += change;
            if running > i64::from(slots) {
                self.note(format!(
                    "{}: {running} commands ran at once with {slots} slot(s)",
                    locker.label()
                ));
                return;
            }
        }
    }

    /// (d) each networked backend's wall time against the file backend's, and
    /// its server's work per run. PostgreSQL also counts its round trips per run,
    /// through a counting proxy (tests/support), in runs of their own.
    fn networked_against_file(&mut self) {
        for (backend, limit) in [
            ("redis", Some(1.30)),
            ("postgres", Some(1.50)),
            ("etcd", None),
        ] {
            let what = format!("(d) {backend} backend wall time against the file backend");
            let target =
                limit.map_or_else(|| "-".to_owned(), |limit| format!("≤ {limit:.2}× file"));
            let served = match backend {
                "redis" => &self.redis,
                "postgres" => &self.postgres,
                _ => &self.etcd,
            };
            let served = match served {
                Ok(served) => served,
                Err(why) => {
                    println!("(d) {backend}: not measured: {why}");
                    let why = why.clone();
                    self.outcomes
                        .push(Outcome::not_measured(what, &target, &why));
                    continue;
                }
            };
            let before = served.server.work();
            let medians = interleaved_medians(
                &[self.file.clone(), served.locker.clone()],
                "d",
                SINGLE_RUNS,
            );
            let after = served.server.work();
            let [file, measured] = medians[..] else {
                unreachable!()
            };
            let per_run: Vec<String> = after
                .iter()
                .filter_map(|(kind, count)| {
                    let delta = count - before.get(kind).copied().unwrap_or(0);
                    // Runs include the warm-up, hence the division by the runs actually made.
                    (delta > 0).then(|| {
                        format!("{kind} {:.2}", delta as f64 / (SINGLE_RUNS + WARMUP) as f64)
                    })
                })
                .collect();
            let mut work = format!(
                "{} per run: {}",
                work_unit(backend),
                if per_run.is_empty() {
                    "none".to_owned()
                } else {
                    per_run.join(", ")
                }
            );
            if let Some(trips) = round_trips(served) {
                let _ = write!(
                    work,
                    "; round trips per run, connecting included: {trips:.1}"
                );
            }
            println!(
                "(d) median of {SINGLE_RUNS}: file {}, {backend} {}; {work}",
                ms(file),
                ms(measured)
            );
            let ratio = measured.as_secs_f64() / file.as_secs_f64();
            self.outcomes.push(Outcome {
                what: format!("{what} ({work})"),
                measured: ms(measured),
                baseline: format!("{} (file)", ms(file)),
                ratio: format!("{ratio:.2}×"),
                target,
                pass: limit.map(|limit| ratio <= limit),
            });
        }
    }

    /// (e) peak RSS of lockrun (and of flock(1) beside it), the largest of a few runs.
    fn peak_rss(&mut self) {
        let flock = max_rss(&self.flock);
        let lockers = vec![
            ("file", Ok(self.file.clone())),
            ("sqlite", self.sqlite.clone()),
            ("redis", locker(&self.redis)),
            ("postgres", locker(&self.postgres)),
            ("etcd", locker(&self.etcd)),
        ];
        for (backend, locker) in lockers {
            let what = format!("(e) peak RSS, {backend}, largest of {RSS_RUNS} runs");
            let target = "≤ 8 MiB";
            match locker {
                Ok(locker) => {
                    let rss = max_rss(&locker);
                    println!("(e) peak RSS, lockrun {backend}: {rss} KiB (flock(1): {flock} KiB)");
                    self.outcomes.push(Outcome {
                        what,
                        measured: mib(rss),
                        baseline: mib(flock),
                        ratio: format!("{:.2}×", rss as f64 / flock as f64),
                        target: target.into(),
                        pass: Some(rss <= 8 * 1024),
                    });
                }
                Err(why) => {
                    println!("(e) {backend}: not measured: {why}");
                    self.outcomes
                        .push(Outcome::not_measured(what, target, &why));
                }
            }
        }
    }

    fn ratio(&mut self, what: String, measured: Duration, baseline: Duration, limit: f64) {
        self.outcomes.push(Outcome {
            what,
            measured: ms(measured),
            baseline: ms(baseline),
            ratio: ratio_text(measured, baseline),
            target: format!("≤ {limit:.2}× flock(1)"),
            pass: Some(measured.as_secs_f64() <= limit * baseline.as_secs_f64()),
        });
    }

    fn note(&mut self, note: String) {
        println!("note: {note}");
        self.notes.push(note);
    }
}

/// (iii): one line's figures.
#[derive(Clone, Copy)]
struct Line {
    gap: Duration,
    /// Per acquisition, of the waiting processes, from all in line to their command's start.
    wakeups: f64,
    cpu_ms: f64,
    /// The server's work per acquisition, over the whole round.
    work: Option<f64>,
}

/// Starts the waiters of `round` (`stamp(id)` starts one) and waits until they
/// are in line as its arrival says; with [`Arrival::AllInLine`], records each
/// one's counters then. False when they did not line up in time.
fn line_up(
    round: &Round,
    name: &str,
    children: &mut Vec<Child>,
    in_line: &mut BTreeMap<usize, Counters>,
    stamp: impl Fn(usize) -> Child,
) -> bool {
    let holders = round.slots as usize;
    let locker = round.locker;
    let lined_up = match round.arrival {
        Arrival::Settle(settle) => {
            children.extend((0..round.waiters).map(|i| stamp(holders + i)));
            thread::sleep(settle);
            return true;
        }
        Arrival::AllInLine => {
            for i in 0..round.waiters {
                children.push(stamp(holders + i));
                // A moment between starts: lockruns started all at once would only queue for the CPU.
                thread::sleep(Duration::from_millis(2));
            }
            await_line(locker, name, |pids| pids.len() == round.waiters)
        }
        Arrival::Spaced(spacing) => (0..round.waiters).all(|i| {
            let started = Instant::now();
            let child = stamp(holders + i);
            let pid = child.id();
            children.push(child);
            let joined = await_line(locker, name, |pids| {
                pids.len() == i + 1 && pids.contains(&pid)
            });
            thread::sleep(spacing.saturating_sub(started.elapsed()));
            joined
        }),
    };
    if lined_up {
        for (i, child) in children[holders..].iter().enumerate() {
            if let Some(counters) = Counters::of(child.id()) {
                in_line.insert(holders + i, counters);
            }
        }
    }
    lined_up
}

/// Waits until the pids waiting in `name`'s line satisfy `done`; false when they did not in time.
fn await_line(locker: &Locker, name: &str, done: impl Fn(&[u32]) -> bool) -> bool {
    let deadline = Instant::now() + QUEUE_LIMIT;
    loop {
        if locker.waiting_pids(name).is_some_and(|pids| done(&pids)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

enum Target {
    Ratio(f64),
    Absolute(Duration),
    /// The baseline itself.
    None,
}

impl Target {
    fn text(&self) -> String {
        match self {
            Self::Ratio(limit) => format!("≤ {limit:.2}× flock(1)"),
            Self::Absolute(limit) => format!("≤ {}", ms(*limit)),
            Self::None => "-".into(),
        }
    }
}

#[derive(Clone, Copy)]
struct Gaps {
    median: Duration,
    max: Duration,
}

impl Gaps {
    fn of(gaps: Vec<Duration>) -> Self {
        let max = gaps.iter().copied().max().unwrap_or_default();
        Self {
            median: median(gaps),
            max,
        }
    }
}

const WARMUP: usize = 20;

/// Median wall time of `true` under each locker, runs interleaved so that load
/// from elsewhere on the machine falls on every contender alike.
fn interleaved_medians(lockers: &[Locker], name: &str, runs: usize) -> Vec<Duration> {
    let mut samples = vec![Vec::with_capacity(runs); lockers.len()];
    for round in 0..WARMUP + runs {
        for (locker, samples) in lockers.iter().zip(&mut samples) {
            let mut command = locker.command(name, &["true"]);
            let started = Instant::now();
            run_ok(&mut command);
            if round >= WARMUP {
                samples.push(started.elapsed());
            }
        }
    }
    samples.into_iter().map(median).collect()
}

fn run_ok(command: &mut Command) {
    let status = command.status().expect("spawn a benchmarked command");
    assert!(status.success(), "{command:?} failed: {status}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

fn ratio_text(measured: Duration, baseline: Duration) -> String {
    format!("{:.2}×", measured.as_secs_f64() / baseline.as_secs_f64())
}

fn await_path(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

fn stop_all(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Peak RSS in KiB of `locker` running `true`, the largest over `RSS_RUNS` runs.
fn max_rss(locker: &Locker) -> u64 {
    let own = std::env::current_exe().expect("the benchmark's own path");
    (0..RSS_RUNS)
        .map(|_| {
            let command = locker.command("rss", &["true"]);
            let output = Command::new(&own)
                .arg("rss")
                .arg(command.get_program())
                .args(command.get_args())
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .expect("run the RSS wrapper");
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse()
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// `compare rss PROGRAM ARGS...`: runs the program and prints the peak RSS (KiB)
/// of it and every descendant it waited for (`getrusage(RUSAGE_CHILDREN)`).
fn rss(argv: &[OsString]) {
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .status()
        .expect("spawn the measured program");
    assert!(status.success(), "{argv:?} failed: {status}");
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    println!("{}", usage.max_rss());
}

/// `compare stamp LOG ID hold MS` or `compare stamp LOG ID until FILE`: the
/// command the queue benchmarks run under the lock. It appends one line to LOG,
/// in one write: `START END ID WAKEUPS CPU_NS`, START as it begins and END just
/// before it exits (`CLOCK_MONOTONIC` nanoseconds), then the voluntary context
/// switches and CPU time of its parent (the lockrun or flock(1) that waited for
/// the lock) as it began. `until FILE` first creates FILE.held.ID, then holds
/// until FILE exists.
fn stamp(args: &[OsString]) {
    let start = monotonic_nanos();
    let parent = Counters::of(std::os::unix::process::parent_id()).unwrap_or_default();
    let [log, id, mode, value] = args else {
        panic!("usage: stamp LOG ID hold MS | stamp LOG ID until FILE");
    };
    let id = id.to_string_lossy();
    if mode == "hold" {
        let millis = value
            .to_str()
            .and_then(|v| v.parse().ok())
            .expect("hold MS");
        thread::sleep(Duration::from_millis(millis));
    } else {
        let release = PathBuf::from(value);
        fs::write(release.with_extension(format!("held.{id}")), "").expect("write the held marker");
        while !release.exists() {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let line = format!(
        "{start} {} {id} {} {}\n",
        monotonic_nanos(),
        parent.wakeups,
        parent.cpu_ns
    );
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .expect("append to the stamp log");
}

fn monotonic_nanos() -> i128 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec())
}

/// A server of the benchmark's own, started by the tests' harness (tests/support):
/// free loopback ports, data in temporary directories, cleaned up on drop.
enum Server {
    Redis(RedisServer),
    #[cfg(feature = "postgres")]
    Postgres(PostgresServer),
    #[cfg(feature = "etcd")]
    Etcd(EtcdServer),
}

impl Server {
    /// A lockrun on this server, if it answers.
    fn locker(
        self,
        lockrun: impl Fn(&'static str, &str, OsString) -> Locker,
    ) -> Result<Networked, String> {
        let locker = match &self {
            Self::Redis(server) => lockrun("redis", "--redis-url", server.url().into()),
            #[cfg(feature = "postgres")]
            Self::Postgres(server) => lockrun("postgres", "--postgres-url", server.url().into()),
            #[cfg(feature = "etcd")]
            Self::Etcd(server) => lockrun("etcd", "--etcd-endpoints", server.url().into()),
        };
        Ok(Networked {
            locker: available(locker)?,
            server: self,
        })
    }

    /// The work the server has done so far, by kind: Redis's commands, etcd's
    /// calls (gRPC, from its metrics), PostgreSQL's transactions (counted when a
    /// session ends: lockrun's have ended when this is read); see tests/support.
    fn work(&self) -> BTreeMap<String, u64> {
        match self {
            Self::Redis(server) => server.command_calls(),
            #[cfg(feature = "postgres")]
            Self::Postgres(server) => {
                BTreeMap::from([("transactions".to_owned(), server.transactions())])
            }
            #[cfg(feature = "etcd")]
            Self::Etcd(server) => server.calls(),
        }
    }
}

/// What [`Server::work`] counts on `backend`'s server.
fn work_unit(backend: &str) -> &'static str {
    match backend {
        "redis" => "Redis commands (INFO commandstats, scripts' own included)",
        // Counted when a session reports them: at its end, or at most once a second.
        "postgres" => "PostgreSQL transactions",
        "etcd" => "etcd calls",
        _ => "",
    }
}

/// The lockrun of a networked backend, or why there is none.
fn locker(networked: &Result<Networked, String>) -> Result<Locker, String> {
    networked
        .as_ref()
        .map(|networked| networked.locker.clone())
        .map_err(Clone::clone)
}

/// PostgreSQL's round trips per uncontended run, counted by a proxy in front
/// of the server (without TLS, which the proxy cannot read); `None` elsewhere.
fn round_trips(served: &Networked) -> Option<f64> {
    #[cfg(feature = "postgres")]
    if let Server::Postgres(server) = &served.server {
        const RUNS: usize = 20;
        let proxy = support::postgres::Proxy::start(server, true);
        let Locker::Lockrun { build, .. } = &served.locker else {
            return None;
        };
        let through = Locker::Lockrun {
            build: build.clone(),
            backend: "postgres",
            flags: vec![
                "--backend".into(),
                "postgres".into(),
                "--postgres-url".into(),
                proxy.url().into(),
            ],
        };
        for _ in 0..RUNS {
            let status = through.command("probe", &["true"]).status().ok()?;
            status.success().then_some(())?;
        }
        return Some(proxy.turns() as f64 / RUNS as f64);
    }
    let _ = served;
    None
}

/// A networked backend's lockrun and the server it runs on.
struct Networked {
    locker: Locker,
    server: Server,
}

/// What the numbers were measured on.
fn machine(default: &Build, statically: Option<&Build>) -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let memory = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or_else(
            || "?".into(),
            |kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0),
        );
    let os = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
        })
        .unwrap_or_else(|| "unknown OS".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let mut text = String::new();
    let _ = writeln!(text, "- Date: {}", lockrun::timestamp::now_rfc3339());
    let _ = writeln!(text, "- CPU: {cpu}, {cores} logical cores; memory {memory}");
    let _ = writeln!(text, "- OS: {os}, Linux {}", kernel.trim());
    let _ = writeln!(text, "- Load average at start: {}", load.join(" "));
    let _ = writeln!(
        text,
        "- lockrun: {} ({})",
        first_line(&default.path, &["--version"]),
        first_line("git", &["describe", "--always", "--dirty"]),
    );
    for build in std::iter::once(default).chain(statically) {
        let _ = writeln!(
            text,
            "  - {}: `{}`, {}",
            build.label,
            build.path.display(),
            linking(&build.path)
        );
    }
    let _ = writeln!(text, "- flock(1): {}", first_line("flock", &["--version"]));
    let _ = writeln!(
        text,
        "- redis-server: {}",
        first_line("redis-server", &["--version"])
    );
    let _ = writeln!(text, "- etcd: {}", first_line("etcd", &["--version"]));
    let _ = write!(text, "- rustc: {}", first_line("rustc", &["--version"]));
    text
}

/// How a binary is linked, and the shared libraries it loads.
fn linking(binary: &Path) -> String {
    let kind = first_line("file", &["-b".as_ref(), binary.as_os_str()]);
    let kind = kind
        .split(", ")
        .filter(|part| part.contains("link"))
        .collect::<Vec<_>>()
        .join(", ");
    let libraries: Vec<String> = Command::new("ldd")
        .arg(binary)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|line| line.split_whitespace().next())
                .filter(|library| !library.starts_with("linux-vdso"))
                .map(|library| library.rsplit('/').next().unwrap_or(library).to_owned())
                .collect()
        })
        .unwrap_or_default();
    if libraries.is_empty() {
        kind
    } else {
        format!("{kind} ({})", libraries.join(", "))
    }
}

fn first_line<P: AsRef<std::ffi::OsStr>, A: AsRef<std::ffi::OsStr>>(
    program: P,
    args: &[A],
) -> String {
    Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "not available".into())
}

const BEGIN: &str =
    "<!-- generated by scripts/bench: rewritten on every run, up to the end marker -->";
const END: &str = "<!-- end of generated results -->";

/// Prints the verdicts and rewrites BENCHMARKS.md's generated part, keeping what follows it.
fn write_report(machine: &str, bench: &Bench, took: Duration) {
    let mut table = String::from(
        "| measurement | lockrun | flock(1) baseline | ratio | target | result |\n|---|---|---|---|---|---|\n",
    );
    println!();
    for o in &bench.outcomes {
        println!(
            "{:4}  {}: {} against {} ({}), target {}",
            o.verdict(),
            o.what,
            o.measured,
            o.baseline,
            o.ratio,
            o.target
        );
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} |",
            o.what,
            o.measured,
            o.baseline,
            o.ratio,
            o.target,
            o.verdict()
        );
    }
    let mut generated = format!(
        "{BEGIN}\n\nMeasured by `scripts/bench` in one run of {:.0} s on:\n\n{machine}\n\n{table}",
        took.as_secs_f64()
    );
    if !bench.notes.is_empty() {
        generated.push_str("\nNotes from this run:\n\n");
        for note in &bench.notes {
            let _ = writeln!(generated, "- {note}");
        }
    }
    let _ = write!(
        generated,
        "\nSizes: (a)/(d) {SINGLE_RUNS} runs per contender after {WARMUP} warm-up runs, interleaved; \
         (b) median of {CONTENTION_ROUNDS} rounds; (c) {QUEUE_ROUNDS} rounds of one holder and {QUEUE} queued waiters \
         holding {hold} ms each, after {settle} ms to line up, gaps from CLOCK_MONOTONIC stamps the commands write \
         themselves; (ii) the same with {SLOTS} holders let go at once and -p {SLOTS}, once `status` shows every \
         waiter in line (for flock(1), one file per slot, each command given file id % {SLOTS}), a gap being from a \
         slot's freeing to the next command's start; (i) {FAIR_ROUNDS} rounds of \
         one holder and {FAIR_WAITERS} waiters, each started {spacing} ms after the one before and once that one was \
         in line (`status --json`; for flock(1) /proc/locks), served order from the stamps; (iii) one round each of \
         {short} and {long} waiters holding {hold} ms, each started once the one before was in line, the waiting \
         processes' voluntary context switches and CPU time (/proc/PID/status, /proc/PID/schedstat) from all in line \
         to their command's start, and the server's work (Redis commands, PostgreSQL transactions, etcd calls) from \
         all in line to the end; (e) \
         getrusage(RUSAGE_CHILDREN) of a wrapper, largest of {RSS_RUNS} runs of `true`. Every backend runs with \
         default flags; every contender without the entries cargo adds to LD_LIBRARY_PATH.\n\n{END}",
        hold = QUEUE_HOLD.as_millis(),
        settle = QUEUE_SETTLE.as_millis(),
        spacing = FAIR_SPACING.as_millis(),
        short = GROWTH[0],
        long = GROWTH[1],
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    let previous = fs::read_to_string(&path).unwrap_or_default();
    let text = match (previous.find(BEGIN), previous.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!(
                "{}{generated}{}",
                &previous[..begin],
                &previous[end + END.len()..]
            )
        }
        _ => format!("# Benchmarks\n\n{generated}\n"),
    };
    fs::write(&path, text).expect("write BENCHMARKS.md");
    println!("\nwrote {}", path.display());
}
