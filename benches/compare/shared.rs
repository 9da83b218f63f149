//! (j) and (k): shared locks (`-s`). What an uncontended shared acquisition costs against an
//! exclusive one, and how soon a writer's release lets a line of readers in, against one waiter's
//! handoff; flock(1)'s `-s` beside each, per backend.

use std::fmt::Write as _;
use std::fs;
use std::time::{Duration, Instant};

use crate::lockers::{Lock, Locker, Mode};
use crate::queue::{Arrival, Hold, Round, await_path, stop_all, wait_until};
use crate::report::Outcome;
use crate::single::{Order, interleaved_in_modes};
use crate::stats::{median, ms, ratio_text};
use crate::{Bench, QUEUE_LIMIT, READER_ROUNDS, READERS, READERS_SPREAD, SHARED_COST, SHARED_RUNS};

/// How long a second sharer may take to get in beside a first before the
/// backend counts as having no shared mode.
const TOGETHER_LIMIT: Duration = Duration::from_secs(5);

impl Bench {
    /// (j) and (k) on flock(1) and every backend. A backend whose `-s` runs do
    /// not hold together (shared mode not in this build yet) is not measured.
    pub(crate) fn shared(&mut self) {
        let contenders = self.sharing_lockers();
        self.shared_acquisition(&contenders);
        self.readers_after_writer(&contenders);
    }

    /// (k) alone (`LOCKRUN_BENCH_ONLY=readers`).
    pub(crate) fn readers(&mut self) {
        let contenders = self.sharing_lockers();
        self.readers_after_writer(&contenders);
    }

    /// Every contender, or why it is not measured: a backend whose `-s` runs
    /// do not hold together.
    fn sharing_lockers(&mut self) -> Vec<(&'static str, Result<Locker, String>)> {
        self.every_locker()
            .into_iter()
            .map(|(backend, locker)| {
                let locker = locker.and_then(|locker| {
                    self.holds_together(&locker)?;
                    Ok(locker)
                });
                (backend, locker)
            })
            .collect()
    }

