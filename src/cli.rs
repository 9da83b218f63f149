//! The command line (README: "Usage"): every option also reads its environment variable.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::backend::{Mode, StoreArgs};
use crate::duration;
use crate::name::Name;
use crate::report::Format;

mod nested;
pub mod passwords;
mod quick;
mod usage;

pub use usage::report as usage_error;

#[derive(Debug, Parser)]
#[command(
    name = "lockrun",
    version,
    long_version = long_version(),
    about = "Run a command while holding a named lock: a file, a SQLite database, Redis, PostgreSQL, etcd or an S3-compatible bucket",
    override_usage = "lockrun [OPTIONS] --name NAME [--] COMMAND [ARG]...\n       \
                      lockrun [OPTIONS] --name NAME -c 'SHELL COMMAND'\n       \
                      lockrun status [OPTIONS] [NAME] [--json]\n       \
                      lockrun release [OPTIONS] NAME [--slot N] --force\n       \
                      lockrun check [OPTIONS]",
    after_help = EXIT_STATUSES,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub action: Option<Action>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// List who holds a lock (every name when NAME is omitted)
    Status(StatusArgs),
    /// Break a lease that is known to be dead (every backend but file)
    Release(ReleaseArgs),
    /// Probe the store without taking a lock: reachable, and safe to lock on
    Check(CheckArgs),
}

/// The end of `--help`: what a script that runs lockrun checks (README: "Exit status").
const EXIT_STATUSES: &str = "\
Exit status:
  the command's own      the command ran (128+N: it was ended by signal N)
  64                     usage error: a bad flag, value or name
  69                     the store is unavailable or misconfigured
  70                     internal error
  74                     lockrun's own output could not be written
  75 (-E)                no slot acquired (busy with -n, or --timeout passed); the command did not run
  76                     the lease was lost; lockrun stopped the command
  124                    --max-runtime passed; lockrun stopped the command
  126 / 127              the command cannot be executed / was not found";

/// `--version`: the version, the commit it was built from (`build.rs`), the
/// backends built in and the versioned store formats it reads and writes.
fn long_version() -> &'static str {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut text = format!(
            "{}\ncommit: {}\nbackends: {}",
            env!("CARGO_PKG_VERSION"),
            env!("LOCKRUN_COMMIT"),
            crate::backend::NAMES.join(", "),
        );
        for format in crate::backend::FORMATS {
            let _ = write!(text, "\nstore format: {format}");
        }
        text
    });
    &TEXT
}

/// A run's defaults, which the quick reading of a command line shares (`cli/quick.rs`).
const DEFAULT_PARALLELISM: u32 = 1;
const MAX_PARALLELISM: u32 = 1024;
const PARALLELISM_VARIABLE: &str = "LOCKRUN_PARALLELISM";
const DEFAULT_TIMEOUT: &str = "600s";
const DEFAULT_INITIAL_DELAY: &str = "1s";
const DEFAULT_MAX_DELAY: &str = "30s";
const DEFAULT_BACKOFF_MULTIPLIER: f64 = 1.5;
const DEFAULT_TTL: &str = "30s";
const DEFAULT_MIN_HOLD: &str = "0";
const DEFAULT_CONFLICT_EXIT_CODE: u8 = 75;

