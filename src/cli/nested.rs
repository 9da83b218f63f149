//! A lockrun inside a command that lockrun runs (docs/guide.md: "A lockrun inside a lockrun").
//!
//! lockrun tells its command about the lock it holds in `LOCKRUN_NAME`,
//! `LOCKRUN_BACKEND` and `LOCKRUN_PARALLELISM`, and marks the command's
//! environment with `LOCKRUN_TOKEN`. A nested lockrun must not take that
//! description for its own options: with the outer lock's name it would wait
//! for its own parent, and with the outer lock's backend but none of its
//! location (`--db`, `--redis-url` given to the outer as flags are not passed
//! on) it would land in a store nobody named.

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

use crate::backend::DEFAULT_BACKEND;

/// The variables that describe the lock a command runs under, also read as options outside one.
const OUTER_LOCK: [&str; 3] = ["LOCKRUN_NAME", "LOCKRUN_BACKEND", "LOCKRUN_PARALLELISM"];

/// The backend of the lock this lockrun runs under (`LOCKRUN_BACKEND`), if it runs under one.
fn outer_backend() -> Option<String> {
    std::env::var_os("LOCKRUN_TOKEN")?;
    std::env::var("LOCKRUN_BACKEND").ok()
}

/// The command line's definition as seen inside a lockrun command: no option
/// reads a variable of [`OUTER_LOCK`]. Outside one, `definition` unchanged.
pub fn definition(definition: Command) -> Command {
    if std::env::var_os("LOCKRUN_TOKEN").is_none() {
        return definition;
    }
    ignore_outer_lock(definition)
}

/// Whether an option reads the variable `var`: inside a lockrun command, none
/// reads a variable of [`OUTER_LOCK`].
pub fn reads_variable(var: &str) -> bool {
    !OUTER_LOCK.contains(&var) || std::env::var_os("LOCKRUN_TOKEN").is_none()
}

fn ignore_outer_lock(command: Command) -> Command {
    command
        .mut_args(|arg| {
            let describes_outer_lock = arg
                .get_env()
                .and_then(|var| var.to_str())
                .is_some_and(|var| OUTER_LOCK.contains(&var));
            if describes_outer_lock {
                arg.env(None::<&str>)
            } else {
                arg
            }
        })
        .mut_subcommands(ignore_outer_lock)
}

/// Inside a lock on any backend but the default one, a nested lockrun must
/// name its own backend: whether `LOCKRUN_BACKEND` was the user's choice or
/// only the outer lockrun's flag, and where that store is, it cannot know.
pub fn require_own_backend(matches: &ArgMatches) -> Result<(), String> {
    let Some(outer) = outer_backend().filter(|outer| outer != DEFAULT_BACKEND) else {
        return Ok(());
    };
    let store = matches.subcommand().map_or(matches, |(_, sub)| sub);
    if store.value_source("backend") != Some(ValueSource::DefaultValue) {
        return Ok(());
    }
    Err(format!(
        "this lockrun runs inside a lock on {outer} (LOCKRUN_BACKEND describes that lock, \
         not this one's store): give it --backend, and the store's flags or variables \
         (--db or LOCKRUN_DB, --redis-url or LOCKRUN_REDIS_URL) as needed"
    ))
}
