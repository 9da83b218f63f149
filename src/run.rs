//! `lockrun --name NAME -- COMMAND`: acquire a slot, run the command under
//! supervision, release, and exit with the command's status.

use std::ffi::OsString;
use std::time::Duration;

use crate::acquire::{self, acquire};
use crate::backend::{Mode, Owner, Request, Store};
use crate::backoff;
use crate::cli::RunArgs;
use crate::duration;
use crate::error::{Error, Result};
use crate::identity::{Process, new_token, user_name};
use crate::lease::Held;
use crate::name::Name;
use crate::platform::clock::Moment;
use crate::platform::watchdog::Watchdog;
use crate::report::{Event, Reporter};
use crate::supervisor::{self, Ending, FoundLost, Limits, Lost, Program, Signals, Supervised};
use crate::timing::Plan;

pub fn run(args: RunArgs, reporter: &Reporter) -> Result<u8> {
    let policy = wait_policy(&args);
    let mode = args.mode();
    refuse_contradictions(&args, mode)?;
    let names = canonical_order(args.names);
    if names.is_empty() {
        return Err(Error::Usage("--name is required".into()));
    }
    let program = program(args.shell_command, args.command)?;

    supervisor::reset_inherited().map_err(Error::system)?;
    let mut store = open_store(&args.store, reporter)?;
    let leases = store.abilities().leases;
    let plan = Plan::new(args.ttl);
    let kill_grace = kill_grace(plan, args.kill_grace, args.ttl, leases)?;
    let owner = owner(
        &program,
        args.record_command,
        args.note.clone(),
        args.parallelism,
        mode,
        leases,
    );
    let template = Request {
        name: names[0].clone(),
        parallelism: args.parallelism,
        plan,
        owner,
        queue: policy.timeout != Some(Duration::ZERO),
        deadline: policy.timeout.map(|timeout| Moment::now() + timeout),
    };
    // Started while we wait, if we must (`acquire`); else before the command.
    let mut watchdog = None;
    let (mut held, tokens) = take_all(
        store.as_mut(),
        &names,
        &template,
        &policy,
        reporter,
        kill_grace,
        &mut watchdog,
    )?;
    drop(store);
    // On the boot clock: no step of the wall clock shortens a --min-hold.
    let acquired_at = Moment::now();
    let (slots, fences): (Vec<String>, Vec<String>) = held
        .slots()
        .map(|(number, fence)| (number.to_string(), fence.to_string()))
        .unzip();
    // One line per name, in the order taken (docs/guide.md: "What the command gets").
    let lines = |items: &[String]| items.join("\n");
    let names_text: Vec<String> = names.iter().map(ToString::to_string).collect();
    let env = [
        ("LOCKRUN_NAME", lines(&names_text)),
        ("LOCKRUN_BACKEND", args.store.backend.clone()),
        ("LOCKRUN_SLOT", lines(&slots)),
        ("LOCKRUN_PARALLELISM", args.parallelism.to_string()),
        ("LOCKRUN_TOKEN", lines(&tokens)),
        ("LOCKRUN_FENCE", lines(&fences)),
    ];
    let limits = Limits {
        // 0 means no limit, as for timeout(1).
        max_runtime: args.max_runtime.filter(|max| !max.is_zero()),
        kill_grace,
    };

    let Supervised { ending, watchdog } = match Signals::block() {
        Ok(signals) => supervisor::supervise(
            &program, &env, &signals, &mut held, watchdog, &limits, reporter,
        ),
        Err(err) => Supervised {
            ending: Err(Error::system(err)),
            watchdog,
        },
    };
    let keep_until = (!args.min_hold.is_zero()).then(|| acquired_at + args.min_hold);
    // A lease that ran out by its deadline after the command ended (lockrun
    // paused since) was not taken from the command while it ran.
    let lapsed = held.deadline().is_some_and(Moment::has_passed);
    // Why lockrun stopped the command comes first, then its release (with -v).
    if let Ok(ending) = &ending {
        report_ending(ending, reporter);
    }
    let released = held.release(keep_until);
    // Once released: its wake and exit are then not on the next holder's way.
    if let Some(watchdog) = watchdog {
        watchdog.dismiss().reap();
    }
    let mut ending = ending?;
    if let (Some(name), Ending::Exited(code), false) = (&released.lost, &ending, lapsed) {
        // Broken or taken while the command ran: another holder may have run beside it.
        reporter.about(name).event(&Event::Lost {
            reason: "it was found gone at release",
        });
        ending = Ending::FoundLost(FoundLost {
            name: name.clone(),
            code: *code,
        });
        report_ending(&ending, reporter);
    }
    for failure in released.failed {
        // The command's run is over either way: its status stands, and a lease
        // that could not be released lapses by itself.
        if matches!(
            ending,
            Ending::LeaseLost(_) | Ending::LostBeforeStart(_) | Ending::LapsedUnseen(_)
        ) {
            reporter.event(&Event::Notice { message: &failure });
        } else {
            reporter.error(&format!("{failure}; its lease lapses within --ttl"));
        }
    }
    Ok(ending.exit_code())
}

