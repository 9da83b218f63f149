//! lockrun against flock(1), measured side by side in one run on this machine
//! (`scripts/bench`, or `cargo bench --bench compare`). Prints every result
//! with PASS/MISS against its target and rewrites the generated part of
//! BENCHMARKS.md, keeping the hand-written notes below it.
//!
//! The same executable is also the tiny command the handoff benchmark runs
//! (`compare stamp ...`) and the peak-RSS wrapper (`compare rss ...`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use nix::time::{ClockId, clock_gettime};

/// The lockrun under test: this build's, or `LOCKRUN_BENCH_BIN` (another build of it, e.g. a static one).
fn lockrun_bin() -> PathBuf {
    std::env::var_os("LOCKRUN_BENCH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_lockrun")),
        PathBuf::from,
    )
}

/// Runs of `COMMAND true` per contender for (a) and (d).
const SINGLE_RUNS: usize = 1000;
/// (b): processes, runs each, and how often the whole contention is repeated.
const CONTENDERS: usize = 8;
const CONTENDED_RUNS: usize = 25;
const CONTENTION_ROUNDS: usize = 9;
/// (c): waiters queued behind one holder, each holding this long, per round.
const QUEUE: usize = 12;
const QUEUE_ROUNDS: usize = 3;
const QUEUE_HOLD: Duration = Duration::from_millis(20);
/// Time the waiters get to line up behind the first holder.
const QUEUE_SETTLE: Duration = Duration::from_millis(300);
/// A queue round that takes longer is stopped and reported incomplete.
const QUEUE_LIMIT: Duration = Duration::from_secs(90);
const RSS_RUNS: usize = 5;

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("stamp") => stamp(&args[1..]),
        Some("rss") => rss(&args[1..]),
        // `cargo bench` passes `--bench`; nothing else is expected.
        _ => benchmark(),
    }
}

/// How one contender runs a command under the lock called `name`.
#[derive(Clone, Debug)]
enum Locker {
    Bare,
    Flock {
        dir: PathBuf,
    },
    Lockrun {
        backend: &'static str,
        flags: Vec<OsString>,
    },
}

impl Locker {
    fn label(&self) -> String {
        match self {
            Self::Bare => "bare".into(),
            Self::Flock { .. } => "flock(1)".into(),
            Self::Lockrun { backend, .. } => format!("lockrun {backend}"),
        }
    }

    fn command<S: AsRef<std::ffi::OsStr>>(&self, name: &str, argv: &[S]) -> Command {
        let mut command = match self {
            Self::Bare => Command::new(&argv[0]),
            Self::Flock { dir } => {
                let mut command = Command::new("flock");
                command.arg(dir.join(format!("{name}.flock"))).arg(&argv[0]);
                command
            }
            Self::Lockrun { flags, .. } => {
                let mut command = Command::new(lockrun_bin());
                command
                    .args(flags)
                    .args(["--name", name, "--"])
                    .arg(&argv[0]);
                command
            }
        };
        command.args(&argv[1..]);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("LOCKRUN_") {
                command.env_remove(key);
            }
        }
        command.stdin(Stdio::null()).stdout(Stdio::null());
        command
    }
}

/// One result line: what was measured, the baseline beside it, and the target.
struct Outcome {
    what: String,
    measured: String,
    baseline: String,
    ratio: String,
    target: String,
    /// `None`: not measured (the reason is in `measured`).
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
    flock: Locker,
    /// Lease backends this build has, or why not.
    sqlite: Result<Locker, String>,
    redis: Result<(Locker, Redis), String>,
    /// On the server `LOCKRUN_BENCH_POSTGRES_URL` names (the benchmark starts none).
    postgres: Result<Locker, String>,
    etcd: Result<(Locker, Etcd), String>,
    outcomes: Vec<Outcome>,
    notes: Vec<String>,
}

