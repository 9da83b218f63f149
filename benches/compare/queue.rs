//! The queue round shared by (c), (ii), (i), (iii) and (k): holders take every slot, waiters line
//! up behind them as the round says, the holders let go, and each command's stamp logs when it ran.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use crate::lockers::{Lock, Locker, Mode};
use crate::{Bench, QUEUE_HOLD, QUEUE_LIMIT};

/// How the waiters of a queue round line up before the holders let go.
#[derive(Clone, Copy)]
pub(crate) enum Arrival {
    /// All at once, then this long to settle.
    Settle(Duration),
    /// All at once, until the line shows every one of them.
    AllInLine,
    /// One at a time, each once the one before it is in line, this far apart.
    Spaced(Duration),
}

/// What one queue round is.
pub(crate) struct Round<'a> {
    pub(crate) locker: &'a Locker,
    /// Slots; as many holders start the round, each holding until released.
    pub(crate) slots: u32,
    pub(crate) waiters: usize,
    /// The waiters' mode; the holders are exclusive.
    pub(crate) waiters_mode: Mode,
    pub(crate) arrival: Arrival,
    pub(crate) hold: Hold,
}

/// How long each waiter's command holds the lock.
#[derive(Clone, Copy)]
pub(crate) enum Hold {
    /// Every waiter [`QUEUE_HOLD`].
    Fixed,
    /// Spread evenly over this range, in an order that follows no waiter's
    /// place, so that releases fall at any point of a waiter's poll interval.
    Spread(Duration, Duration),
}

impl Hold {
    fn of(self, waiter: usize, round: usize) -> Duration {
        match self {
            Self::Fixed => QUEUE_HOLD,
            Self::Spread(least, most) => {
                // The golden ratio's sequence: an even spread with no pattern by place.
                let step = ((waiter + round * 7) as f64 * 0.618_033_988_75).fract();
                least + most.saturating_sub(least).mul_f64(step)
            }
        }
    }
}

/// A command's run under the lock, as its stamp logged it.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// `CLOCK_MONOTONIC` nanoseconds.
    start: i128,
    end: i128,
    /// Holders 0..slots, then waiters in the order they were started.
    id: usize,
    /// The waiting process's counters when its command started.
    at_start: Counters,
}

/// A process's work so far: wake-ups (voluntary context switches) and CPU time.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub(crate) wakeups: u64,
    pub(crate) cpu_ns: u64,
}

impl Counters {
    /// `/proc/PID/status` and `/proc/PID/schedstat`.
    pub(crate) fn of(pid: u32) -> Option<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let wakeups = status.lines().find_map(|line| {
            line.strip_prefix("voluntary_ctxt_switches:")?
                .trim()
                .parse()
                .ok()
        })?;
        let schedstat = fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
        Some(Self { wakeups, cpu_ns })
    }
}

/// What a queue round gave: every command's span and, with
/// [`Arrival::AllInLine`], each waiter's counters once all were in line.
pub(crate) struct Served {
    spans: Vec<Span>,
    in_line: BTreeMap<usize, Counters>,
    /// On a server: the work it had done once the waiters were in line.
    pub(crate) work_in_line: Option<u64>,
}

impl Served {
    /// The gaps between a slot's freeing and the next command's start: with
    /// `slots` slots the k-th start after the first `slots` fills the k-th end.
    pub(crate) fn gaps(&self, slots: u32) -> Vec<Duration> {
        let mut starts: Vec<i128> = self.spans.iter().map(|s| s.start).collect();
        let mut ends: Vec<i128> = self.spans.iter().map(|s| s.end).collect();
        starts.sort_unstable();
        ends.sort_unstable();
        starts
            .iter()
            .skip(slots as usize)
            .zip(&ends)
            .map(|(start, end)| Duration::from_nanos((start - end).max(0) as u64))
            .collect()
    }

    /// Each waiter's gap from the last holder's end to its own start: with
    /// shared waiters, how long each of them waited once the holders let go.
    pub(crate) fn starts_after_holders(&self, slots: u32) -> Vec<Duration> {
        let (holders, waiters): (Vec<&Span>, Vec<&Span>) =
            self.spans.iter().partition(|s| s.id < slots as usize);
        let Some(released) = holders.iter().map(|s| s.end).max() else {
            return Vec::new();
        };
        waiters
            .iter()
            .map(|s| Duration::from_nanos((s.start - released).max(0) as u64))
            .collect()
    }

