//! `lockrun --name NAME -- COMMAND`: acquire a slot, run the command under
//! supervision, release, and exit with the command's status.

use std::ffi::OsString;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use crate::acquire::{self, acquire};
use crate::backend::{self, Owner, Request};
use crate::backoff;
use crate::cli::RunArgs;
use crate::error::{Error, Result};
use crate::identity::{Process, new_token};
use crate::lease::Lease;
use crate::platform::clock::Moment;
use crate::report::{Event, Reporter};
use crate::supervisor::{self, Ending, Limits, Program, Signals};

const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

pub fn run(args: RunArgs, reporter: &Reporter) -> Result<u8> {
    let policy = wait_policy(&args);
    let name = args
        .name
        .ok_or_else(|| Error::Usage("--name is required".into()))?;
    let program = program(args.shell_command, args.command)?;
    let kind = args.store.backend;
    let mut kill_grace = args.kill_grace.unwrap_or(DEFAULT_KILL_GRACE);
    if kind.uses_leases() {
        // The command must be gone before the lease could pass to another holder.
        kill_grace = kill_grace.min(args.ttl / 3);
    }
    let request = Request {
        name,
        parallelism: args.parallelism,
        ttl: args.ttl,
        owner: Owner {
            token: new_token(),
            process: owner_process(kind),
            command: program.display(),
        },
    };

    supervisor::reset_inherited()?;
    let mut backend = open_backend(&args.store.location(), reporter)?;
    let acquired = acquire(backend.as_mut(), &request, &policy, reporter)?;
    let acquired_at = (SystemTime::now(), Moment::now());
    let slot = acquired.slot;
    let env = [
        ("LOCKRUN_NAME", request.name.to_string()),
        ("LOCKRUN_BACKEND", kind.as_str().to_owned()),
        ("LOCKRUN_SLOT", slot.to_string()),
        ("LOCKRUN_PARALLELISM", request.parallelism.to_string()),
        ("LOCKRUN_TOKEN", request.owner.token.clone()),
        ("LOCKRUN_FENCE", acquired.fence.to_string()),
    ];
    let lease = kind
        .uses_leases()
        .then(|| Lease::new(acquired.sent, request.ttl, kill_grace));
    let limits = Limits {
        max_runtime: args.max_runtime,
        kill_grace,
    };

    let ending = Signals::block().and_then(|signals| {
        let ending = supervisor::supervise(
            &program,
            &env,
            &signals,
            backend.as_mut(),
            lease,
            &limits,
            reporter,
        );
        if !kind.uses_leases() && !args.min_hold.is_zero() {
            // A file lock lives only as long as its holder: stay until the minimum hold is over.
            hold_until(&signals, acquired_at.1 + args.min_hold)?;
        }
        ending
    });
    let keep_until = (!args.min_hold.is_zero()).then(|| acquired_at.0 + args.min_hold);
    let released = backend.release(keep_until);
    if released.is_ok() {
        reporter.event(&Event::Released { slot });
    }
    let ending = ending?;
    match released {
        // The lease is gone already; a failed release (the server is down) changes nothing.
        Err(err) if matches!(ending, Ending::LeaseLost(_)) => reporter.event(&Event::Notice {
            message: &format!("could not release: {err}"),
        }),
        released => released?,
    }
    report_ending(&ending, &request, reporter);
    Ok(ending.exit_code())
}

fn program(shell_command: Option<OsString>, command: Vec<OsString>) -> Result<Program> {
    match (shell_command, command) {
        (Some(script), _) => Ok(Program::Shell(script)),
        (None, words) if !words.is_empty() => Ok(Program::Argv(words)),
        (None, _) => Err(Error::Usage(
            "no command given: add -- COMMAND [ARG]... or -c 'SHELL COMMAND'".into(),
        )),
    }
}

fn wait_policy(args: &RunArgs) -> acquire::Policy {
    acquire::Policy {
        timeout: if args.no_wait {
            Some(Duration::ZERO)
        } else {
            args.timeout.0
        },
        backoff: backoff::Policy {
            initial_delay: args.initial_delay,
            max_delay: args.max_delay,
            multiplier: args.backoff_multiplier,
        },
        conflict_exit_code: args.conflict_exit_code,
    }
}

/// The one line for an ending that lockrun caused.
fn report_ending(ending: &Ending, request: &Request, reporter: &Reporter) {
    match ending {
        Ending::Exited(_) => {}
        Ending::LeaseLost(reason) => reporter.error(&format!(
            "stopped the command: the lease on {} was lost ({reason})",
            request.name
        )),
        Ending::MaxRuntime(max) => reporter.error(&format!(
            "stopped the command: --max-runtime {} passed",
            crate::duration::display(*max)
        )),
    }
}

/// Opens the backend; with `-v`, warns about its setup.
fn open_backend(
    location: &backend::Location,
    reporter: &Reporter,
) -> Result<Box<dyn backend::Backend>> {
    let mut backend = backend::open(location)?;
    if reporter.wants_details() {
        for warning in backend.warnings() {
            reporter.event(&Event::Notice { message: &warning });
        }
    }
    Ok(backend)
}

/// Sleeps until `until`; a SIGTERM or SIGINT ends the wait early.
fn hold_until(signals: &Signals, until: Moment) -> Result<()> {
    while !until.has_passed() {
        if let Some(Signal::SIGTERM | Signal::SIGINT) = signals.next(until.remaining())? {
            break;
        }
    }
    Ok(())
}

/// Only lease backends reclaim a dead holder by its process identity.
fn owner_process(kind: backend::Kind) -> Process {
    if kind.uses_leases() {
        Process::current()
    } else {
        Process::current_without_liveness()
    }
}
