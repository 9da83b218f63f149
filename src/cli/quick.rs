//! A run's command line read without clap's matching (BENCHMARKS.md "Start-up"):
//! building and matching every option of a run was a fifth of a short run's
//! work. This reads `[OPTIONS] --name NAME [--] COMMAND...` and `-c`, each of
//! a run's own options in its `--opt value`, `--opt=value` and `-x value`
//! forms and from its variable, with the same value parsers as clap. The
//! store's options go to clap, in a definition of their own, so that no
//! backend's options are repeated here.
//!
//! Anything else is left to the whole definition, which says what is wrong as
//! it always has: help, version, subcommands, clusters (`-nv`, `-p4`), an
//! unknown, repeated or conflicting option, a value that does not parse, is
//! empty or starts with a dash, an empty or non-UTF-8 variable.

use std::ffi::{OsStr, OsString};
use std::time::Duration;

use clap::{Args, Command, FromArgMatches};

use super::{
    DEFAULT_BACKOFF_MULTIPLIER, DEFAULT_CONFLICT_EXIT_CODE, DEFAULT_INITIAL_DELAY,
    DEFAULT_MAX_DELAY, DEFAULT_MIN_HOLD, DEFAULT_PARALLELISM, DEFAULT_TIMEOUT, DEFAULT_TTL,
    MAX_PARALLELISM, OutputArgs, RunArgs, nested, parse_limit, parse_multiplier, parse_name,
    parse_ttl,
};
use crate::backend::StoreArgs;
use crate::duration;
use crate::report::Format;

/// One of a run's own options, as `RunArgs` defines it for clap.
struct Spec {
    long: &'static str,
    short: Option<char>,
    env: Option<&'static str>,
    takes_value: bool,
}

const fn option(long: &'static str, short: Option<char>, env: Option<&'static str>) -> Spec {
    Spec {
        long,
        short,
        env,
        takes_value: true,
    }
}

const fn flag(long: &'static str, short: char) -> Spec {
    Spec {
        long,
        short: Some(short),
        env: None,
        takes_value: false,
    }
}

const fn long_flag(long: &'static str) -> Spec {
    Spec {
        long,
        short: None,
        env: None,
        takes_value: false,
    }
}

const NAME: usize = 0;
const PARALLELISM: usize = 1;
const NO_WAIT: usize = 2;
const TIMEOUT: usize = 3;
const INITIAL_DELAY: usize = 4;
const MAX_DELAY: usize = 5;
const BACKOFF_MULTIPLIER: usize = 6;
const TTL: usize = 7;
const MIN_HOLD: usize = 8;
const MAX_RUNTIME: usize = 9;
const KILL_GRACE: usize = 10;
const CONFLICT_EXIT_CODE: usize = 11;
const SHELL_COMMAND: usize = 12;
const VERBOSE: usize = 13;
const QUIET: usize = 14;
const LOG_FORMAT: usize = 15;
const SHARED: usize = 16;
const EXCLUSIVE: usize = 17;
const NOTE: usize = 18;
const RECORD_COMMAND: usize = 19;

/// A run's own options, indexed by the constants above; a test holds them to `RunArgs`.
const OPTIONS: [Spec; 20] = [
    option("name", None, Some("LOCKRUN_NAME")),
    option("parallelism", Some('p'), Some("LOCKRUN_PARALLELISM")),
    flag("no-wait", 'n'),
    option("timeout", Some('w'), Some("LOCKRUN_TIMEOUT")),
    option("initial-delay", None, Some("LOCKRUN_INITIAL_DELAY")),
    option("max-delay", None, Some("LOCKRUN_MAX_DELAY")),
    option("backoff-multiplier", None, None),
    option("ttl", None, Some("LOCKRUN_TTL")),
    option("min-hold", None, None),
    option("max-runtime", None, None),
    option("kill-grace", None, None),
    option("conflict-exit-code", Some('E'), None),
    option("command", Some('c'), None),
    flag("verbose", 'v'),
    flag("quiet", 'q'),
    option("log-format", None, Some("LOCKRUN_LOG_FORMAT")),
    flag("shared", 's'),
    // Its other short name, `-e`, is left to clap.
    flag("exclusive", 'x'),
    option("note", None, Some("LOCKRUN_NOTE")),
    long_flag("record-command"),
];

