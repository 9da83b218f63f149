//! A taken slot's life until it is released: on lease backends, the lease's
//! timekeeping (renewed as the timing plan says; ours until the last confirmed
//! renewal + TTL; the command told to stop `--kill-grace` before that) and the
//! renewals themselves, so that the supervisor sees nothing but deadlines.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::backend::{Released, Renewal, Slot};
use crate::error::Result;
use crate::platform::clock::Moment;
use crate::report::{Event, Reporter};
use crate::timing::Plan;

/// The slots a run holds, one per name, each with its lease if it has one.
/// Its moments are those of the lease that ends first; losing any lease
/// loses the run's right to go on (docs/guide.md: "Several names").
#[derive(Default)]
pub struct Held {
    locks: Vec<HeldLock>,
}

/// One name's slot, with its lease and the reporter that speaks of it.
struct HeldLock {
    slot: Box<dyn Slot>,
    lease: Option<LeaseClock>,
    reporter: Reporter,
}

/// What [`Held::check`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseVerdict {
    Keep,
    /// The lease on `name` cannot be kept: stop the command now, and kill it
    /// after `grace` (it must be gone before another holder can have the slot).
    Stop {
        name: String,
        reason: &'static str,
        grace: Duration,
    },
}

impl Held {
    /// Adds `slot` of the lock `reporter` speaks of, with a lease timed by
    /// `plan` (when the backend has leases), of the TTL the store granted if
    /// it differs, whose command gets `grace` between SIGTERM and the end of the lease.
    pub fn push(
        &mut self,
        slot: Box<dyn Slot>,
        plan: Option<Plan>,
        grace: Duration,
        reporter: Reporter,
    ) {
        let lease = plan.map(|plan| {
            let plan = slot.granted_ttl().map_or(plan, Plan::new);
            LeaseClock::new(slot.taken_at(), plan, grace)
        });
        self.locks.push(HeldLock {
            slot,
            lease,
            reporter,
        });
    }

    /// Each lock's slot number and fence, in the order they were taken.
    pub fn slots(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.locks
            .iter()
            .map(|lock| (lock.slot.number(), lock.slot.fence()))
    }

    /// The open files whose kernel locks hold the slots (the file
    /// backend's), for the watchdog to keep until the command's group is gone.
    pub fn lock_files(&self) -> Vec<BorrowedFd<'_>> {
        self.locks
            .iter()
            .flat_map(|lock| lock.slot.lock_files())
            .collect()
    }

    fn leases(&self) -> impl Iterator<Item = &LeaseClock> {
        self.locks.iter().filter_map(|lock| lock.lease.as_ref())
    }

    /// When [`Held::check`] must run next: a renewal, or the command's stop. `None` without a lease.
    pub fn due(&self) -> Option<Moment> {
        self.leases()
            .map(|lease| lease.renewal_due().min(lease.stop_at()))
            .min()
    }

    /// When the command gets SIGTERM if no renewal is confirmed before.
    pub fn stop_at(&self) -> Option<Moment> {
        self.leases().map(LeaseClock::stop_at).min()
    }

    /// The name whose lease ends first (the first name without leases): the
    /// one a stop at [`Held::stop_at`] is for.
    pub fn ending_first(&self) -> &str {
        self.locks
            .iter()
            .min_by_key(|lock| lock.lease.as_ref().map(LeaseClock::deadline))
            .map_or("", |lock| lock.reporter.name())
    }

    /// When the command must be gone: another holder may have a slot from then on.
    pub fn deadline(&self) -> Option<Moment> {
        self.leases().map(LeaseClock::deadline).min()
    }

    /// Renews the lease whose renewal is most overdue, if one is, and says
    /// whether the command may go on. One renewal per check: each is a call
    /// to a server that may take its whole bound, and the caller goes back to
    /// its signals between checks ([`Held::due`] has passed while another is due).
    pub fn check(&mut self) -> LeaseVerdict {
        let most_due = self
            .locks
            .iter()
            .enumerate()
            .filter_map(|(at, lock)| Some((lock.lease.as_ref()?.renewal_due(), at)))
            .filter(|(due, _)| due.has_passed())
            .min()
            .map(|(_, at)| at);
        let mut at = 0;
        self.each(|lock| {
            let renews = most_due == Some(at);
            at += 1;
            lock.check(renews)
        })
    }

    /// Before the command starts: see [`HeldLock::confirm`].
    pub fn confirm(&mut self) -> LeaseVerdict {
        self.each(HeldLock::confirm)
    }

    /// `verdict` of every lock: the first stop, with the shortest grace any asked for.
    fn each(&mut self, mut verdict: impl FnMut(&mut HeldLock) -> LeaseVerdict) -> LeaseVerdict {
        let mut first = LeaseVerdict::Keep;
        for lock in &mut self.locks {
            match (&mut first, verdict(lock)) {
                (_, LeaseVerdict::Keep) => {}
                (LeaseVerdict::Keep, stop) => first = stop,
                (LeaseVerdict::Stop { grace, .. }, LeaseVerdict::Stop { grace: other, .. }) => {
                    *grace = (*grace).min(other);
                }
            }
        }
        first
    }

    /// Gives every slot up (see [`Slot::release`]), the last taken first, and
    /// reports each release.
    pub fn release(self, keep_until: Option<Moment>) -> Releases {
        let mut releases = Releases::default();
        for lock in self.locks.into_iter().rev() {
            let number = lock.slot.number();
            let name = lock.reporter.name().to_owned();
            match lock.slot.release(keep_until) {
                Ok(outcome) => {
                    lock.reporter.event(&Event::Released { slot: number });
                    if outcome == Released::Lost {
                        releases.lost.get_or_insert(name);
                    }
                }
                Err(err) => releases
                    .failed
                    .push(format!("could not release {name}: {err}")),
            }
        }
        releases
    }
}