// Each bool is a flag of the command line, as clap derives it.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock's name: 1 to 200 bytes, no control characters; several --name hold them all
    #[arg(long = "name", env = "LOCKRUN_NAME", value_name = "NAME", value_parser = parse_name, required = true)]
    pub names: Vec<Name>,

    /// Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1
    #[arg(short = 's', long)]
    pub shared: bool,

    /// The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s
    #[arg(short = 'x', long, short_alias = 'e', conflicts_with = "shared")]
    pub exclusive: bool,

    #[command(flatten)]
    pub store: StoreArgs,

    /// How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for
    #[arg(short = 'p', long, env = PARALLELISM_VARIABLE, default_value_t = DEFAULT_PARALLELISM,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PARALLELISM)))]
    pub parallelism: u32,

    /// The variable `-p` came from, which messages then name.
    #[arg(skip)]
    pub parallelism_variable: Option<&'static str>,

    /// Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s
    #[arg(short = 'n', long)]
    pub no_wait: bool,

    /// Longest wait for a slot; inf waits forever
    #[arg(short = 'w', long, env = "LOCKRUN_TIMEOUT", default_value = DEFAULT_TIMEOUT, value_name = "DUR",
          value_parser = parse_limit)]
    pub timeout: Limit,

    /// First retry delay when polling
    #[arg(long, env = "LOCKRUN_INITIAL_DELAY", default_value = DEFAULT_INITIAL_DELAY, value_name = "DUR", value_parser = duration::parse)]
    pub initial_delay: Duration,

    /// Cap on the retry delay
    #[arg(long, env = "LOCKRUN_MAX_DELAY", default_value = DEFAULT_MAX_DELAY, value_name = "DUR", value_parser = duration::parse)]
    pub max_delay: Duration,

    /// Growth of the retry delay per retry (>= 1)
    #[arg(long, default_value_t = DEFAULT_BACKOFF_MULTIPLIER, value_name = "F", value_parser = parse_multiplier)]
    pub backoff_multiplier: f64,

    /// Lease length on every backend but file; renewed every TTL/3 while the command runs
    #[arg(long, env = "LOCKRUN_TTL", default_value = DEFAULT_TTL, value_name = "DUR", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// Keep the slot taken at least this long after acquiring
    #[arg(long, default_value = DEFAULT_MIN_HOLD, value_name = "DUR", value_parser = duration::parse)]
    pub min_hold: Duration,

    /// Stop the command after this long (exit 124); 0 means no limit
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    pub max_runtime: Option<Duration>,

    /// Time between SIGTERM and SIGKILL when lockrun stops the command [default: 10s, at most TTL/3 on every backend but file]
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    pub kill_grace: Option<Duration>,

    /// Exit status when no slot was acquired, 0 to 255
    #[arg(short = 'E', long, default_value_t = DEFAULT_CONFLICT_EXIT_CODE, value_name = "N")]
    pub conflict_exit_code: u8,

    /// Run this string with /bin/sh -c instead of COMMAND ARGS
    #[arg(
        short = 'c',
        long = "command",
        value_name = "STRING",
        conflicts_with = "command"
    )]
    pub shell_command: Option<OsString>,

    /// What status and the events say about this run, beside its program's name, pid, host and user
    #[arg(long, env = "LOCKRUN_NOTE", value_name = "TEXT")]
    pub note: Option<String>,

    /// Record the whole command line in the store for status, not only the program's name
    #[arg(long)]
    pub record_command: bool,

    #[command(flatten)]
    pub output: OutputArgs,

    /// The command to run and its arguments
    // Everything from its first word on is the command's; before it, a word with
    // a dash is an option (a mistyped one is an error, with clap's suggestion), so
    // a command that starts with a dash needs `--`.
    #[arg(value_name = "COMMAND", trailing_var_arg = true, value_hint = clap::ValueHint::CommandWithArguments)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// More diagnostics on stderr: waiting, acquired, renewals, release
    #[arg(short = 'v', long, conflicts_with = "quiet")]
    pub verbose: bool,

    /// No diagnostics at all
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Diagnostics as text lines or one JSON event per line
    #[arg(long, env = "LOCKRUN_LOG_FORMAT", value_enum, default_value_t = Format::Text)]
    pub log_format: Format,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The lock to show; every lock when omitted
    #[arg(value_parser = parse_name)]
    pub name: Option<Name>,

    /// Print a JSON array instead of a table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The lock whose lease to break
    #[arg(value_parser = parse_name)]
    pub name: Name,

    /// Only this slot (all of the name's slots when omitted)
    #[arg(long, value_name = "N")]
    pub slot: Option<u32>,

    /// Required: breaking a live holder's lease lets a second holder in
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

impl RunArgs {
    /// `-p N` as the user gave it: the flag, or the variable.
    pub fn parallelism_said(&self) -> String {
        match self.parallelism_variable {
            Some(variable) => format!("{variable}={}", self.parallelism),
            None => format!("-p {}", self.parallelism),
        }
    }

    /// The mode the run holds its names in.
    pub fn mode(&self) -> Mode {
        if self.shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        }
    }
}

/// A limit that may be `inf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit(pub Option<Duration>);

fn parse_limit(text: &str) -> Result<Limit, String> {
    duration::parse_limit(text).map(Limit)
}

fn parse_name(text: &str) -> Result<Name, String> {
    Name::parse(text)
}

fn parse_multiplier(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 1.0 => Ok(value),
        _ => Err(format!("'{text}' is not a number of at least 1")),
    }
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration::parse(text)?;
    if ttl < Duration::from_millis(100) {
        return Err(format!(
            "'{text}' is too short for a lease (at least 100ms)"
        ));
    }
    Ok(ttl)
}

/// Parses the command line `args` (the program's name first); `Err` carries
/// the exit status for help, version (0, printed) and usage errors (64, one line).
pub fn parse(args: Vec<OsString>) -> Result<Cli, u8> {
    if let Some(cli) = run_only(&args) {
        return Ok(cli);
    }
    let definition = nested::definition(Cli::command());
    if let Some(err) = args
        .get(1)
        .and_then(|first| usage::mistyped_subcommand(&definition, first))
    {
        return Err(clap_error(err, &args));
    }
    let mut definition = definition;
    // Kept for the error, which may have to say what was typed where.
    let typed = args.clone();
    let matches = definition.try_get_matches_from_mut(args).map_err(|err| {
        match usage::subcommand_after_options(&err, &typed) {
            Some(message) => usage::report(&message),
            None => clap_error(usage::from_variable(err, &definition, &typed), &typed),
        }
    })?;
    nested::require_own_backend(&matches).map_err(|message| usage::report(&message))?;
    usage::no_wait_with_timeout(&matches).map_err(|message| usage::report(&message))?;
    // Read before the values are taken out of the matches.
    let mut cli = Cli::from_arg_matches(&matches).map_err(|err| clap_error(err, &typed))?;
    cli.note_variables(&matches);
    Ok(cli)
}