/// What a word before the command names.
enum Key<'a> {
    Long(&'a str),
    Short(char),
}

impl Key<'_> {
    fn names(&self, long: Option<&str>, short: Option<char>) -> bool {
        match self {
            Key::Long(name) => long == Some(*name),
            Key::Short(letter) => short == Some(*letter),
        }
    }
}

/// What the whole definition must read: this one cannot say for sure what clap would.
#[derive(Debug)]
pub struct LeftToClap;

impl From<String> for LeftToClap {
    fn from(_: String) -> Self {
        Self
    }
}

impl From<clap::Error> for LeftToClap {
    fn from(_: clap::Error) -> Self {
        Self
    }
}

/// The words of a run's command line, sorted.
struct Words<'a> {
    /// A run's own options as given, indexed like [`OPTIONS`] (a flag's value is empty).
    given: [Option<&'a OsStr>; OPTIONS.len()],
    /// The store's options, for clap, after a program name.
    store: Vec<OsString>,
    command: Vec<OsString>,
}

/// The run that `args` (the program's name first) asks for, as clap would read it.
pub fn parse(args: &[OsString]) -> Result<RunArgs, LeftToClap> {
    let mut store_definition = nested::definition(StoreArgs::augment_args(Command::new("lockrun")));
    let Words {
        given,
        store: store_words,
        command,
    } = sort(args, &store_definition)?;
    let shell_command = given[SHELL_COMMAND].map(OsStr::to_owned);
    let (verbose, quiet) = (given[VERBOSE].is_some(), given[QUIET].is_some());
    let (shared, exclusive) = (given[SHARED].is_some(), given[EXCLUSIVE].is_some());
    // `-c` and COMMAND conflict, and one of them is needed; so do -v and -q, -s and -x,
    // and -n and -w (on the command line: -n wins over LOCKRUN_TIMEOUT).
    if shell_command.is_some() != command.is_empty()
        || (verbose && quiet)
        || (shared && exclusive)
        || (given[NO_WAIT].is_some() && given[TIMEOUT].is_some())
    {
        return Err(LeftToClap);
    }
    let store_matches = store_definition.try_get_matches_from_mut(store_words)?;
    nested::require_own_backend(&store_matches)?;
    let mut store = StoreArgs::from_arg_matches(&store_matches)?;
    store.note_variables(&store_definition, &store_matches);

    let text_of = |index: usize| setting(&OPTIONS[index], given[index]);
    let duration_or = |index: usize, default: &str| -> Result<Duration, LeftToClap> {
        Ok(duration::parse(
            text_of(index)?.as_deref().unwrap_or(default),
        )?)
    };
    let optional_duration = |index: usize| -> Result<Option<Duration>, LeftToClap> {
        Ok(text_of(index)?
            .as_deref()
            .map(duration::parse)
            .transpose()?)
    };
    let parallelism_text = text_of(PARALLELISM)?;
    Ok(RunArgs {
        names: vec![parse_name(&text_of(NAME)?.ok_or(LeftToClap)?)?],
        shared,
        exclusive,
        store,
        parallelism: match parallelism_text.as_deref() {
            Some(text) => whole_number(text)
                .filter(|n| (1..=MAX_PARALLELISM).contains(n))
                .ok_or(LeftToClap)?,
            None => DEFAULT_PARALLELISM,
        },
        parallelism_variable: OPTIONS[PARALLELISM]
            .env
            .filter(|_| given[PARALLELISM].is_none() && parallelism_text.is_some()),
        no_wait: given[NO_WAIT].is_some(),
        timeout: parse_limit(text_of(TIMEOUT)?.as_deref().unwrap_or(DEFAULT_TIMEOUT))?,
        initial_delay: duration_or(INITIAL_DELAY, DEFAULT_INITIAL_DELAY)?,
        max_delay: duration_or(MAX_DELAY, DEFAULT_MAX_DELAY)?,
        backoff_multiplier: match text_of(BACKOFF_MULTIPLIER)? {
            Some(text) => parse_multiplier(&text)?,
            None => DEFAULT_BACKOFF_MULTIPLIER,
        },
        ttl: parse_ttl(text_of(TTL)?.as_deref().unwrap_or(DEFAULT_TTL))?,
        min_hold: duration_or(MIN_HOLD, DEFAULT_MIN_HOLD)?,
        max_runtime: optional_duration(MAX_RUNTIME)?,
        kill_grace: optional_duration(KILL_GRACE)?,
        conflict_exit_code: match text_of(CONFLICT_EXIT_CODE)? {
            Some(text) => whole_number(&text)
                .and_then(|n| u8::try_from(n).ok())
                .ok_or(LeftToClap)?,
            None => DEFAULT_CONFLICT_EXIT_CODE,
        },
        shell_command,
        note: text_of(NOTE)?,
        record_command: given[RECORD_COMMAND].is_some(),
        output: OutputArgs {
            verbose,
            quiet,
            log_format: match text_of(LOG_FORMAT)? {
                Some(text) => <Format as clap::ValueEnum>::from_str(&text, false)?,
                None => Format::Text,
            },
        },
        command,
    })
}