    /// The most waiters' commands that ran at once.
    pub(crate) fn most_waiters_at_once(&self, slots: u32) -> usize {
        let mut events: Vec<(i128, i64)> = self
            .spans
            .iter()
            .filter(|s| s.id >= slots as usize)
            .flat_map(|s| [(s.start, 1), (s.end, -1)])
            .collect();
        // An end and a start at the same instant: the end first.
        events.sort_unstable();
        let mut running = 0_i64;
        let mut most = 0;
        for (_, change) in events {
            running += change;
            most = most.max(running);
        }
        most as usize
    }

    /// Pairs of waiters served out of their arrival order.
    pub(crate) fn inversions(&self, slots: u32) -> usize {
        let mut served: Vec<&Span> = self
            .spans
            .iter()
            .filter(|s| s.id >= slots as usize)
            .collect();
        served.sort_by_key(|s| s.start);
        let order: Vec<usize> = served.iter().map(|s| s.id).collect();
        let mut inversions = 0;
        for (i, earlier) in order.iter().enumerate() {
            inversions += order[i + 1..]
                .iter()
                .filter(|later| *later < earlier)
                .count();
        }
        inversions
    }

    /// Wake-ups and CPU time of the waiting processes from the moment all
    /// were in line until each one's command started, per acquisition.
    pub(crate) fn waiting_work(&self) -> Option<(f64, f64)> {
        let mut wakeups = 0;
        let mut cpu_ns = 0;
        let mut waiters = 0;
        for span in &self.spans {
            let Some(joined) = self.in_line.get(&span.id) else {
                continue;
            };
            wakeups += span.at_start.wakeups.checked_sub(joined.wakeups)?;
            cpu_ns += span.at_start.cpu_ns.checked_sub(joined.cpu_ns)?;
            waiters += 1;
        }
        (waiters > 0).then(|| {
            (
                wakeups as f64 / f64::from(waiters),
                cpu_ns as f64 / f64::from(waiters) / 1e6,
            )
        })
    }
}

