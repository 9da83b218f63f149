//! The wait for a slot, the same on every backend: look at the line, drop dead
//! entries of this host from it, wait until it moves (in the kernel, on a
//! wake-up, or a backoff step), ride out trouble with the backend, until a slot
//! is ours or `--timeout` passes.

use std::thread;
use std::time::Duration;

use crate::backend::{Attempt, Entry, Line, Mode, Owner, Request, Slot, Store, Waited, Wakeup};
use crate::backoff::{self, Backoff};
use crate::duration::display;
use crate::error::{Error, Result};
use crate::lease::{Held, LeaseVerdict};
use crate::platform::clock::Moment;
use crate::platform::interrupt;
use crate::platform::proc::ancestors;
use crate::platform::watchdog::Watchdog;
use crate::progress::Progress;
use crate::report::{Event, Reporter, Retry, held_by};

/// How often a waiter first or second in line looks whether an entry ahead of
/// it on this host has died.
const LIVENESS_POLL: Duration = Duration::from_millis(100);
/// The same further back, where a dead entry holds nobody up before the line
/// moves up to it: a waiter that drops one is a place nearer, and looks more often.
const LIVENESS_POLL_BEHIND: Duration = Duration::from_secs(1);
/// How long a `--no-wait` run rides out trouble with the store (a server's
/// restart, an election, a failover) before it gives up with 69: seconds,
/// not the minutes a waiting run may take (docs/guide.md: "When the server has trouble").
pub const NO_WAIT_RIDE_OUT: Duration = Duration::from_secs(10);

pub struct WaitPolicy {
    /// `None` waits forever.
    pub timeout: Option<Duration>,
    pub backoff: backoff::Policy,
    pub conflict_exit_code: u8,
    /// The run's `-p N` as the user gave it (`LOCKRUN_PARALLELISM=N`), for messages.
    pub parallelism_said: String,
}

/// Waits for a slot of `request.name`, keeping the leases of the names
/// `held` already (docs/guide.md: "Several names") alive meanwhile. A run
/// that has to wait starts the command's `watchdog` before it does.
pub fn acquire(
    store: &mut dyn Store,
    request: &Request,
    policy: &WaitPolicy,
    reporter: &Reporter,
    held: &mut Held,
    watchdog: &mut Option<Watchdog>,
) -> Result<Box<dyn Slot>> {
    let started = Moment::now();
    let mut waiter = WaitLoop {
        store,
        request,
        policy,
        reporter,
        held,
        watchdog,
        progress: Progress::new(reporter.speaks_to_people(), request.name.as_str(), started),
        started,
        deadline: request.deadline,
        backoff: Backoff::new(policy.backoff),
        step_until: None,
        reached: false,
        looked_for_ancestors: false,
        reported: None,
    };
    let outcome = waiter.wait_for_slot();
    if outcome.is_err() && waiter.reached {
        // Best effort: a place left behind is dropped by its TTL (or the kernel) anyway.
        // A store that never answered has no place of ours to leave.
        let _ = waiter.store.leave(request);
    }
    // The live line goes before anything else is said about the outcome.
    waiter.progress.finish();
    let slot = outcome?;
    reporter.event(&Event::Acquired {
        slot: slot.number(),
        fence: slot.fence(),
        waited: Moment::now() - started,
    });
    Ok(slot)
}

struct WaitLoop<'a> {
    store: &'a mut dyn Store,
    request: &'a Request,
    policy: &'a WaitPolicy,
    reporter: &'a Reporter,
    /// The slots of the names taken before this one, whose leases must not lapse while we wait.
    held: &'a mut Held,
    /// The command's, started before the first wait if it can be: forking it
    /// then is not on the way from the release that lets us in to the command's start.
    watchdog: &'a mut Option<Watchdog>,
    progress: Progress,
    started: Moment,
    deadline: Option<Moment>,
    backoff: Backoff,
    /// When the current backoff step ends, on a backend that is told when the line moves.
    step_until: Option<Moment>,
    /// Whether the store answered once: trouble that outlasts the wait then
    /// means the slot was not had in time, not that the store is unavailable.
    reached: bool,
    /// Whether a look that found us waiting asked whether our own ancestors hold every slot.
    looked_for_ancestors: bool,
    /// The place in line last reported.
    reported: Option<u32>,
}

