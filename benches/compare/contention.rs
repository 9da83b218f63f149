//! (b): eight processes running `true` under one lock at once, lockrun against flock(1).

use std::thread;
use std::time::{Duration, Instant};

use crate::lockers::run_ok;
use crate::report::Outcome;
use crate::stats::{median, ms};
use crate::{Bench, CONTENDED_RUNS, CONTENDERS, CONTENTION_ROUNDS};

impl Bench {
    /// (b) 8 processes x 25 runs of `true` under one lock, both builds.
    pub(crate) fn contention(&mut self) {
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
}