impl Cli {
    /// Notes which options `matches` took from their variables, so that a
    /// message about one names what the user set (`LOCKRUN_PARALLELISM`).
    fn note_variables(&mut self, matches: &ArgMatches) {
        let definition = StoreArgs::augment_args(clap::Command::new("lockrun"));
        if let (
            Some(
                Action::Status(StatusArgs { store, .. })
                | Action::Release(ReleaseArgs { store, .. }),
            ),
            Some((_, sub)),
        ) = (&mut self.action, matches.subcommand())
        {
            store.note_variables(&definition, sub);
        } else {
            self.run.store.note_variables(&definition, matches);
            self.run.parallelism_variable = (matches.value_source("parallelism")
                == Some(ValueSource::EnvVariable))
            .then_some(PARALLELISM_VARIABLE);
        }
    }
}

/// A run's command line read without clap's matching ([`quick`]); `None` for
/// anything else, and for any error, which the whole definition then reports
/// as it always does.
fn run_only(args: &[OsString]) -> Option<Cli> {
    if may_name_a_subcommand(args) {
        return None;
    }
    quick::parse(args).ok().map(|run| Cli { action: None, run })
}

/// Whether the arguments before the command may name a subcommand or ask for
/// help or the version (`-h` and `-V` also among other short flags).
fn may_name_a_subcommand(args: &[OsString]) -> bool {
    // The first word may be a subcommand, or a mistyped one.
    let first_is_a_word = args
        .get(1)
        .and_then(|first| first.to_str())
        .is_none_or(|first| !first.starts_with('-'));
    first_is_a_word
        || args
            .iter()
            .skip(1)
            .take_while(|arg| *arg != "--")
            .any(|arg| {
                arg.to_str().is_none_or(|arg| {
                    matches!(arg, "status" | "release" | "help" | "--help" | "--version")
                        || arg.strip_prefix('-').is_some_and(|flags| {
                            !flags.starts_with('-') && flags.contains(['h', 'V'])
                        })
                })
            })
}

/// Help and version are printed (exit 0); anything else is a usage error.
fn clap_error(err: clap::Error, args: &[OsString]) -> u8 {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            0
        }
        _ => usage::report(&usage::one_line(err, args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_run_goes_to_the_quick_reading() {
        let args = |words: &[&str]| -> Vec<OsString> {
            std::iter::once("lockrun")
                .chain(words.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert!(!may_name_a_subcommand(&args(&[
            "--name", "x", "--", "status"
        ])));
        for other in [
            &["status"][..],
            &["stauts"],
            &["true"],
            &["release", "x", "--force"],
            &["-vh"],
            &["--version"],
            &["--name", "x", "help"],
        ] {
            assert!(may_name_a_subcommand(&args(other)), "{other:?}");
        }
    }

    #[test]
    fn definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn flock_style_short_flags() {
        let cli = Cli::try_parse_from([
            "lockrun", "--name", "x", "-x", "-w", "5", "-E", "3", "-p", "2", "-b", "file", "-v",
            "true",
        ])
        .unwrap();
        assert!(cli.run.exclusive && cli.run.output.verbose);
        assert_eq!(cli.run.timeout, Limit(Some(Duration::from_secs(5))));
        assert_eq!((cli.run.conflict_exit_code, cli.run.parallelism), (3, 2));
        assert_eq!(cli.run.command, vec![OsString::from("true")]);
    }

    #[test]
    fn command_arguments_are_kept_verbatim() {
        let cli =
            Cli::try_parse_from(["lockrun", "--name", "x", "--", "ls", "-l", "--", "a b"]).unwrap();
        assert_eq!(
            cli.run.command,
            ["ls", "-l", "--", "a b"].map(OsString::from)
        );
        let cli = Cli::try_parse_from(["lockrun", "--name", "x", "ls", "-l", "--", "-v"]).unwrap();
        assert_eq!(
            cli.run.command,
            ["ls", "-l", "--", "-v"].map(OsString::from)
        );
        assert!(
            !cli.run.output.verbose,
            "-v after the command's first word is the command's"
        );
    }

    #[test]
    fn subcommands_parse() {
        let cli = Cli::try_parse_from(["lockrun", "status", "backup", "--json"]).unwrap();
        assert!(matches!(
            cli.action,
            Some(Action::Status(StatusArgs { json: true, .. }))
        ));
        let cli = Cli::try_parse_from([
            "lockrun", "release", "backup", "--slot", "1", "--force", "-b", "redis",
        ])
        .unwrap();
        assert!(matches!(
            cli.action,
            Some(Action::Release(ReleaseArgs {
                slot: Some(1),
                force: true,
                ..
            }))
        ));
    }
}
