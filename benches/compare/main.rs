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
//!
//! The sizes of every measurement are the constants below, in one place as the report
//! quotes them; each family of measurements is a module of its own, run in order by
//! [`benchmark`].

use std::ffi::OsString;
use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

/// The tests' harness, for the servers the benchmark starts; most of it is for the tests alone.
#[allow(dead_code)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod builds;
mod contention;
mod deployed;
mod fairness;
mod growth;
mod handoff;
mod helpers;
mod lockers;
mod machine;
mod queue;
mod report;
#[cfg(feature = "s3")]
mod s3;
mod servers;
mod shared;
mod single;
mod stats;

use builds::{Build, baseline_build, default_build, static_build};
use lockers::{Locker, available};
use machine::machine;
use report::{Outcome, write_report};
use servers::{Networked, Server};
use support::RedisServer;
#[cfg(feature = "etcd")]
use support::etcd::EtcdServer;
#[cfg(feature = "postgres")]
use support::postgres::PostgresServer;
#[cfg(feature = "s3")]
use support::s3::SeaweedServer;

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
/// (a), (d), (f) and (j): a run of `true` that takes longer is killed and its contender reported
/// as not measured (or, in (a), (d) and (f), the benchmark stops).
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// (j): uncontended runs of `true` per contender and mode, and the most a shared one may cost.
const SHARED_RUNS: usize = 300;
const SHARED_COST: f64 = 1.10;
/// (k): readers waiting behind a writer, rounds (each beside one with a single waiter), and the
/// most the last reader's gap may be against flock(1)'s last reader's.
const READERS: usize = 8;
const READER_ROUNDS: usize = 7;
const READERS_SPREAD: f64 = 1.30;
const RSS_RUNS: usize = 5;
/// (a) and (d): runs before the measured ones, left out of the medians.
const WARMUP: usize = 20;
/// (l): uncontended runs of `true` per contender, S3 against the file backend.
const S3_RUNS: usize = 100;

/// The families `LOCKRUN_BENCH_ONLY` runs alone: (b), (c), (f), (j)/(k), (k), (iii) and (l).
const ONLY: [&str; 7] = [
    "contention",
    "handoff",
    "deployed",
    "shared",
    "readers",
    "growth",
    "s3",
];

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("stamp") => helpers::stamp(&args[1..]),
        Some("rss") => helpers::rss(&args[1..]),
        // `cargo bench` passes `--bench`; nothing else is expected.
        _ => benchmark(),
    }
}

struct Bench {
    scratch: tempfile::TempDir,
    file: Locker,
    /// The file backend run by the static opt-in build, or why not.
    file_static: Result<Locker, String>,
    /// The file backend run by `LOCKRUN_BENCH_BASELINE_BIN`, measured in (b) beside the default build.
    file_baseline: Option<Locker>,
    flock: Locker,
    /// Lease backends this build has, or why not.
    sqlite: Result<Locker, String>,
    redis: Result<Networked, String>,
    postgres: Result<Networked, String>,
    etcd: Result<Networked, String>,
    s3: Result<Networked, String>,
    /// (c)'s flock(1) handoff gap: the baseline of (ii).
    flock_handoff: Option<Duration>,
    outcomes: Vec<Outcome>,
    notes: Vec<String>,
    /// Queue rounds run so far: each gets files of its own.
    rounds: usize,
}

/// The family `LOCKRUN_BENCH_ONLY` names, if any: it runs alone, printed, and
/// BENCHMARKS.md is left as it is.
fn only() -> Option<String> {
    let only = std::env::var("LOCKRUN_BENCH_ONLY").ok()?;
    if !ONLY.contains(&only.as_str()) {
        eprintln!("bench: LOCKRUN_BENCH_ONLY is one of {ONLY:?}, not {only:?}");
        std::process::exit(64);
    }
    Some(only)
}

impl Bench {
    /// The family `only` names, alone, its results printed.
    fn alone(&mut self, only: &str, default: &Build) {
        match only {
            "contention" => self.contention(),
            "handoff" => self.handoff(),
            "deployed" => self.deployed(default),
            "shared" => self.shared(),
            "readers" => self.readers(),
            "growth" => self.growth(),
            #[cfg(feature = "s3")]
            "s3" => self.s3(),
            #[cfg(not(feature = "s3"))]
            "s3" => println!("(l): this build has no s3 backend"),
            other => unreachable!("LOCKRUN_BENCH_ONLY={other} was refused above"),
        }
        self.outcomes.iter().for_each(Outcome::print);
    }
}

fn benchmark() {
    if let Err(why) = Command::new("flock").arg("--version").output() {
        eprintln!("bench: flock(1) is needed as the baseline: {why}");
        std::process::exit(1);
    }
    let only = only();
    let default = default_build();
    // Neither family that runs alone measures the static build: it is not built for them.
    let statically = match only {
        Some(_) => Err("not measured when one family runs alone".to_owned()),
        None => static_build(),
    };
    if let (None, Err(why)) = (&only, &statically) {
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
    let file_baseline = baseline_build().map(|build| file.with_build(&build));
    let flock = Locker::Flock { dir: dir("flock") };
    let sqlite = available(lockrun(
        "sqlite",
        "--db",
        dir("sqlite").join("locks.sqlite3").into(),
    ));
    let Networks {
        redis,
        postgres,
        etcd,
        s3,
    } = start_servers(lockrun);
    let mut bench = Bench {
        scratch,
        file,
        file_static,
        file_baseline,
        flock,
        sqlite,
        redis,
        postgres,
        etcd,
        s3,
        flock_handoff: None,
        outcomes: Vec::new(),
        notes: Vec::new(),
        rounds: 0,
    };
    if let Some(only) = only {
        bench.alone(&only, &default);
        return;
    }
    let machine = machine(&default, statically.as_ref().ok());
    println!("{machine}");
    let started = Instant::now();
    bench.single();
    bench.contention();
    bench.handoff();
    bench.handoff_with_slots();
    bench.fairness();
    bench.growth();
    bench.shared();
    bench.networked_against_file();
    #[cfg(feature = "s3")]
    bench.s3();
    bench.deployed(&default);
    bench.peak_rss();
    let took = started.elapsed();
    println!("\nbenchmark took {:.0} s", took.as_secs_f64());
    write_report(&machine, &bench, took);
}

/// The networked backends' lockruns, each on a server of the benchmark's own, or why not.
struct Networks {
    redis: Result<Networked, String>,
    postgres: Result<Networked, String>,
    etcd: Result<Networked, String>,
    s3: Result<Networked, String>,
}

fn start_servers(lockrun: impl Fn(&'static str, &str, OsString) -> Locker + Copy) -> Networks {
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
    #[cfg(feature = "s3")]
    let s3 = SeaweedServer::start()
        .ok_or_else(|| missing("SeaweedFS (weed)"))
        .and_then(|server| Server::S3(server).locker(lockrun));
    #[cfg(not(feature = "s3"))]
    let s3 = Err("this build has no s3 backend".to_owned());
    Networks {
        redis,
        postgres,
        etcd,
        s3,
    }
}