/// Sorts the words before the command into a run's own options and the
/// store's, and takes the command.
fn sort<'a>(args: &'a [OsString], store_definition: &Command) -> Result<Words<'a>, LeftToClap> {
    let mut given: [Option<&OsStr>; OPTIONS.len()] = [None; OPTIONS.len()];
    let mut store_words = vec![OsString::from("lockrun")];
    let mut command = Vec::new();
    let mut words = args.iter().skip(1);

    while let Some(word) = words.next() {
        if word == "--" {
            command.extend(words.cloned());
            break;
        }
        let text = word.to_str().ok_or(LeftToClap)?;
        let (key, inline) = if let Some(long) = text.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) => (Key::Long(name), Some(OsStr::new(value))),
                None => (Key::Long(long), None),
            }
        } else if let Some(short) = text.strip_prefix('-') {
            let mut letters = short.chars();
            let (Some(letter), None) = (letters.next(), letters.next()) else {
                return Err(LeftToClap);
            };
            (Key::Short(letter), None)
        } else {
            // The command's first word: it and everything after it are the command's.
            command.push(word.clone());
            command.extend(words.cloned());
            break;
        };
        if let Some(index) = OPTIONS
            .iter()
            .position(|spec| key.names(Some(spec.long), spec.short))
        {
            if given[index].is_some() {
                return Err(LeftToClap);
            }
            given[index] = Some(match (OPTIONS[index].takes_value, inline) {
                (true, _) => value(inline, &mut words)?,
                (false, None) => OsStr::new(""),
                (false, Some(_)) => return Err(LeftToClap),
            });
        } else {
            let arg = store_definition
                .get_arguments()
                .find(|arg| key.names(arg.get_long(), arg.get_short()))
                .ok_or(LeftToClap)?;
            store_words.push(word.clone());
            if arg.get_action().takes_values() && inline.is_none() {
                store_words.push(value(None, &mut words)?.to_owned());
            }
        }
    }
    Ok(Words {
        given,
        store: store_words,
        command,
    })
}

/// An option's value: after `=`, or the next word. One that is empty or
/// starts with a dash is for clap to judge.
fn value<'a>(
    inline: Option<&'a OsStr>,
    words: &mut impl Iterator<Item = &'a OsString>,
) -> Result<&'a OsStr, LeftToClap> {
    let value = match inline {
        Some(value) => value,
        None => words.next().ok_or(LeftToClap)?,
    };
    let bytes = value.as_encoded_bytes();
    if bytes.is_empty() || bytes.starts_with(b"-") {
        return Err(LeftToClap);
    }
    Ok(value)
}

/// An option's text from its flag, else from its variable (unless the variable
/// describes the lock this lockrun runs under), else `None`. Text that is not
/// UTF-8, and an empty variable, are clap's to judge.
fn setting(spec: &Spec, given: Option<&OsStr>) -> Result<Option<String>, LeftToClap> {
    if let Some(given) = given {
        return given
            .to_str()
            .map(|text| Some(text.to_owned()))
            .ok_or(LeftToClap);
    }
    let Some(var) = spec.env.filter(|var| nested::reads_variable(var)) else {
        return Ok(None);
    };
    match std::env::var_os(var) {
        None => Ok(None),
        Some(value) if value.is_empty() => Err(LeftToClap),
        Some(value) => value.into_string().map(Some).map_err(|_| LeftToClap),
    }
}

