//! The wait for a slot: try, then wait with jittered backoff (or in the kernel,
//! or on a wake-up), until a slot is ours or `--timeout` passes.

use std::time::Duration;

use crate::backend::{Acquired, Backend, Holder, Request, Wait};
use crate::backoff::{self, Backoff};
use crate::duration::display;
use crate::error::{Error, Result};
use crate::platform::clock::Moment;
use crate::progress::Progress;
use crate::report::{Event, Reporter, held_by};

pub struct Policy {
    /// `None` waits forever.
    pub timeout: Option<Duration>,
    pub backoff: backoff::Policy,
    pub conflict_exit_code: u8,
}

pub fn acquire(
    backend: &mut dyn Backend,
    request: &Request,
    policy: &Policy,
    reporter: &Reporter,
) -> Result<Acquired> {
    let started = Moment::now();
    let mut progress = Progress::new(reporter.speaks_to_people(), request.name.as_str(), started);
    let outcome = wait_for_slot(backend, request, policy, reporter, &mut progress, started);
    // The live line goes before anything else is said about the outcome.
    progress.finish();
    let acquired = outcome?;
    reporter.event(&Event::Acquired {
        slot: acquired.slot,
        fence: acquired.fence,
        waited: Moment::now() - started,
    });
    Ok(acquired)
}

fn wait_for_slot(
    backend: &mut dyn Backend,
    request: &Request,
    policy: &Policy,
    reporter: &Reporter,
    progress: &mut Progress,
    started: Moment,
) -> Result<Acquired> {
    let deadline = policy.timeout.map(|timeout| started + timeout);
    let mut backoff = Backoff::new(policy.backoff);
    let mut rng = rand::rng();
    let mut announced = false;
    loop {
        if let Some(acquired) = backend.try_acquire(request)? {
            return Ok(acquired);
        }
        if deadline.is_some_and(Moment::has_passed) {
            return Err(busy(backend, request, policy, started));
        }
        if !announced {
            announced = true;
            if reporter.wants_details() {
                let holders = holders(backend, request);
                progress.around(|| reporter.event(&Event::Waiting { holders: &holders }));
            }
        }
        let delay = backoff.next_wait(&mut rng, deadline.map(Moment::remaining));
        progress.around(|| reporter.event(&Event::Retry { delay }));
        let step_until = Moment::now() + delay;
        // One backoff step, cut into shorter waits while a live line needs redrawing.
        loop {
            let until = progress
                .redraw_due()
                .map_or(step_until, |due| due.min(step_until));
            let wait = Wait {
                step_until: until,
                deadline,
            };
            if let Some(acquired) = backend.wait(request, wait)? {
                return Ok(acquired);
            }
            if progress.redraw_due().is_some_and(Moment::has_passed) {
                progress.draw(&holders(backend, request));
            }
            // Back to trying when the step is over, or when the backend returned before
            // it was told to (a wake-up: a slot may have been freed).
            if until == step_until || !until.has_passed() {
                break;
            }
        }
    }
}

/// Who holds the name, for diagnostics only: a failure to look just shows nobody.
fn holders(backend: &mut dyn Backend, request: &Request) -> Vec<Holder> {
    backend.holders(Some(&request.name)).unwrap_or_default()
}

fn busy(backend: &mut dyn Backend, request: &Request, policy: &Policy, started: Moment) -> Error {
    let holders = holders(backend, request);
    let slots = match request.parallelism {
        1 => "its slot is taken".to_owned(),
        n => format!("all {n} slots are taken"),
    };
    let gave_up = match policy.timeout {
        Some(Duration::ZERO) => String::new(),
        _ => format!("; gave up after {}", display(Moment::now() - started)),
    };
    Error::Busy {
        message: format!(
            "{} is busy: {slots}{}{gave_up}",
            request.name,
            held_by(&holders)
        ),
        exit_code: policy.conflict_exit_code,
    }
}
