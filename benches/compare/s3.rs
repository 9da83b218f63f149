//! (l): the S3 backend on a local SeaweedFS server (issue 31): what a run costs against the
//! file backend, the handoff gap against the waiters' poll interval, and the requests the server
//! answers per acquisition with 10 waiters and with 100 (counted by SeaweedFS's own metrics).

use std::time::Duration;

use crate::handoff::Target;
use crate::lockers::{Locker, Mode};
use crate::queue::{Arrival, Hold, Round};
use crate::report::Outcome;
use crate::servers::locker;
use crate::single::interleaved_medians;
use crate::stats::{median, ms, ratio_text};
use crate::{Bench, FLAT, GROWTH, QUEUE, QUEUE_ROUNDS, QUEUE_SETTLE, S3_RUNS, WARMUP};

/// The head's poll interval for its first second after a change (docs/backends/s3.md: "S3
/// backend"): the one that applies at a handoff in [`HANDOFF_HOLDS`].
const POLL_FIRST: Duration = Duration::from_millis(50);
/// The waiters' holds in the handoff rounds: spread over ten poll intervals, so that releases
/// fall at any point of the head's interval, and all within the head's first second.
const HANDOFF_HOLDS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_millis(600));
/// Rounds of the handoff measurement: twice the others', since a gap here spreads over a
/// whole poll interval.
const HANDOFF_ROUNDS: usize = 2 * QUEUE_ROUNDS;

impl Bench {
    /// (l) the S3 backend: per-run cost, handoff gap, requests per acquisition.
    pub(crate) fn s3(&mut self) {
        let s3 = match locker(&self.s3) {
            Ok(s3) => s3,
            Err(why) => {
                println!("(l) s3: not measured: {why}");
                let what = "(l) S3 backend: per run, handoff, growth".to_owned();
                self.outcomes.push(Outcome::not_measured(what, "-", &why));
                return;
            }
        };
        let round_trip = self.s3_per_run(&s3);
        self.s3_handoff(&s3, round_trip);
        self.s3_growth(&s3);
    }

    /// Uncontended runs against the file backend's, interleaved; the
    /// requests per run; and a round trip's cost at most: the extra wall time
    /// per request (which also holds lockrun's own S3 work).
    fn s3_per_run(&mut self, s3: &Locker) -> Duration {
        let before = self.server_work(s3).unwrap_or(0);
        let medians = interleaved_medians(&[self.file.clone(), s3.clone()], "l", S3_RUNS);
        let requests = self.server_work(s3).unwrap_or(0) - before;
        let [file, measured] = medians[..] else {
            unreachable!()
        };
        let per_run = requests as f64 / (S3_RUNS + WARMUP) as f64;
        let round_trip = measured.saturating_sub(file).div_f64(per_run.max(1.0));
        println!(
            "(l) median of {S3_RUNS}: file {}, s3 {}; {per_run:.2} S3 requests per run, {} each at most",
            ms(file),
            ms(measured),
            ms(round_trip)
        );
        self.outcomes.push(Outcome {
            what: format!(
                "(l) s3 backend wall time against the file backend (S3 requests per run: {per_run:.2}; a round trip ≤ {})",
                ms(round_trip)
            ),
            measured: ms(measured),
            baseline: format!("{} (file)", ms(file)),
            ratio: ratio_text(measured, file),
            target: "-".to_owned(),
            pass: None,
        });
        round_trip
    }

    /// The handoff gap in a line of 12, beside the file backend's in the same rounds.
    fn s3_handoff(&mut self, s3: &Locker, round_trip: Duration) {
        let (least, most) = HANDOFF_HOLDS;
        let contenders = [
            ("file", Ok(self.file.clone()), Target::None),
            ("s3", Ok(s3.clone()), Target::None),
        ];
        let gaps = self.queue_gaps(
            &contenders,
            1,
            Arrival::Settle(QUEUE_SETTLE),
            (Hold::Spread(least, most), HANDOFF_ROUNDS),
        );
        let target = POLL_FIRST / 2 + round_trip * 2;
        let what = format!(
            "(l) handoff gap, s3, median of {HANDOFF_ROUNDS}x{QUEUE} handoffs of commands holding {}-{} (poll interval at a handoff {}, a round trip ≤ {})",
            ms(least),
            ms(most),
            ms(POLL_FIRST),
            ms(round_trip)
        );
        match (&gaps[0], &gaps[1]) {
            (Ok(file), Ok(gaps)) => {
                // What a handoff costs beyond the poll on any store: the release's own
                // write, and the file backend's gap (the holder's exit, the command's start).
                let floor = target + round_trip + file.median;
                println!(
                    "(l) handoff gap: file median {}, s3 median {}, floor {}",
                    ms(file.median),
                    ms(gaps.median),
                    ms(floor)
                );
                self.outcomes.push(Outcome {
                    what: format!(
                        "{what} (floor with the release's own write and the file backend's gap: {})",
                        ms(floor)
                    ),
                    measured: ms(gaps.median),
                    baseline: format!("{} (file)", ms(file.median)),
                    ratio: ratio_text(gaps.median, file.median),
                    target: format!("≤ {} (half the interval + 2 round trips)", ms(target)),
                    pass: Some(gaps.median <= target),
                });
            }
            (Err(why), _) | (_, Err(why)) => {
                let why = why.clone();
                println!("{what}: not measured: {why}");
                self.outcomes
                    .push(Outcome::not_measured(what, &ms(target), &why));
            }
        }
    }

    /// A line of 10 against one of 100: the S3 requests per acquisition,
    /// and per waiter and minute of waiting.
    fn s3_growth(&mut self, s3: &Locker) {
        let mut per_acquisition = Vec::new();
        for waiters in GROWTH {
            let round = Round {
                locker: s3,
                slots: 1,
                waiters,
                waiters_mode: Mode::Exclusive,
                arrival: Arrival::Spaced(Duration::ZERO),
                hold: Hold::Fixed,
            };
            let served = self.queue_round(&round);
            let after = self.server_work(s3);
            let figures = served.and_then(|served| {
                let requests = after? - served.work_in_line?;
                let waited: Duration = served.starts_after_holders(1).into_iter().sum();
                Some((
                    requests as f64 / waiters as f64,
                    requests as f64 / (waited.as_secs_f64() / 60.0),
                    median(served.gaps(1)),
                ))
            });
            let Some((per, per_minute, gap)) = figures else {
                let what = format!("(l) {waiters} waiters, s3: requests per acquisition");
                self.outcomes
                    .push(Outcome::not_measured(what, "-", "the line did not finish"));
                return;
            };
            println!(
                "(l) {waiters} waiters, s3: {per:.1} S3 requests per acquisition, {per_minute:.0} per waiter and minute of waiting, handoff gap {}",
                ms(gap)
            );
            per_acquisition.push((per, per_minute));
        }
        let [(short, short_minute), (long, long_minute)] = per_acquisition[..] else {
            unreachable!()
        };
        let [few, many] = GROWTH;
        let ratio = long / short;
        self.outcomes.push(Outcome {
            what: format!(
                "(l) {few} → {many} waiters, s3: S3 requests per acquisition (per waiter and minute of waiting: {short_minute:.0} → {long_minute:.0})"
            ),
            measured: format!("{long:.1} ({many} waiters)"),
            baseline: format!("{short:.1} ({few} waiters)"),
            ratio: format!("{ratio:.2}×"),
            target: format!("≤ {FLAT:.2}× (flat)"),
            pass: Some(ratio <= FLAT),
        });
    }
}