fn benchmark() {
    if let Err(why) = Command::new("flock").arg("--version").output() {
        eprintln!("bench: flock(1) is needed as the baseline: {why}");
        std::process::exit(1);
    }
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let dir = |name: &str| {
        let dir = scratch.path().join(name);
        fs::create_dir_all(&dir).expect("a scratch subdirectory");
        dir
    };
    let file = Locker::Lockrun {
        backend: "file",
        flags: vec![
            "--backend".into(),
            "file".into(),
            "--dir".into(),
            dir("file").into(),
        ],
    };
    let flock = Locker::Flock { dir: dir("flock") };
    let sqlite = available(Locker::Lockrun {
        backend: "sqlite",
        flags: vec![
            "--backend".into(),
            "sqlite".into(),
            "--db".into(),
            dir("sqlite").join("locks.sqlite3").into(),
        ],
    });
    let redis = Redis::start(scratch.path()).and_then(|server| {
        let locker = available(Locker::Lockrun {
            backend: "redis",
            flags: vec![
                "--backend".into(),
                "redis".into(),
                "--redis-url".into(),
                server.url().into(),
            ],
        })?;
        Ok((locker, server))
    });
    let postgres = std::env::var("LOCKRUN_BENCH_POSTGRES_URL")
        .map_err(|_| "LOCKRUN_BENCH_POSTGRES_URL is not set".to_owned())
        .and_then(|url| {
            available(Locker::Lockrun {
                backend: "postgres",
                flags: vec![
                    "--backend".into(),
                    "postgres".into(),
                    "--postgres-url".into(),
                    url.into(),
                ],
            })
        });
    let etcd = Etcd::start(scratch.path()).and_then(|server| {
        let locker = available(Locker::Lockrun {
            backend: "etcd",
            flags: vec![
                "--backend".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                server.url().into(),
            ],
        })?;
        Ok((locker, server))
    });
    let mut bench = Bench {
        scratch,
        file,
        flock,
        sqlite,
        redis,
        postgres,
        etcd,
        outcomes: Vec::new(),
        notes: Vec::new(),
    };
    let machine = machine();
    println!("{machine}");
    let started = Instant::now();
    bench.single();
    bench.contention();
    bench.handoff();
    bench.redis_against_file();
    bench.peak_rss();
    let took = started.elapsed();
    println!("\nbenchmark took {:.0} s", took.as_secs_f64());
    write_report(&machine, &bench, took);
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

impl Bench {
    /// (a) `lockrun --name x -- true` against `flock FILE true` and bare `true`.
    fn single(&mut self) {
        let lockers = [Locker::Bare, self.flock.clone(), self.file.clone()];
        let medians = interleaved_medians(&lockers, "x", SINGLE_RUNS);
        let [bare, flock, file] = medians[..] else {
            unreachable!()
        };
        println!(
            "\n(a) one run of `true`, median of {SINGLE_RUNS}: bare {}, flock(1) {}, lockrun {}",
            ms(bare),
            ms(flock),
            ms(file)
        );
        self.ratio(
            format!(
                "(a) wall time of `true` under the lock (bare `true`: {})",
                ms(bare)
            ),
            file,
            flock,
            1.10,
        );
    }

    /// (b) 8 processes x 25 runs of `true` under one lock.
    fn contention(&mut self) {
        let lockers = [self.flock.clone(), self.file.clone()];
        let mut totals = [Vec::new(), Vec::new()];
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
        let [flock, file] = totals.map(median);
        println!(
            "(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs, median of {CONTENTION_ROUNDS}: flock(1) {}, lockrun {}",
            ms(flock),
            ms(file)
        );
        self.ratio(
            format!("(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs of `true`, total"),
            file,
            flock,
            1.20,
        );
    }

    /// (c) handoff gap in a queue of 12 waiters, per backend, against flock(1).
    /// Rounds are interleaved across contenders, so load from elsewhere falls on all alike.
    fn handoff(&mut self) {
        let redis = self
            .redis
            .as_ref()
            .map(|(locker, _)| locker.clone())
            .map_err(Clone::clone);
        let contenders: Vec<(&str, Result<Locker, String>, Option<Target>)> = vec![
            ("flock(1)", Ok(self.flock.clone()), None),
            ("file", Ok(self.file.clone()), Some(Target::Ratio(1.3))),
            (
                "sqlite",
                self.sqlite.clone(),
                Some(Target::Absolute(Duration::from_millis(50))),
            ),
            ("redis", redis, Some(Target::Ratio(2.0))),
            ("postgres", self.postgres.clone(), Some(Target::Ratio(2.0))),
            ("etcd", self.etcd_locker(), Some(Target::Ratio(3.0))),
        ];
        // Gaps per contender; an error once a round did not finish or the backend is missing.
        let mut gaps: Vec<Result<Vec<Duration>, String>> = contenders
            .iter()
            .map(|(_, locker, _)| locker.as_ref().map(|_| Vec::new()).map_err(Clone::clone))
            .collect();
        for round in 0..QUEUE_ROUNDS {
            for ((_, locker, _), gaps) in contenders.iter().zip(&mut gaps) {
                let (Ok(locker), Ok(collected)) = (locker, gaps.as_mut()) else {
                    continue;
                };
                match self.queue_round(locker, round) {
                    Some(round_gaps) => collected.extend(round_gaps),
                    None => *gaps = Err("the queue did not finish".into()),
                }
            }
        }
        let summaries: Vec<Result<Gaps, String>> =
            gaps.into_iter().map(|g| g.map(Gaps::of)).collect();
        let flock = match &summaries[0] {
            Ok(flock) => {
                println!(
                    "(c) handoff gap, flock(1): median {}, max {}",
                    ms(flock.median),
                    ms(flock.max)
                );
                *flock
            }
            Err(why) => {
                self.note(format!("flock(1): {why}; no handoff baseline"));
                return;
            }
        };
        for ((backend, _, target), summary) in contenders.iter().zip(&summaries).skip(1) {
            let target = target.as_ref().expect("every backend has a target");
            let what =
                format!("(c) handoff gap, {backend}, median of {QUEUE_ROUNDS}x{QUEUE} handoffs");
            let gaps = match summary {
                Ok(gaps) => gaps,
                Err(why) => {
                    println!("(c) {backend}: not measured: {why}");
                    self.outcomes
                        .push(Outcome::not_measured(what, &target.text(), why));
                    continue;
                }
            };
            println!(
                "(c) handoff gap, lockrun {backend}: median {}, max {}",
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
            }
        }
    }

    /// One holder and `QUEUE` waiters under `locker`: the gaps between one
    /// command's end and the next one's start; `None` when it did not finish.
    fn queue_round(&mut self, locker: &Locker, round: usize) -> Option<Vec<Duration>> {
        let stamper = std::env::current_exe().expect("the benchmark's own path");
        let base = self.scratch.path().join(format!(
            "queue-{}-{round}",
            locker.label().replace(['(', ')', ' '], "")
        ));
        let log = base.with_extension("log");
        let release = base.with_extension("release");
        let held = base.with_extension("held");
        let name = format!("queue-{round}");
        let stamp = |mode: &str, value: &std::ffi::OsStr| {
            let argv = [
                stamper.as_os_str(),
                "stamp".as_ref(),
                log.as_os_str(),
                mode.as_ref(),
                value,
            ];
            locker
                .command(&name, &argv)
                .spawn()
                .expect("spawn a queued command")
        };
        let mut children = vec![stamp("until", release.as_os_str())];
        if !await_path(&held, QUEUE_LIMIT) {
            self.note(format!(
                "{}: the first holder never got the lock",
                locker.label()
            ));
            stop_all(&mut children);
            return None;
        }
        let hold_ms = QUEUE_HOLD.as_millis().to_string();
        children.extend((0..QUEUE).map(|_| stamp("hold", hold_ms.as_ref())));
        thread::sleep(QUEUE_SETTLE);
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
        let mut spans: Vec<(i128, i128)> = fs::read_to_string(&log)
            .expect("the stamp log")
            .lines()
            .filter_map(|line| {
                let (start, end) = line.split_once(' ')?;
                Some((start.parse().ok()?, end.parse().ok()?))
            })
            .collect();
        spans.sort_unstable();
        let mut gaps = Vec::new();
        for pair in spans.windows(2) {
            let gap = pair[1].0 - pair[0].1;
            if gap < 0 {
                self.note(format!(
                    "{}: two commands overlapped by {} ns",
                    locker.label(),
                    -gap
                ));
            }
            gaps.push(Duration::from_nanos(gap.max(0) as u64));
        }
        Some(gaps)
    }

    /// (d) the redis backend's wall time against the file backend's, and the Redis commands per run.
    fn redis_against_file(&mut self) {
        let what = "(d) redis backend wall time against the file backend".to_owned();
        let target = "≤ 1.30× file";
        let (redis, server) = match &self.redis {
            Ok((locker, server)) => (locker.clone(), server),
            Err(why) => {
                println!("(d) redis: not measured: {why}");
                self.outcomes.push(Outcome::not_measured(what, target, why));
                return;
            }
        };
        let before = server.command_calls();
        let medians = interleaved_medians(&[self.file.clone(), redis], "d", SINGLE_RUNS);
        let after = server.command_calls();
        let [file, redis] = medians[..] else {
            unreachable!()
        };
        let per_run: Vec<String> = after
            .iter()
            // INFO and PING are the benchmark's own.
            .filter(|(command, _)| !matches!(command.as_str(), "info" | "ping"))
            .filter_map(|(command, calls)| {
                let delta = calls - before.get(command).copied().unwrap_or(0);
                // Runs include the warm-up, hence the division by the runs actually made.
                (delta > 0).then(|| {
                    format!(
                        "{command} {:.2}",
                        delta as f64 / (SINGLE_RUNS + WARMUP) as f64
                    )
                })
            })
            .collect();
        let commands = if per_run.is_empty() {
            "none".into()
        } else {
            per_run.join(", ")
        };
        println!(
            "(d) median of {SINGLE_RUNS}: file {}, redis {}; Redis commands per run: {commands}",
            ms(file),
            ms(redis)
        );
        let ratio = redis.as_secs_f64() / file.as_secs_f64();
        self.outcomes.push(Outcome {
            what: format!("{what} (Redis commands per run: {commands})"),
            measured: ms(redis),
            baseline: format!("{} (file)", ms(file)),
            ratio: format!("{ratio:.2}×"),
            target: target.into(),
            pass: Some(ratio <= 1.30),
        });
    }

    /// (e) peak RSS of lockrun (and of flock(1) beside it), the largest of a few runs.
    fn peak_rss(&mut self) {
        let flock = max_rss(&self.flock);
        let mut lockers = vec![("file", Ok(self.file.clone()))];
        lockers.push(("sqlite", self.sqlite.clone()));
        lockers.push((
            "redis",
            self.redis
                .as_ref()
                .map(|(locker, _)| locker.clone())
                .map_err(Clone::clone),
        ));
        lockers.push(("etcd", self.etcd_locker()));
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

    fn etcd_locker(&self) -> Result<Locker, String> {
        self.etcd
            .as_ref()
            .map(|(locker, _)| locker.clone())
            .map_err(Clone::clone)
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

enum Target {
    Ratio(f64),
    Absolute(Duration),
}

impl Target {
    fn text(&self) -> String {
        match self {
            Self::Ratio(limit) => format!("≤ {limit:.2}× flock(1)"),
            Self::Absolute(limit) => format!("≤ {}", ms(*limit)),
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

/// `compare stamp LOG hold MS` or `compare stamp LOG until FILE`: the command the
/// handoff benchmark runs under the lock. It appends "START END" (`CLOCK_MONOTONIC`
/// nanoseconds, one write) to LOG: START as it begins, END just before it exits.
/// `until FILE` first creates FILE.held, then holds until FILE exists.
fn stamp(args: &[OsString]) {
    let start = monotonic_nanos();
    let [log, mode, value] = args else {
        panic!("usage: stamp LOG hold MS | stamp LOG until FILE");
    };
    if mode == "hold" {
        let millis = value
            .to_str()
            .and_then(|v| v.parse().ok())
            .expect("hold MS");
        thread::sleep(Duration::from_millis(millis));
    } else {
        let release = PathBuf::from(value);
        fs::write(release.with_extension("held"), "").expect("write the held marker");
        while !release.exists() {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let line = format!("{start} {}\n", monotonic_nanos());
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

/// A redis-server of the benchmark's own on a free loopback port, without persistence.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start(scratch: &Path) -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|err| format!("no free loopback port: {err}"))?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(scratch)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("redis-server not available: {err}"))?;
        let server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connection().is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let mut connection = redis::Client::open(self.url())?.get_connection()?;
        redis::cmd("PING").query::<String>(&mut connection)?;
        Ok(connection)
    }

    /// Calls per command so far, from INFO commandstats.
    fn command_calls(&self) -> BTreeMap<String, u64> {
        let info: String = self
            .connection()
            .and_then(|mut c| redis::cmd("INFO").arg("commandstats").query(&mut c))
            .unwrap_or_default();
        info.lines()
            .filter_map(|line| {
                // cmdstat_evalsha:calls=3,usec=...
                let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((command.to_owned(), calls))
            })
            .collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A one-member etcd of the benchmark's own on free loopback ports, with its
/// data in the scratch directory and etcd's default timing.
struct Etcd {
    child: Child,
    port: u16,
}

impl Etcd {
    fn start(scratch: &Path) -> Result<Self, String> {
        let free_port = || {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|address| address.port())
                .map_err(|err| format!("no free loopback port: {err}"))
        };
        let (port, peer) = (free_port()?, free_port()?);
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(scratch.join("bench.etcd"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("etcd not available: {err}"))?;
        let server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.serves() {
            if Instant::now() > deadline {
                return Err("etcd did not start within 10 s".into());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether it has a leader: lockrun's status answers.
    fn serves(&self) -> bool {
        Command::new(lockrun_bin())
            .args([
                "status",
                "--backend",
                "etcd",
                "--etcd-endpoints",
                &self.url(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the numbers were measured on.
fn machine() -> String {
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
    let binary = lockrun_bin();
    let linking = first_line("file", &["-b".as_ref(), binary.as_os_str()]);
    let _ = writeln!(
        text,
        "- lockrun: {} ({}), `{}`: {}",
        first_line(&binary, &["--version"]),
        first_line("git", &["describe", "--always", "--dirty"]),
        binary.display(),
        linking
            .split(", ")
            .filter(|part| part.contains("link"))
            .collect::<Vec<_>>()
            .join(", ")
    );
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
         holding {} ms each, gaps from CLOCK_MONOTONIC stamps the commands write themselves; \
         (e) getrusage(RUSAGE_CHILDREN) of a wrapper, largest of {RSS_RUNS} runs of `true`.\n\n{END}",
        QUEUE_HOLD.as_millis()
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