/// What releasing a run's slots found.
#[derive(Debug, Default)]
pub struct Releases {
    /// A name whose lease was gone already (expired or broken): another
    /// holder may have had its slot.
    pub lost: Option<String>,
    /// Why each slot that could not be released was not: its lease lapses by itself.
    pub failed: Vec<String>,
}

impl HeldLock {
    /// Renews the lease when a renewal is due and `renews`, and says whether the command may go on.
    fn check(&mut self, renews: bool) -> LeaseVerdict {
        let Some(lease) = &mut self.lease else {
            return LeaseVerdict::Keep;
        };
        let stop = |reason, grace| LeaseVerdict::Stop {
            name: self.reporter.name().to_owned(),
            reason,
            grace,
        };
        if lease.deadline().has_passed() {
            // Paused (SIGSTOP, a frozen VM, a stopped job) past the deadline: another holder may run already.
            return stop(
                "its deadline passed while lockrun was paused",
                Duration::ZERO,
            );
        }
        if renews && lease.renewal_due().has_passed() {
            // An answer after the stop is due would come too late to spare the command.
            match renew(
                self.slot.as_mut(),
                lease,
                lease.stop_at().remaining(),
                &self.reporter,
            ) {
                Ok(Renewal::Renewed) => {}
                Ok(Renewal::Lost) => {
                    // Another holder may have the slot already: never past the old deadline.
                    let grace = lease.grace.min(lease.deadline().remaining());
                    return stop("it was broken or expired", grace);
                }
                Err(err) => {
                    lease.renewal_failed(Moment::now());
                    self.reporter.event(&Event::Notice {
                        message: &format!("could not renew the lease: {err}"),
                    });
                }
            }
        }
        // Checked even when no renewal was due: a failed one is retried later than the stop may be.
        if lease.deadline().has_passed() {
            stop(
                "its deadline passed before a renewal was confirmed",
                Duration::ZERO,
            )
        } else if lease.stop_at().has_passed() {
            stop(
                "no renewal was confirmed in time",
                lease.deadline().remaining(),
            )
        } else {
            LeaseVerdict::Keep
        }
    }

