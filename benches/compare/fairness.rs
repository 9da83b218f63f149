//! (i): first come, first served. Waiters arriving one at a time and the pairs of them served
//! out of their arrival order, per backend and for flock(1).

use crate::lockers::Mode;
use crate::queue::{Arrival, Hold, Round};
use crate::report::Outcome;
use crate::{Bench, FAIR_ROUNDS, FAIR_SPACING, FAIR_WAITERS};

impl Bench {
    /// (i) first come, first served: one holder, then waiters arriving one at a
    /// time, each once the one before it is in line; pairs served out of their
    /// arrival order, per backend and for flock(1).
    pub(crate) fn fairness(&mut self) {
        let contenders = self.every_locker();
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
                    waiters_mode: Mode::Exclusive,
                    arrival: Arrival::Spaced(FAIR_SPACING),
                    hold: Hold::Fixed,
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
}