    /// (j) uncontended `lockrun -s --name j -- true` against `lockrun --name j
    /// -- true` on each backend, and `flock -s` against `flock -x`, every
    /// contender in both modes interleaved run by run.
    fn shared_acquisition(&mut self, contenders: &[(&'static str, Result<Locker, String>)]) {
        let runs: Vec<(&Locker, Mode)> = contenders
            .iter()
            .filter_map(|(_, locker)| locker.as_ref().ok())
            .flat_map(|locker| [(locker, Mode::Exclusive), (locker, Mode::Shared)])
            .collect();
        let mut medians =
            interleaved_in_modes(&runs, "j", SHARED_RUNS, Order::SwappedPairs).into_iter();
        let pairs: Vec<Result<(Duration, Duration), String>> = contenders
            .iter()
            .map(|(_, locker)| {
                // Two medians, exclusive then shared, for each contender measured.
                locker.as_ref().map_err(Clone::clone)?;
                match (medians.next(), medians.next()) {
                    (Some(exclusive), Some(shared)) => Ok((exclusive?, shared?)),
                    _ => unreachable!("two medians per contender measured"),
                }
            })
            .collect();
        let flock = match &pairs[0] {
            Ok((exclusive, shared)) => format!(
                "flock(1): `flock -s` {} against `flock -x` {}, {}",
                ms(*shared),
                ms(*exclusive),
                ratio_text(*shared, *exclusive)
            ),
            Err(why) => format!("flock(1): not measured: {why}"),
        };
        println!("\n(j) uncontended shared against exclusive, median of {SHARED_RUNS}: {flock}");
        let target = format!("≤ {SHARED_COST:.2}× exclusive");
        for ((backend, _), pair) in contenders.iter().zip(&pairs) {
            let reference = *backend == "flock(1)";
            let what = if reference {
                format!(
                    "(j) uncontended shared acquisition, flock(1): `flock -s` against `flock -x`, median of {SHARED_RUNS} runs of `true` each, interleaved (reference)"
                )
            } else {
                format!(
                    "(j) uncontended shared acquisition, {backend}: `lockrun -s` against `lockrun` (exclusive), median of {SHARED_RUNS} runs of `true` each, interleaved"
                )
            };
            let outcome = match pair {
                Ok((exclusive, shared)) => {
                    if !reference {
                        println!(
                            "(j) lockrun {backend}: -s {} against exclusive {}, {}",
                            ms(*shared),
                            ms(*exclusive),
                            ratio_text(*shared, *exclusive)
                        );
                    }
                    Outcome {
                        what,
                        measured: ms(*shared),
                        baseline: format!("{} (exclusive)", ms(*exclusive)),
                        ratio: ratio_text(*shared, *exclusive),
                        target: if reference {
                            "- (reference)".into()
                        } else {
                            target.clone()
                        },
                        pass: (!reference).then_some(
                            shared.as_secs_f64() <= SHARED_COST * exclusive.as_secs_f64(),
                        ),
                    }
                }
                Err(why) => {
                    println!("(j) {backend}: not measured: {why}");
                    Outcome::not_measured(what, &target, why)
                }
            };
            self.outcomes.push(outcome);
        }
    }

    /// (k) a writer holds, `READERS` shared waiters line up behind it (every
    /// one in line, as `status` or /proc/locks shows), the writer lets go: the
    /// largest gap from the writer's end to a reader's start, per round,
    /// against flock(1)'s (`flock -x`, then `flock -s` readers) in the same
    /// rounds: on this machine's two cores, the floor of starting `READERS`
    /// commands at once. The handoff gap to one exclusive waiter, in rounds of
    /// its own beside each, is reported beside it.
    fn readers_after_writer(&mut self, contenders: &[(&'static str, Result<Locker, String>)]) {
        let mut figures: Vec<Result<Readers, String>> = contenders
            .iter()
            .map(|(_, locker)| {
                locker
                    .as_ref()
                    .map(|_| Readers::default())
                    .map_err(Clone::clone)
            })
            .collect();
        for _ in 0..READER_ROUNDS {
            for ((_, locker), figures) in contenders.iter().zip(&mut figures) {
                let (Ok(locker), Ok(collected)) = (locker, figures.as_mut()) else {
                    continue;
                };
                if let Err(why) = self.reader_rounds(locker, collected) {
                    *figures = Err(why);
                }
            }
        }
        let what = |backend: &str| {
            format!(
                "(k) a writer's release to {READERS} waiting readers, {backend}: the last reader's start after the writer's end, median of {READER_ROUNDS} rounds, against flock(1)'s {READERS} readers in the same rounds"
            )
        };
        let summaries: Vec<Result<Summary, String>> = figures
            .into_iter()
            .map(|figures| figures.map(Readers::summary))
            .collect();
        let target = format!("≤ {READERS_SPREAD:.2}× flock(1)'s {READERS} readers");
        for ((backend, _), summary) in contenders.iter().zip(&summaries) {
            let reference = *backend == "flock(1)";
            let mut what = what(backend);
            let summary = match summary {
                Ok(summary) => summary,
                Err(why) => {
                    println!("{what}: not measured: {why}");
                    self.outcomes
                        .push(Outcome::not_measured(what, &target, why));
                    continue;
                }
            };
            println!(
                "(k) {backend}: last of {READERS} readers {} after the writer (rounds: {}), one waiter {}, {}",
                ms(summary.largest),
                summary.rounds,
                ms(summary.single),
                ratio_text(summary.largest, summary.single)
            );
            if reference {
                let _ = write!(
                    what,
                    " (`flock -x` writer, `flock -s` readers: the floor of {READERS} commands started at once on this machine)"
                );
            }
            // One exclusive waiter's handoff gap, in rounds of its own: context, not the target.
            let _ = write!(
                what,
                " (one exclusive waiter: {}, the last reader {} of it; median reader {}; at least {} of {READERS} readers ran at once in every round)",
                ms(summary.single),
                ratio_text(summary.largest, summary.single),
                ms(summary.median_reader),
                summary.together
            );
            let outcome = match (&summaries[0], reference) {
                (_, true) => Outcome {
                    what,
                    measured: ms(summary.largest),
                    baseline: "-".into(),
                    ratio: "-".into(),
                    target: "- (reference)".into(),
                    pass: None,
                },
                (Ok(flock), false) => Outcome {
                    what,
                    measured: ms(summary.largest),
                    baseline: format!("{} (flock(1)'s {READERS} readers)", ms(flock.largest)),
                    ratio: ratio_text(summary.largest, flock.largest),
                    target: target.clone(),
                    pass: Some(
                        summary.largest.as_secs_f64()
                            <= READERS_SPREAD * flock.largest.as_secs_f64(),
                    ),
                },
                (Err(why), false) => Outcome::not_measured(
                    what,
                    &target,
                    &format!("flock(1)'s readers not measured: {why}"),
                ),
            };
            self.outcomes.push(outcome);
        }
    }

    /// One round of readers behind a writer, then one of a single exclusive
    /// waiter, on `locker`; their figures go to `collected`.
    fn reader_rounds(&mut self, locker: &Locker, collected: &mut Readers) -> Result<(), String> {
        let readers = Round {
            locker,
            slots: 1,
            waiters: READERS,
            waiters_mode: Mode::Shared,
            arrival: Arrival::AllInLine,
            hold: Hold::Fixed,
        };
        let served = self
            .queue_round(&readers)
            .ok_or("a round of readers did not finish")?;
        let together = served.most_waiters_at_once(1);
        if together < 2 {
            return Err(format!(
                "the {READERS} readers ran one at a time: this backend's -s did not hold them together"
            ));
        }
        let gaps = served.starts_after_holders(1);
        let largest = gaps.iter().copied().max().ok_or("no reader ran")?;
        collected.largest.push(largest);
        collected.gaps.extend(gaps);
        collected.together = collected.together.min(together);
        let single = Round {
            waiters: 1,
            waiters_mode: Mode::Exclusive,
            ..readers
        };
        let served = self
            .queue_round(&single)
            .ok_or("a single-waiter round did not finish")?;
        let gap = served.starts_after_holders(1);
        collected
            .single
            .push(*gap.first().ok_or("the single waiter did not run")?);
        Ok(())
    }

    /// Whether two `-s` runs of `locker` hold together: while a first holds, a
    /// second must get in and end. Why not otherwise: a backend without shared
    /// mode yet makes the second wait for the first.
    fn holds_together(&mut self, locker: &Locker) -> Result<(), String> {
        self.rounds += 1;
        let stamper = std::env::current_exe().expect("the benchmark's own path");
        let base = self
            .scratch
            .path()
            .join(format!("together-{}", self.rounds));
        let (log, release) = (base.with_extension("log"), base.with_extension("release"));
        let name = format!("together-{}", self.rounds);
        let lock = Lock::named(&name).mode(Mode::Shared);
        let first = [
            stamper.as_os_str(),
            "stamp".as_ref(),
            log.as_os_str(),
            "0".as_ref(),
            "until".as_ref(),
            release.as_os_str(),
        ];
        let mut first = vec![
            locker
                .command_under(lock, &first)
                .spawn()
                .expect("spawn a sharer"),
        ];
        let together = if await_path(&release.with_extension("held.0"), QUEUE_LIMIT) {
            let mut second = vec![
                locker
                    .command_under(lock, &["true"])
                    .spawn()
                    .expect("spawn a sharer"),
            ];
            match wait_until(&mut second[0], Instant::now() + TOGETHER_LIMIT) {
                Some(status) if status.success() => Ok(()),
                Some(status) => Err(format!("a second -s run beside a first failed: {status}")),
                None => {
                    stop_all(&mut second);
                    Err(format!(
                        "a second -s run waited for a first one ({} s) instead of holding beside it: no shared mode in this backend yet",
                        TOGETHER_LIMIT.as_secs()
                    ))
                }
            }
        } else {
            Err("a first -s run never got the lock".into())
        };
        fs::write(&release, "").expect("write the release marker");
        if wait_until(&mut first[0], Instant::now() + QUEUE_LIMIT).is_none() {
            stop_all(&mut first);
        }
        together
    }
}

/// (k)'s figures of one contender so far.
struct Readers {
    /// Per round, the largest of the readers' gaps.
    largest: Vec<Duration>,
    /// Every reader's gap.
    gaps: Vec<Duration>,
    /// Per round, the single waiter's gap.
    single: Vec<Duration>,
    /// The fewest readers that ran at once in a round.
    together: usize,
}

impl Default for Readers {
    fn default() -> Self {
        Self {
            largest: Vec::new(),
            gaps: Vec::new(),
            single: Vec::new(),
            together: READERS,
        }
    }
}

struct Summary {
    largest: Duration,
    median_reader: Duration,
    single: Duration,
    together: usize,
    /// Each round's largest gap, for the printout.
    rounds: String,
}

impl Readers {
    fn summary(self) -> Summary {
        let rounds = self
            .largest
            .iter()
            .map(|gap| format!("{:.2}", gap.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(", ");
        Summary {
            largest: median(self.largest),
            median_reader: median(self.gaps),
            single: median(self.single),
            together: self.together,
            rounds: format!("{rounds} ms"),
        }
    }
}