    /// Before the command starts: a lease close to its stop already (its slot's
    /// answer came late: a database busy for a while) is renewed now, even past
    /// its deadline, as nothing runs under it yet. `Keep` once it is confirmed.
    /// One merely due for renewal is renewed once the command runs, as ever.
    fn confirm(&mut self) -> LeaseVerdict {
        let Some(lease) = &mut self.lease else {
            return LeaseVerdict::Keep;
        };
        if lease.stop_at().remaining() >= lease.plan.confirm_margin() {
            return LeaseVerdict::Keep;
        }
        let within = lease.plan.renew_every();
        let reason = match renew(self.slot.as_mut(), lease, within, &self.reporter) {
            Ok(Renewal::Renewed) => return LeaseVerdict::Keep,
            Ok(Renewal::Lost) => "it was broken or expired",
            Err(_) => "no renewal was confirmed in time",
        };
        LeaseVerdict::Stop {
            name: self.reporter.name().to_owned(),
            reason,
            grace: Duration::ZERO,
        }
    }
}

/// Renews `slot`'s `lease`, waiting `within` for the answer, and keeps the time of a confirmed renewal.
fn renew(
    slot: &mut dyn Slot,
    lease: &mut LeaseClock,
    within: Duration,
    reporter: &Reporter,
) -> Result<Renewal> {
    let sent = Moment::now();
    let renewal = slot.renew(within)?;
    if renewal == Renewal::Renewed {
        lease.renewed(sent);
        reporter.event(&Event::Renewed {
            ttl: lease.plan.ttl(),
        });
    }
    Ok(renewal)
}

/// The lease's clock, on the monotonic clock of this host.
#[derive(Debug)]
struct LeaseClock {
    plan: Plan,
    grace: Duration,
    confirmed_until: Moment,
    next_renewal: Moment,
}

impl LeaseClock {
    /// A lease whose acquisition was sent at `sent` (it cannot run longer than from then).
    fn new(sent: Moment, plan: Plan, grace: Duration) -> Self {
        Self {
            plan,
            grace,
            confirmed_until: sent + plan.ttl(),
            next_renewal: sent + plan.renew_every(),
        }
    }

    fn renewal_due(&self) -> Moment {
        self.next_renewal
    }

    /// When the command gets SIGTERM if no renewal is confirmed before.
    fn stop_at(&self) -> Moment {
        self.confirmed_until - self.grace
    }

    /// When another holder may get the slot: the command must be gone by then.
    fn deadline(&self) -> Moment {
        self.confirmed_until
    }

    /// A renewal sent at `sent` was confirmed.
    fn renewed(&mut self, sent: Moment) {
        self.confirmed_until = self.confirmed_until.max(sent + self.plan.ttl());
        self.next_renewal = sent + self.plan.renew_every();
    }

    /// A renewal could not be confirmed: try again soon, well before the stop.
    fn renewal_failed(&mut self, now: Moment) {
        self.next_renewal = now + self.plan.renewal_retry();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Plan = Plan::new(Duration::from_secs(30));
    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn renewal_is_due_at_a_third_of_the_ttl() {
        let start = Moment::now();
        let lease = LeaseClock::new(start, TTL, GRACE);
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(10));
        assert_eq!(lease.deadline() - start, TTL.ttl());
        assert_eq!(lease.stop_at() - start, Duration::from_secs(20));
    }

    #[test]
    fn a_renewal_extends_from_when_it_was_sent() {
        let start = Moment::now();
        let mut lease = LeaseClock::new(start, TTL, GRACE);
        lease.renewed(start + Duration::from_secs(10));
        assert_eq!(lease.deadline() - start, Duration::from_secs(40));
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(20));
    }

    #[test]
    fn failures_retry_soon_without_moving_the_deadline() {
        let start = Moment::now();
        let mut lease = LeaseClock::new(start, TTL, GRACE);
        lease.renewal_failed(start + Duration::from_secs(10));
        assert_eq!(lease.renewal_due() - start, Duration::from_secs(11));
        assert_eq!(lease.deadline() - start, TTL.ttl());
    }
}
