//! `lockrun --name NAME -- COMMAND`: acquire a slot, run the command under
//! supervision, release, and exit with the command's status.

use std::ffi::OsString;
use std::time::{Duration, SystemTime};

use crate::acquire::{self, acquire};
use crate::backend::{Owner, Released, Request, Store};
use crate::backoff;
use crate::cli::RunArgs;
use crate::error::{Error, Result};
use crate::identity::{Process, new_token};
use crate::lease::Held;
use crate::platform::clock::Moment;
use crate::report::{Event, Reporter};
use crate::supervisor::{self, Ending, Limits, Program, Signals};
use crate::timing::Plan;

pub fn run(args: RunArgs, reporter: &Reporter) -> Result<u8> {
    let policy = wait_policy(&args);
    let name = args
        .name
        .ok_or_else(|| Error::Usage("--name is required".into()))?;
    let program = program(args.shell_command, args.command)?;

    supervisor::reset_inherited().map_err(Error::system)?;
    let mut store = open_store(&args.store, reporter)?;
    let leases = store.abilities().leases;
    let plan = Plan::new(args.ttl);
    let kill_grace = plan.kill_grace(args.kill_grace, leases);
    let request = Request {
        name,
        parallelism: args.parallelism,
        plan,
        owner: Owner {
            token: new_token()?,
            // Only a lease's holder can be reclaimed early by its process's death;
            // the kernel frees a dead holder's lock by itself.
            process: if leases {
                Process::current()
            } else {
                Process::current_without_liveness()
            },
            command: program.display(),
            parallelism: Some(args.parallelism),
        },
        queue: policy.timeout != Some(Duration::ZERO),
        deadline: policy.timeout.map(|timeout| Moment::now() + timeout),
    };
    let slot = acquire(store.as_mut(), &request, &policy, reporter)?;
    drop(store);
    let acquired_at = SystemTime::now();
    let mut held = Held::new(slot, leases.then_some(plan), kill_grace);
    let number = held.number();
    let env = [
        ("LOCKRUN_NAME", request.name.to_string()),
        ("LOCKRUN_BACKEND", args.store.backend.clone()),
        ("LOCKRUN_SLOT", number.to_string()),
        ("LOCKRUN_PARALLELISM", request.parallelism.to_string()),
        ("LOCKRUN_TOKEN", request.owner.token.clone()),
        ("LOCKRUN_FENCE", held.fence().to_string()),
    ];
    let limits = Limits {
        // 0 means no limit, as for timeout(1).
        max_runtime: args.max_runtime.filter(|max| !max.is_zero()),
        kill_grace,
    };

    let ending = Signals::block().map_err(Error::system).and_then(|signals| {
        supervisor::supervise(&program, &env, &signals, &mut held, &limits, reporter)
    });
    let keep_until = (!args.min_hold.is_zero()).then(|| acquired_at + args.min_hold);
    // A lease that ran out by its deadline after the command ended (lockrun
    // paused since) was not taken from the command while it ran.
    let lapsed = held.deadline().is_some_and(Moment::has_passed);
    let released = held.release(keep_until);
    if released.is_ok() {
        reporter.event(&Event::Released { slot: number });
    }
    let mut ending = ending?;
    if let (Ok(Released::Lost), Ending::Exited(code), false) = (&released, &ending, lapsed) {
        // Broken or taken while the command ran: another holder may have run beside it.
        reporter.event(&Event::Lost {
            reason: "it was found gone at release",
        });
        ending = Ending::FoundLost(*code);
    }
    if let Err(err) = released {
        // The command's run is over either way: its status stands, and a lease
        // that could not be released lapses by itself.
        let message = format!("could not release {}: {err}", request.name);
        if matches!(ending, Ending::LeaseLost(_) | Ending::LostBeforeStart(_)) {
            reporter.event(&Event::Notice { message: &message });
        } else {
            reporter.error(&format!("{message}; its lease lapses within --ttl"));
        }
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

fn wait_policy(args: &RunArgs) -> acquire::WaitPolicy {
    acquire::WaitPolicy {
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
        Ending::FoundLost(code) => reporter.error(&format!(
            "the lease on {} was found lost when lockrun released it (broken or expired): another run may have held the slot meanwhile; the command exited with status {code}",
            request.name
        )),
        Ending::LostBeforeStart(reason) => reporter.error(&format!(
            "did not start the command: the lease on {} was lost ({reason})",
            request.name
        )),
        Ending::MaxRuntime(max) => reporter.error(&format!(
            "stopped the command: --max-runtime {} passed",
            crate::duration::display(*max)
        )),
    }
}

/// Opens the store; with `-v`, says where it is and warns about its setup.
fn open_store(args: &crate::backend::StoreArgs, reporter: &Reporter) -> Result<Box<dyn Store>> {
    let mut store = args.open(true)?;
    if reporter.wants_details() {
        let message = format!("the lock is in {}", store.location());
        reporter.event(&Event::Notice { message: &message });
        for warning in store.warnings() {
            reporter.event(&Event::Notice { message: &warning });
        }
    }
    Ok(store)
}
