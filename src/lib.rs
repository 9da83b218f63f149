//! lockrun: run a command while holding a named lock.

#![deny(unsafe_code)]

pub mod acquire;
pub mod backend;
pub mod backoff;
pub mod cli;
pub mod duration;
pub mod error;
pub mod escape;
pub mod identity;
pub mod lease;
pub mod name;
pub mod operator;
pub mod platform;
pub mod progress;
pub mod report;
pub mod run;
pub mod supervisor;
pub mod timestamp;
pub mod timing;
pub mod width;

use std::ffi::OsString;

use cli::{Action, OutputArgs};
use error::Error;
use name::Name;
use report::{Level, Reporter};

/// The program, called from the C runtime's `main` (`src/main.rs`) with the
/// process's arguments: the part of std's start-up that lockrun needs, the
/// run, and stdout flushed, which std's exit would have done.
pub fn main(args: Vec<OsString>) -> i32 {
    platform::startup::prepare();
    error::exit_internal_on_panic();
    let code = run(args);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    i32::from(code)
}

/// Runs lockrun with `args` (its name first) and returns its exit status.
fn run(args: Vec<OsString>) -> u8 {
    let cli = match cli::parse(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // Read: no password given on the command line stays in `ps` (docs/operating.md: "Passwords").
    platform::startup::blank_arguments(cli::passwords::spans);
    let reporter = match &cli.action {
        Some(Action::Status(args)) => reporter(&args.output, args.name.as_ref()),
        Some(Action::Release(args)) => reporter(&args.output, Some(&args.name)),
        Some(Action::Check(args)) => reporter(&args.output, None),
        None => reporter(&cli.run.output, cli.run.names.first())
            .in_mode(cli.run.mode())
            .with_note(cli.run.note.clone()),
    };
    let result = match cli.action {
        Some(Action::Status(args)) => operator::status(&args),
        Some(Action::Release(args)) => operator::release(&args),
        Some(Action::Check(args)) => operator::check(&args),
        None => run::run(cli.run, &reporter),
    };
    result.unwrap_or_else(|err| match err {
        // Found after parsing ("no command given"), but a usage error all the same: one plain line.
        Error::Usage(message) => cli::usage_error(&message),
        err => {
            reporter.error(&err.to_string());
            err.exit_code()
        }
    })
}

fn reporter(output: &OutputArgs, name: Option<&Name>) -> Reporter {
    let level = if output.quiet {
        Level::Quiet
    } else if output.verbose {
        Level::Verbose
    } else {
        Level::Normal
    };
    Reporter::new(
        level,
        output.log_format,
        name.map(ToString::to_string).unwrap_or_default(),
    )
}