/// Settings that contradict each other: refused (64), never bent to fit.
fn refuse_contradictions(args: &RunArgs, mode: Mode) -> Result<()> {
    if mode == Mode::Shared && args.parallelism > 1 {
        return Err(Error::Usage(format!(
            "--shared holds a name's one slot together with other sharers: it takes -p 1, not {}",
            args.parallelism_said()
        )));
    }
    if args.initial_delay > args.max_delay {
        return Err(Error::Usage(format!(
            "--initial-delay {} is longer than --max-delay {}, which caps every retry delay: lower the one or raise the other",
            duration::display(args.initial_delay),
            duration::display(args.max_delay)
        )));
    }
    Ok(())
}

/// The kill grace; one asked for that a lease cannot give whole is refused (64).
fn kill_grace(
    plan: Plan,
    asked: Option<Duration>,
    ttl: Duration,
    leases: bool,
) -> Result<Duration> {
    plan.kill_grace(asked, leases).map_err(|most| {
        Error::Usage(format!(
            "--kill-grace {} is longer than a third of --ttl {} ({}): the command must be gone before its lease could pass on; shorten it or lengthen --ttl",
            duration::display(asked.unwrap_or_default()),
            duration::display(ttl),
            duration::display(most)
        ))
    })
}

/// Takes a slot of each of `names`, in that order, as `template` asks (one
/// deadline for all): all or nothing. Returns them held, with their tokens;
/// `watchdog` is the command's, if a wait started it (gone with a failure).
fn take_all(
    store: &mut dyn Store,
    names: &[Name],
    template: &Request,
    policy: &acquire::WaitPolicy,
    reporter: &Reporter,
    kill_grace: Duration,
    watchdog: &mut Option<Watchdog>,
) -> Result<(Held, Vec<String>)> {
    let leases = store.abilities().leases;
    let mut held = Held::default();
    let mut tokens = Vec::with_capacity(names.len());
    for name in names {
        let mut request = template.clone();
        request.name = name.clone();
        request.owner.token = new_token()?;
        let about = reporter.about(name.as_str());
        match acquire(store, &request, policy, &about, &mut held, watchdog) {
            Ok(slot) => held.push(slot, leases.then_some(request.plan), kill_grace, about),
            Err(err) => {
                // All or nothing: a run that did not get every name holds none.
                for failure in held.release(None).failed {
                    reporter.event(&Event::Notice { message: &failure });
                }
                if let Some(watchdog) = watchdog.take() {
                    watchdog.dismiss().reap();
                }
                return Err(err);
            }
        }
        tokens.push(request.owner.token);
    }
    Ok((held, tokens))
}

/// The names in the one order every run takes them in (by their bytes), each
/// once: two runs naming the same names never wait for each other in a circle.
fn canonical_order(mut names: Vec<Name>) -> Vec<Name> {
    names.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    names.dedup();
    names
}

/// What identifies this run's holder in the store: its arguments (a password?)
/// only when asked for, as the store may be read from every host
/// (docs/operating.md: "Who holds a lock").
fn owner(
    program: &Program,
    record_command: bool,
    note: Option<String>,
    parallelism: u32,
    mode: Mode,
    leases: bool,
) -> Owner {
    // Only a lease's holder can be reclaimed early by its process's death;
    // the kernel frees a dead holder's lock by itself.
    let process = if leases {
        Process::current()
    } else {
        Process::current_without_liveness()
    };
    Owner {
        token: String::new(),
        process,
        command: if record_command {
            program.display()
        } else {
            program.name()
        },
        user: user_name(),
        note,
        parallelism: Some(parallelism),
        mode,
    }
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
        parallelism_said: args.parallelism_said(),
    }
}

/// The one line for an ending that lockrun caused.
fn report_ending(ending: &Ending, reporter: &Reporter) {
    match ending {
        Ending::Exited(_) => {}
        Ending::LeaseLost(Lost { name, reason }) => reporter.error(&format!(
            "stopped the command: the lease on {name} was lost ({reason})"
        )),
        Ending::FoundLost(FoundLost { name, code }) => reporter.error(&format!(
            "the lease on {name} was found lost when lockrun released it (broken or expired): another run may have held the slot meanwhile; the command exited with status {code}"
        )),
        Ending::LapsedUnseen(FoundLost { name, code }) => reporter.error(&format!(
            "the lease on {name} ran out while lockrun was paused, and its watchdog cannot say that the command ended before; the command exited with status {code}"
        )),
        Ending::LostBeforeStart(Lost { name, reason }) => reporter.error(&format!(
            "did not start the command: the lease on {name} was lost ({reason})"
        )),
        Ending::MaxRuntime(max) => reporter.error(&format!(
            "stopped the command: --max-runtime {} passed",
            duration::display(*max)
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