impl WaitLoop<'_> {
    fn wait_for_slot(&mut self) -> Result<Box<dyn Slot>> {
        loop {
            self.keep_held()?;
            let line = match self.store.attempt(self.request) {
                Ok(Attempt::Taken(slot)) => return Ok(slot),
                Ok(Attempt::Waiting(line)) => line,
                Err(err) => {
                    self.ride_out(err)?;
                    continue;
                }
            };
            self.reached = true;
            if let Some(theirs) = line.other_parallelism {
                return Err(self.other_parallelism(theirs));
            }
            let dead: Vec<Owner> = line
                .local_ahead
                .iter()
                .filter(|owner| owner.process.is_gone())
                .cloned()
                .collect();
            if !dead.is_empty() {
                if let Err(err) = self.store.evict(self.request, &dead) {
                    self.ride_out(err)?;
                }
                continue;
            }
            if !self.request.queue || self.deadline.is_some_and(Moment::has_passed) {
                return Err(self.busy(None));
            }
            if !self.looked_for_ancestors
                && let Some(err) = self.waiting_for_itself()
            {
                return Err(err);
            }
            self.looked_for_ancestors = true;
            self.report(&line);
            if let Some(slot) = self.wait_for_change(&line)? {
                return Ok(slot);
            }
            if self.progress.redraw_due().is_some_and(Moment::has_passed) {
                let holders = self.holders();
                self.progress.draw(&holders, line.position);
            }
        }
    }

    /// Waits until the line may have moved for us. A wait that ends only to
    /// see whether an entry ahead on this host died looks at its process, not
    /// at the store: the store needs asking only when one did.
    fn wait_for_change(&mut self, line: &Line) -> Result<Option<Box<dyn Slot>>> {
        // Fixed once: the process checks below must not push back a look that
        // keeps our place in line alive.
        let look = self.next_look(line);
        if self.watchdog.is_none() {
            // A fork refused now (a process limit reached) is tried again before the command.
            *self.watchdog = interrupt::start_watchdog().ok();
        }
        let ahead_gone = || line.local_ahead.iter().any(|owner| owner.process.is_gone());
        let every = if line.position <= 2 {
            LIVENESS_POLL
        } else {
            LIVENESS_POLL_BEHIND
        };
        loop {
            let check = (!line.local_ahead.is_empty())
                .then(|| Moment::now() + every)
                .filter(|check| *check < look);
            match self.store.wait(self.request, check.unwrap_or(look)) {
                Ok(Waited::Taken(slot)) => return Ok(Some(slot)),
                Ok(Waited::Quiet) if check.is_some() && !ahead_gone() => {}
                Ok(_) => return Ok(None),
                Err(err) => {
                    self.ride_out(err)?;
                    return Ok(None);
                }
            }
        }
    }

    /// When to look at the line again at the latest.
    fn next_look(&mut self, line: &Line) -> Moment {
        let abilities = self.store.abilities();
        let mut looks = vec![self.deadline, line.moves_by, self.progress.redraw_due()];
        if abilities.wakeup == Wakeup::Told && !line.watched {
            // A notice can be lost: a backoff step bounds how long that keeps us asleep.
            let step_until =
                if let Some(until) = self.step_until.filter(|until| !until.has_passed()) {
                    until
                } else {
                    let delay = self.backoff.next_wait(self.remaining());
                    self.progress.around(|| {
                        self.reporter.event(&Event::Retry {
                            retry: Retry::Contended,
                            position: line.position,
                            delay: Some(delay),
                        });
                    });
                    self.reported = Some(line.position);
                    Moment::now() + delay
                };
            self.step_until = Some(step_until);
            looks.push(Some(step_until));
        }
        if abilities.leases {
            // A waiter's place lapses with its TTL unless it asks again.
            looks.push(Some(Moment::now() + self.request.plan.keep_place_every()));
        }
        looks.push(self.held.due());
        looks
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Moment::now() + Duration::from_secs(3600))
    }

    /// The first look says that we wait and who holds the slots; later ones, when our place changed.
    fn report(&mut self, line: &Line) {
        if !self.reporter.wants_details() || self.reported == Some(line.position) {
            return;
        }
        let holders = if self.reported.is_none() {
            self.holders()
        } else {
            Vec::new()
        };
        let event = match self.reported {
            None => Event::Waiting {
                holders: &holders,
                position: line.position,
            },
            Some(_) => Event::Retry {
                retry: Retry::Contended,
                position: line.position,
                delay: None,
            },
        };
        self.progress.around(|| self.reporter.event(&event));
        self.reported = Some(line.position);
    }

    /// Rides out trouble that may pass, from the first contact on, a backoff
    /// step at a time: until `--timeout`, or for [`NO_WAIT_RIDE_OUT`] with
    /// `--no-wait`. What waiting cannot fix ends the wait at once. Trouble
    /// still there at the end is the store's unavailability (69), unless the
    /// store answered before: then the slot was not had in time (75).
    fn ride_out(&mut self, err: Error) -> Result<()> {
        let Some(retry) = Retry::for_error(&err) else {
            return Err(err);
        };
        let until = if self.request.queue {
            self.deadline
        } else {
            Some(self.started + NO_WAIT_RIDE_OUT)
        };
        if until.is_some_and(Moment::has_passed) {
            return Err(if self.reached {
                self.busy(Some(&err))
            } else {
                err
            });
        }
        let mut delay = self.backoff.next_wait(until.map(Moment::remaining));
        if self.reached && self.store.abilities().leases {
            // A place in line lapses unless its waiter asks every TTL/3:
            // trouble that passes must not cost it its place, nor keep a
            // slot granted to it meanwhile from the others.
            delay = delay.min(self.request.plan.keep_place_every());
        }
        self.progress.around(|| {
            self.reporter.event(&Event::Retry {
                retry,
                position: self.reported.unwrap_or(0),
                delay: Some(delay),
            });
        });
        let renewal = self.held.due().map_or(delay, Moment::remaining);
        thread::sleep(delay.min(renewal));
        Ok(())
    }

    /// Renews the leases of the names held already when due; one that is
    /// lost ends the wait, as nothing may run without it.
    fn keep_held(&mut self) -> Result<()> {
        match self.held.check() {
            LeaseVerdict::Keep => Ok(()),
            LeaseVerdict::Stop { name, reason, .. } => Err(Error::LeaseLost(format!(
                "the lease on {name} was lost while waiting for {} ({reason}); the command did not start",
                self.request.name
            ))),
        }
    }

    fn remaining(&self) -> Option<Duration> {
        self.deadline.map(Moment::remaining)
    }

    /// Who holds the slots now, for messages: a failure to look just shows nobody.
    fn holders(&mut self) -> Vec<Entry> {
        self.store.holders(&self.request.name).unwrap_or_default()
    }

    /// Inside a command that lockrun runs (`LOCKRUN_TOKEN` is set), a wait
    /// for a name whose every slot our own ancestors hold would last until
    /// `--timeout`: they wait for us to end. Then the error that says so.
    fn waiting_for_itself(&mut self) -> Option<Error> {
        std::env::var_os("LOCKRUN_TOKEN")?;
        let ancestors = ancestors();
        let host = &self.request.owner.process.host;
        let ours: Vec<String> = self
            .holders()
            .iter()
            .filter(|holder| holder.host == *host && ancestors.contains(&holder.pid))
            .map(|holder| holder.pid.to_string())
            .collect();
        if ours.len() < self.request.parallelism as usize {
            return None;
        }
        Some(Error::Busy {
            message: format!(
                "{} is held by this run's own ancestor (pid {}): it would wait for itself",
                self.request.name,
                ours.join(", pid ")
            ),
            exit_code: self.policy.conflict_exit_code,
        })
    }

    /// A name's slot count is part of the lock (docs/guide.md: "Slots"): a run
    /// with another `-p` than the name's holders or waiters is a mistake.
    fn other_parallelism(&self, theirs: u32) -> Error {
        Error::Usage(format!(
            "{} is held or waited for with -p {theirs}; this run asked for {}: a name's slot count is part of the lock",
            self.request.name, self.policy.parallelism_said
        ))
    }

    fn busy(&mut self, trouble: Option<&Error>) -> Error {
        let slots = match (self.request.mode(), self.request.parallelism) {
            (Mode::Shared, _) => "an exclusive run holds it or waits for it".to_owned(),
            (Mode::Exclusive, 1) => "its slot is taken".to_owned(),
            (Mode::Exclusive, n) => format!("all {n} slots are taken"),
        };
        let gave_up = match self.policy.timeout {
            Some(Duration::ZERO) => String::new(),
            _ => format!("; gave up after {}", display(Moment::now() - self.started)),
        };
        let name = &self.request.name;
        let message = if let Some(err) = trouble {
            format!("no slot of {name} acquired: {err}{gave_up}")
        } else {
            let held = held_by(&self.holders());
            let held = if held.is_empty() {
                held
            } else {
                format!(": {held}")
            };
            format!("{name} is busy: {slots}{held}{gave_up}")
        };
        Error::Busy {
            message,
            exit_code: self.policy.conflict_exit_code,
        }
    }
}
