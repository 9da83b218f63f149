//! (iii): a line of 10 waiters against one of 100. The handoff gap, the waiting processes'
//! wake-ups and CPU time and the server's work per acquisition should not grow with the line.

use std::time::Duration;

use crate::lockers::{Locker, Mode};
use crate::queue::{Arrival, Hold, Round};
use crate::report::Outcome;
use crate::servers::work_unit;
use crate::stats::{median, ms};
use crate::{Bench, FLAT, GROWTH};

impl Bench {
    /// (iii) a line of 10 waiters against one of 100: the handoff gap and the
    /// waiting processes' work per acquisition (wake-ups, CPU time; on a
    /// server: its work) should not grow with the line.
    pub(crate) fn growth(&mut self) {
        let contenders = self.every_locker();
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
                    waiters_mode: Mode::Exclusive,
                    arrival: Arrival::Spaced(Duration::ZERO),
                    hold: Hold::Fixed,
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
