//! (c) and (ii): the handoff gap, from one command's end to the next one's start, in a queue of
//! waiters with one slot and with four, per backend against flock(1).

use std::time::Duration;

use crate::lockers::{Locker, Mode};
use crate::queue::{Arrival, Hold, Round};
use crate::report::Outcome;
use crate::servers::locker;
use crate::stats::{median, ms, ratio_text};
use crate::{Bench, QUEUE, QUEUE_ROUNDS, QUEUE_SETTLE, SLOTS};

impl Bench {
    /// (c) handoff gap in a queue of 12 waiters, per backend, against flock(1).
    /// Rounds are interleaved across contenders, so load from elsewhere falls on all alike.
    pub(crate) fn handoff(&mut self) {
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
        let summaries = self.queue_gaps(
            &contenders,
            1,
            Arrival::Settle(QUEUE_SETTLE),
            (Hold::Fixed, QUEUE_ROUNDS),
        );
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
    pub(crate) fn handoff_with_slots(&mut self) {
        let contenders: Vec<(&str, Result<Locker, String>, Target)> = vec![
            ("flock(1)", Ok(self.flock.clone()), Target::None),
            ("file", Ok(self.file.clone()), Target::Ratio(1.3)),
            ("sqlite", self.sqlite.clone(), Target::Ratio(2.5)),
            ("redis", locker(&self.redis), Target::Ratio(1.5)),
            ("postgres", locker(&self.postgres), Target::Ratio(2.0)),
            ("etcd", locker(&self.etcd), Target::Ratio(3.0)),
        ];
        let summaries = self.queue_gaps(
            &contenders,
            SLOTS,
            Arrival::AllInLine,
            (Hold::Fixed, QUEUE_ROUNDS),
        );
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

    /// `rounds` queue rounds of every contender, interleaved, and their gaps;
    /// an error once a round did not finish or the backend is missing.
    pub(crate) fn queue_gaps(
        &mut self,
        contenders: &[(&str, Result<Locker, String>, Target)],
        slots: u32,
        arrival: Arrival,
        (hold, rounds): (Hold, usize),
    ) -> Vec<Result<Gaps, String>> {
        let mut gaps: Vec<Result<Vec<Duration>, String>> = contenders
            .iter()
            .map(|(_, locker, _)| locker.as_ref().map(|_| Vec::new()).map_err(Clone::clone))
            .collect();
        for _ in 0..rounds {
            for ((_, locker, _), gaps) in contenders.iter().zip(&mut gaps) {
                let (Ok(locker), Ok(collected)) = (locker, gaps.as_mut()) else {
                    continue;
                };
                let round = Round {
                    locker,
                    slots,
                    waiters: QUEUE,
                    waiters_mode: Mode::Exclusive,
                    arrival,
                    hold,
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
}

pub(crate) enum Target {
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
pub(crate) struct Gaps {
    pub(crate) median: Duration,
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