/// Digits only: a sign, spaces and the like are clap's to judge.
fn whole_number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn the_options_are_the_ones_clap_defines_for_a_run() {
        let store = StoreArgs::augment_args(Command::new("lockrun"));
        let run = RunArgs::augment_args(Command::new("lockrun"));
        let own: Vec<_> = run
            .get_arguments()
            .filter(|arg| !arg.is_positional())
            .filter(|arg| store.get_arguments().all(|s| s.get_id() != arg.get_id()))
            .collect();
        assert_eq!(own.len(), OPTIONS.len());
        for arg in own {
            let long = arg.get_long().expect("every run option has a long name");
            let spec = OPTIONS.iter().find(|spec| spec.long == long);
            let spec = spec.unwrap_or_else(|| panic!("--{long} is missing"));
            assert_eq!(spec.short, arg.get_short(), "--{long}");
            assert_eq!(spec.env.map(OsStr::new), arg.get_env(), "--{long}");
            assert_eq!(
                spec.takes_value,
                arg.get_action().takes_values(),
                "--{long}"
            );
        }
    }

    /// What the whole definition reads from `words` as a run, if it reads one.
    fn by_clap(args: &[OsString]) -> Option<String> {
        let matches = nested::definition(Cli::command())
            .try_get_matches_from(args)
            .ok()?;
        nested::require_own_backend(&matches).ok()?;
        let mut cli = Cli::from_arg_matches(&matches).ok()?;
        cli.note_variables(&matches);
        cli.action.is_none().then(|| format!("{:?}", cli.run))
    }

    fn by_quick(args: &[OsString]) -> Option<String> {
        parse(args).ok().map(|run| format!("{run:?}"))
    }

    fn args(words: &[&str]) -> Vec<OsString> {
        std::iter::once("lockrun")
            .chain(words.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// Pieces of command lines, right and wrong, for every option and the store's.
    const PIECES: &[&[&str]] = &[
        &["--name", "x"],
        &["--name=y"],
        &["--name", "-x"],
        &["--name="],
        &["-p", "3"],
        &["-p", "0"],
        &["--parallelism=1025"],
        &["-p", "+2"],
        &["-p4"],
        &["-n"],
        &["--no-wait"],
        &["--no-wait=yes"],
        &["-nv"],
        &["-w", "inf"],
        &["--timeout", "5"],
        &["-w", "1h30m"],
        &["--timeout=1e3"],
        &["--initial-delay", "0.25"],
        &["--max-delay=2s"],
        &["--backoff-multiplier", "2"],
        &["--backoff-multiplier", "0.5"],
        &["--ttl", "50ms"],
        &["--ttl=2s"],
        &["--min-hold", "1s"],
        &["--max-runtime", "10"],
        &["--kill-grace", "1s"],
        &["-E", "3"],
        &["-E", "256"],
        &["--conflict-exit-code=0"],
        &["-c", "echo hi"],
        &["--command=exit 3"],
        &["-v"],
        &["-q"],
        &["--verbose"],
        &["--log-format", "json"],
        &["--log-format=JSON"],
        &["--note", "nightly backup"],
        &["--note="],
        &["--record-command"],
        &["--record-command=yes"],
        &["-b", "sqlite"],
        &["--backend=redis"],
        &["-b", "nosuch"],
        &["--db", "/tmp/x.db"],
        &["--dir", "/tmp/d"],
        &["--dir=/tmp/e"],
        &["--prefix", "p"],
        &["--redis-url", "redis://h:1"],
        &["--postgres-url=postgres://u@h/db"],
        &["--etcd-endpoints", "http://a:1"],
        &["--nope"],
        &["-x"],
        &["-e"],
        &["--exclusive"],
        &["-s"],
        &["-"],
    ];

    /// Ends of command lines: none, and commands with and without `--`.
    const COMMANDS: &[&[&str]] = &[
        &[],
        &["--", "true"],
        &["true"],
        &["ls", "-l", "--", "-v"],
        &["--", "-v"],
        &["--"],
    ];

    /// Command lines made of [`PIECES`] (up to five) and one of [`COMMANDS`], the same every time.
    fn command_lines() -> Vec<Vec<OsString>> {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |below: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % below as u64) as usize
        };
        (0..4000)
            .map(|_| {
                // Most with a name, which a run needs.
                let mut words: Vec<&str> = if next(3) > 0 {
                    vec!["--name", "n"]
                } else {
                    vec![]
                };
                for _ in 0..next(6) {
                    words.extend_from_slice(PIECES[next(PIECES.len())]);
                }
                words.extend_from_slice(COMMANDS[next(COMMANDS.len())]);
                args(&words)
            })
            .collect()
    }

    /// Every generated command line reads as clap reads it, or is left to clap.
    fn assert_read_as_clap_does() -> usize {
        let mut read = 0;
        for args in command_lines() {
            if let Some(quick) = by_quick(&args) {
                assert_eq!(Some(quick), by_clap(&args), "{args:?}");
                read += 1;
            }
        }
        read
    }

    #[test]
    fn runs_read_as_clap_reads_them() {
        for run in [
            &["--name", "x", "--", "ls", "-l"][..],
            &[
                "--name=x", "-p", "3", "-x", "-w", "5", "-E", "3", "-b", "file", "-v", "true",
            ],
            &[
                "--name",
                "x",
                "--ttl",
                "2s",
                "--min-hold",
                "1s",
                "-q",
                "-c",
                "echo hi",
            ],
            &[
                "--name",
                "x",
                "-b",
                "sqlite",
                "--db",
                "/tmp/l.db",
                "--",
                "status",
            ],
            &[
                "--dir=/tmp/d",
                "--name",
                "x",
                "--log-format",
                "json",
                "true",
            ],
        ] {
            let args = args(run);
            assert!(by_quick(&args).is_some(), "{run:?}");
            assert_eq!(by_quick(&args), by_clap(&args), "{run:?}");
        }
        let read = assert_read_as_clap_does();
        // Not everything is left to clap: most well-formed lines are read here.
        assert!(read > 500, "only {read} command lines read");
    }

    /// The environments the variables test runs in, each in a process of its own.
    const ENVIRONMENTS: &[&[(&str, &str)]] = &[
        &[("LOCKRUN_NAME", "envname")],
        &[("LOCKRUN_PARALLELISM", "4"), ("LOCKRUN_TIMEOUT", "inf")],
        &[("LOCKRUN_TIMEOUT", "5")],
        &[("LOCKRUN_PARALLELISM", "0")],
        &[
            ("LOCKRUN_INITIAL_DELAY", "2s"),
            ("LOCKRUN_MAX_DELAY", "5s"),
            ("LOCKRUN_TTL", "1s"),
            ("LOCKRUN_LOG_FORMAT", "json"),
        ],
        &[("LOCKRUN_LOG_FORMAT", "xml")],
        &[("LOCKRUN_TTL", "")],
        &[("LOCKRUN_BACKEND", "sqlite"), ("LOCKRUN_DB", "/tmp/l.db")],
        &[("LOCKRUN_PREFIX", "pp"), ("LOCKRUN_DIR", "/tmp/dd")],
        // Inside a lockrun's command: the outer lock's description is not read.
        &[
            ("LOCKRUN_TOKEN", "t"),
            ("LOCKRUN_NAME", "outer"),
            ("LOCKRUN_BACKEND", "file"),
            ("LOCKRUN_PARALLELISM", "2"),
        ],
        &[("LOCKRUN_TOKEN", "t"), ("LOCKRUN_BACKEND", "sqlite")],
    ];

    const IN_ENVIRONMENT: &str = "LOCKRUN_QUICK_TEST_ENVIRONMENT";

    #[test]
    fn variables_read_as_clap_reads_them() {
        // In one of the environments: this test run again by the loop below.
        if std::env::var_os(IN_ENVIRONMENT).is_some() {
            println!("read quickly: {}", assert_read_as_clap_does());
            return;
        }
        for vars in ENVIRONMENTS {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "cli::quick::tests::variables_read_as_clap_reads_them",
                ])
                .args(["--test-threads", "1", "--nocapture"])
                .env_clear()
                .env(IN_ENVIRONMENT, "1")
                .envs(vars.iter().copied())
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("1 passed"),
                "{vars:?}: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let read: usize = stdout
                .split_once("read quickly: ")
                .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
                .expect("the count of lines read quickly");
            // Each environment leaves some lines to the quick reading: else it compared nothing.
            assert!(read > 0, "{vars:?}: no command line was read quickly");
        }
    }
}
