//! (b): eight processes running `true` under one lock at once, lockrun against flock(1).

use std::thread;
use std::time::{Duration, Instant};

use crate::lockers::run_ok;
use crate::report::Outcome;
use crate::stats::{median, ms};
use crate::{Bench, CONTENDED_RUNS, CONTENDERS, CONTENTION_ROUNDS};

impl Bench {
    /// (b) 8 processes x 25 runs of `true` under one lock, both builds (and
    /// the baseline build, if given, in the same rounds).
    pub(crate) fn contention(&mut self) {
        let mut lockers = vec![self.flock.clone(), self.file.clone()];
        lockers.extend(self.file_static.clone());
        lockers.extend(self.file_baseline.clone());
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
        println!(
            "(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs, median (range) of {CONTENTION_ROUNDS}: {}",
            lockers
                .iter()
                .zip(&totals)
                .map(|(locker, rounds)| {
                    let (least, most) = (rounds.iter().min(), rounds.iter().max());
                    let range = |d: Option<&Duration>| d.copied().map(ms).unwrap_or_default();
                    format!(
                        "{} {} ({}–{})",
                        locker.label(),
                        ms(median(rounds.clone())),
                        range(least),
                        range(most)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        let totals: Vec<Duration> = totals.into_iter().map(median).collect();
        let what = |build: &str| {
            format!("(b) {CONTENDERS} processes x {CONTENDED_RUNS} runs of `true`, total, {build}")
        };
        self.ratio(what("default build"), totals[1], totals[0], 1.20);
        if self.file_baseline.is_some() {
            let last = totals.len() - 1;
            self.ratio(what("baseline build"), totals[last], totals[0], 1.20);
        }
        match &self.file_static {
            Ok(_) => self.ratio(what("static opt-in build"), totals[2], totals[0], 1.20),
            Err(why) => self.outcomes.push(Outcome::not_measured(
                what("static opt-in build"),
                "≤ 1.20× flock(1)",
                &why.clone(),
            )),
        }
    }
}
