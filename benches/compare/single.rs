//! (a), (d) and (e): one uncontended run at a time. Wall time of `true` under the lock against
//! flock(1) and bare `true`, each networked backend against the file backend with its server's
//! work per run, and peak RSS.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::lockers::{Lock, Locker, Mode};
use crate::report::Outcome;
use crate::servers::{Networked, Server, locker, work_unit};
use crate::stats::{median, mib, ms};
use crate::{Bench, RSS_RUNS, RUN_LIMIT, SINGLE_RUNS, WARMUP};

impl Bench {
    /// (a) `lockrun --name x -- true` against `flock FILE true` and bare `true`, both builds.
    pub(crate) fn single(&mut self) {
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

    /// (d) each networked backend's wall time against the file backend's, and
    /// its server's work per run. PostgreSQL also counts its round trips per run,
    /// through a counting proxy (tests/support), in runs of their own.
    pub(crate) fn networked_against_file(&mut self) {
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
    pub(crate) fn peak_rss(&mut self) {
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
}

/// Median wall time of `true` under each locker, runs interleaved so that load
/// from elsewhere on the machine falls on every contender alike.
pub(crate) fn interleaved_medians(lockers: &[Locker], name: &str, runs: usize) -> Vec<Duration> {
    let contenders: Vec<(&Locker, Mode)> = lockers.iter().map(|l| (l, Mode::Exclusive)).collect();
    interleaved_in_modes(&contenders, name, runs, Order::Fixed)
        .into_iter()
        .zip(lockers)
        .map(|(median, locker)| median.unwrap_or_else(|why| panic!("{}: {why}", locker.label())))
        .collect()
}

/// The order of the contenders in each round of interleaved runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The same every round, as (a), (d) and (f) have always run.
    Fixed,
    /// Every other round, each two neighbours (first and second, third and
    /// fourth, ...) swapped. A contender listed twice in a row, once per mode,
    /// then runs each mode first (after another binary) as often as second
    /// (after its own, warm): `flock -s` always second measured 0.93× `flock -x`
    /// in one run. Reversing the whole list instead leaves the ends unfair: the
    /// first contender's first mode and the last one's second would always
    /// follow themselves (etcd's -s measured 0.90-0.94×, `flock -s` 1.03-1.05×).
    SwappedPairs,
}

/// The same with each contender in its own mode, or why it has no median: a
/// run of it failed, or had not ended after `RUN_LIMIT` (then it is killed).
/// A contender that failed runs no more.
pub(crate) fn interleaved_in_modes(
    contenders: &[(&Locker, Mode)],
    name: &str,
    runs: usize,
    order: Order,
) -> Vec<Result<Duration, String>> {
    let mut samples: Vec<Result<Vec<Duration>, String>> =
        vec![Ok(Vec::with_capacity(runs)); contenders.len()];
    // The run under way and when it began, for the watchdog.
    let running: Mutex<Option<(u32, Instant)>> = Mutex::new(None);
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(100));
                let running = running.lock().expect("the watchdog's lock");
                if let Some((pid, began)) = *running
                    && began.elapsed() > RUN_LIMIT
                {
                    let pid = i32::try_from(pid).expect("a pid fits a pid_t");
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        });
        for round in 0..WARMUP + runs {
            let mut turns: Vec<usize> = (0..contenders.len()).collect();
            if order == Order::SwappedPairs && round % 2 == 1 {
                turns.chunks_mut(2).for_each(<[usize]>::reverse);
            }
            for turn in turns {
                let (locker, mode) = contenders[turn];
                let samples = &mut samples[turn];
                let Ok(collected) = samples else {
                    continue;
                };
                let mut command = locker.command_under(Lock::named(name).mode(mode), &["true"]);
                let started = Instant::now();
                let mut child = command.spawn().expect("spawn a benchmarked command");
                *running.lock().expect("the watchdog's lock") = Some((child.id(), started));
                let status = child.wait().expect("wait for a benchmarked command");
                let took = started.elapsed();
                *running.lock().expect("the watchdog's lock") = None;
                if took > RUN_LIMIT {
                    *samples = Err(format!(
                        "a run had not ended after {} s",
                        RUN_LIMIT.as_secs()
                    ));
                } else if !status.success() {
                    *samples = Err(format!("a run failed: {status}"));
                } else if round >= WARMUP {
                    collected.push(took);
                }
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    samples.into_iter().map(|s| s.map(median)).collect()
}

/// PostgreSQL's round trips per uncontended run, counted by a proxy in front
/// of the server (without TLS, which the proxy cannot read); `None` elsewhere.
fn round_trips(served: &Networked) -> Option<f64> {
    #[cfg(feature = "postgres")]
    if let Server::Postgres(server) = &served.server {
        const RUNS: usize = 20;
        let proxy = crate::support::postgres::Proxy::start(server, true);
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