impl Bench {
    /// One queue round: `slots` holders that hold until released, then the
    /// waiters, each holding as the round says; `None` when it did not finish.
    pub(crate) fn queue_round(&mut self, round: &Round) -> Option<Served> {
        self.rounds += 1;
        let locker = round.locker;
        let stamper = std::env::current_exe().expect("the benchmark's own path");
        let base = self.scratch.path().join(format!("round-{}", self.rounds));
        let log = base.with_extension("log");
        let release = base.with_extension("release");
        let name = format!("queue-{}", self.rounds);
        let holders = round.slots as usize;
        let stamp = |id: usize, how: &str, value: &std::ffi::OsStr| {
            let id_text = id.to_string();
            let argv = [
                stamper.as_os_str(),
                "stamp".as_ref(),
                log.as_os_str(),
                id_text.as_ref(),
                how.as_ref(),
                value,
            ];
            let mode = if id < holders {
                Mode::Exclusive
            } else {
                round.waiters_mode
            };
            let lock = Lock::named(&name).slots(round.slots, id).mode(mode);
            locker
                .command_under(lock, &argv)
                .spawn()
                .expect("spawn a queued command")
        };
        let mut children: Vec<Child> = (0..holders)
            .map(|id| stamp(id, "until", release.as_os_str()))
            .collect();
        let held = |id: usize| release.with_extension(format!("held.{id}"));
        if !(0..holders).all(|id| await_path(&held(id), QUEUE_LIMIT)) {
            self.note(format!(
                "{}: the holders never got the lock",
                locker.label()
            ));
            stop_all(&mut children);
            return None;
        }
        let mut in_line = BTreeMap::new();
        let lined_up = line_up(round, &name, &mut children, &mut in_line, |id| {
            let hold_ms = round.hold.of(id, self.rounds).as_millis().to_string();
            stamp(id, "hold", hold_ms.as_ref())
        });
        let work_in_line = self.server_work(locker);
        if !lined_up {
            self.note(format!(
                "{}: the waiters did not line up within {} s",
                locker.label(),
                QUEUE_LIMIT.as_secs()
            ));
            stop_all(&mut children);
            return None;
        }
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
        let spans: Vec<Span> = fs::read_to_string(&log)
            .expect("the stamp log")
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let [start, end, id, wakeups, cpu_ns] = fields[..] else {
                    return None;
                };
                Some(Span {
                    start: start.parse().ok()?,
                    end: end.parse().ok()?,
                    id: id.parse().ok()?,
                    at_start: Counters {
                        wakeups: wakeups.parse().ok()?,
                        cpu_ns: cpu_ns.parse().ok()?,
                    },
                })
            })
            .collect();
        let served = Served {
            spans,
            in_line,
            work_in_line,
        };
        self.check_overlap(round, &served);
        Some(served)
    }

    /// Notes when more exclusive commands ran at once than there are slots, or
    /// a shared one beside an exclusive one.
    fn check_overlap(&mut self, round: &Round, served: &Served) {
        let slots = round.slots;
        let shared = |span: &Span| span.id >= slots as usize && round.waiters_mode == Mode::Shared;
        let mut events: Vec<(i128, i64, bool)> = served
            .spans
            .iter()
            .flat_map(|s| [(s.start, 1, shared(s)), (s.end, -1, shared(s))])
            .collect();
        // An end and a start at the same instant: the end first.
        events.sort_unstable();
        let (mut exclusive, mut sharers) = (0, 0);
        for (_, change, shared) in events {
            if shared {
                sharers += change;
            } else {
                exclusive += change;
            }
            let broken = if exclusive > i64::from(slots) {
                format!("{exclusive} commands ran at once with {slots} slot(s)")
            } else if exclusive > 0 && sharers > 0 {
                format!("{sharers} shared command(s) ran beside an exclusive one")
            } else {
                continue;
            };
            self.note(format!("{}: {broken}", round.locker.label()));
            return;
        }
    }
}

/// Starts the waiters of `round` (`stamp(id)` starts one) and waits until they
/// are in line as its arrival says; with [`Arrival::AllInLine`], records each
/// one's counters then. False when they did not line up in time.
fn line_up(
    round: &Round,
    name: &str,
    children: &mut Vec<Child>,
    in_line: &mut BTreeMap<usize, Counters>,
    stamp: impl Fn(usize) -> Child,
) -> bool {
    let holders = round.slots as usize;
    let locker = round.locker;
    let lined_up = match round.arrival {
        Arrival::Settle(settle) => {
            children.extend((0..round.waiters).map(|i| stamp(holders + i)));
            thread::sleep(settle);
            return true;
        }
        Arrival::AllInLine => {
            for i in 0..round.waiters {
                children.push(stamp(holders + i));
                // A moment between starts: lockruns started all at once would only queue for the CPU.
                thread::sleep(Duration::from_millis(2));
            }
            await_line(locker, name, |pids| pids.len() == round.waiters)
        }
        Arrival::Spaced(spacing) => (0..round.waiters).all(|i| {
            let started = Instant::now();
            let child = stamp(holders + i);
            let pid = child.id();
            children.push(child);
            let joined = await_line(locker, name, |pids| {
                pids.len() == i + 1 && pids.contains(&pid)
            });
            thread::sleep(spacing.saturating_sub(started.elapsed()));
            joined
        }),
    };
    if lined_up {
        for (i, child) in children[holders..].iter().enumerate() {
            if let Some(counters) = Counters::of(child.id()) {
                in_line.insert(holders + i, counters);
            }
        }
    }
    lined_up
}

/// Waits until the pids waiting in `name`'s line satisfy `done`; false when they did not in time.
fn await_line(locker: &Locker, name: &str, done: impl Fn(&[u32]) -> bool) -> bool {
    let deadline = Instant::now() + QUEUE_LIMIT;
    loop {
        if locker.waiting_pids(name).is_some_and(|pids| done(&pids)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn await_path(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}

pub(crate) fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
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

pub(crate) fn stop_all(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}
