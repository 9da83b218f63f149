//! Usage errors (README: "Exit status"): one plain line on stderr, shown even with
//! `-q` or `--log-format json`, since the options that would say otherwise may be
//! the very ones that are wrong.

use std::ffi::{OsStr, OsString};
use std::io::Write;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

use crate::error::status;
use crate::escape::escape_controls;

/// Prints a usage error and returns its exit status. Control characters are
/// escaped: the line may repeat what was typed (`--name $'a\e[31mb'`).
pub fn report(message: &str) -> u8 {
    // stderr may be closed; that must not turn a usage error into a panic.
    let _ = writeln!(
        std::io::stderr().lock(),
        "lockrun: {} (see lockrun --help)",
        escape_controls(message)
    );
    status::USAGE
}

/// clap's error on one line: its message without the "error: " lead and the
/// usage block, then what it suggests instead ("did you mean '--no-wait'?").
/// `args`, the command line (or none), tells which option a word was meant for.
pub fn one_line(mut err: clap::Error, args: &[OsString]) -> String {
    // What the user typed is escaped first, so that no newline in it can cut the message short.
    let typed: Vec<(ContextKind, ContextValue)> = err
        .context()
        .filter_map(|(kind, value)| escaped(value).map(|value| (kind, value)))
        .collect();
    for (kind, value) in typed {
        err.insert(kind, value);
    }
    let rendered = err.render().to_string();
    let message = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.trim_start_matches("error: ");
    match suggestion(&err, args) {
        Some(suggestion) => format!("{message}; {suggestion}"),
        None => message.to_owned(),
    }
}

fn escaped(value: &ContextValue) -> Option<ContextValue> {
    match value {
        ContextValue::String(text) => Some(ContextValue::String(escape_controls(text))),
        ContextValue::Strings(texts) => Some(ContextValue::Strings(
            texts.iter().map(|text| escape_controls(text)).collect(),
        )),
        _ => None,
    }
}

/// What an unknown option typed means to lockrun: flock(1)'s options that
/// lockrun has no use for, with what to do instead, a flag of other tools,
/// and a negative number, which no option takes (`before`: the word before
/// it, the option it was likely meant for). `None` for anything else.
fn hint(typed: &str, before: Option<&str>) -> Option<String> {
    let flock = |what: &str| Some(format!("{typed} is flock(1)'s {what}"));
    match typed {
        "-u" | "--unlock" => flock(
            "unlock: lockrun releases the lock when the command exits (lockrun release --force breaks a dead holder's lease)",
        ),
        "-o" | "--close" => flock(
            "close: lockrun never lets the command inherit the lock's descriptor, so leave it out",
        ),
        "-F" | "--no-fork" => flock(
            "no-fork: lockrun always runs the command as its child, to release the lock when it ends and stop it if lockrun dies; there is no such option",
        ),
        "--events" | "--json" => Some(
            "the events come as one JSON object per line on stderr with --log-format json".into(),
        ),
        _ if typed
            .strip_prefix('-')
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit())) =>
        {
            Some(negative_number_hint(before).to_owned())
        }
        _ => None,
    }
}

/// What to give instead of a negative number to the option `before` it.
fn negative_number_hint(before: Option<&str>) -> &'static str {
    match before {
        Some("-w" | "--timeout") => {
            "no option takes a negative number: -w 0 (or -n) gives up at once, -w inf waits forever"
        }
        Some("-E" | "--conflict-exit-code") => {
            "-E takes an exit status from 0 to 255, not a negative number"
        }
        Some("--max-runtime") => {
            "--max-runtime takes a duration, not a negative number: 0, or none, means no limit"
        }
        Some("-p" | "--parallelism") => "-p takes a number of slots from 1 to 1024",
        Some(
            "--ttl"
            | "--kill-grace"
            | "--min-hold"
            | "--initial-delay"
            | "--max-delay"
            | "--backoff-multiplier",
        ) => "no option takes a negative number: durations are 0 or more (10s, 1.5, 1h30m)",
        _ => "no option takes a negative number",
    }
}

/// The option, subcommand or value that clap found similar to the one typed,
/// else its tips ("to pass '-x' as a value, use '-- -x'").
fn suggestion(err: &clap::Error, args: &[OsString]) -> Option<String> {
    if err.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::String(typed)) = err.get(ContextKind::InvalidArg)
    {
        // The word before the first one typed so, among lockrun's own (before `--`).
        let own = args.iter().take_while(|word| *word != "--");
        let before = own
            .clone()
            .zip(own.skip(1))
            .find(|(_, word)| word.to_str() == Some(typed))
            .and_then(|(before, _)| before.to_str());
        if let Some(hint) = hint(typed, before) {
            return Some(hint);
        }
    }
    let similar = [
        ContextKind::SuggestedArg,
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedValue,
    ]
    .into_iter()
    .find_map(|kind| match err.get(kind)? {
        ContextValue::String(one) => Some(vec![one.clone()]),
        ContextValue::Strings(many) if !many.is_empty() => Some(many.clone()),
        _ => None,
    });
    if let Some(similar) = similar {
        let quoted: Vec<String> = similar.iter().map(|name| format!("'{name}'")).collect();
        return Some(format!("did you mean {}?", quoted.join(" or ")));
    }
    match err.get(ContextKind::Suggested)? {
        ContextValue::StyledStrs(tips) if !tips.is_empty() => Some(
            tips.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ),
        _ => None,
    }
}

/// An invalid value that the command line did not give came from the
/// option's variable: the error then names the variable, which is what the user
/// set (`LOCKRUN_TIMEOUT=bogus`), not the option they never typed.
pub fn from_variable(mut err: clap::Error, definition: &Command, args: &[OsString]) -> clap::Error {
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return err;
    }
    let Some(ContextValue::String(shown)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let Some(arg) = options(definition).find(|arg| {
        arg.get_long().is_some_and(|long| {
            shown.starts_with(&format!("--{long} ")) || *shown == format!("--{long}")
        })
    }) else {
        return err;
    };
    let long = format!("--{}", arg.get_long().unwrap_or_default());
    let short = arg.get_short().map(|short| format!("-{short}"));
    let typed = args
        .iter()
        .skip(1)
        .take_while(|word| *word != "--")
        .any(|word| {
            let word = word.to_string_lossy();
            word == long
                || word.starts_with(&format!("{long}="))
                || short
                    .as_ref()
                    .is_some_and(|short| word.starts_with(short.as_str()))
        });
    if let (false, Some(var)) = (typed, arg.get_env().and_then(OsStr::to_str)) {
        let said = format!("{shown}' from the variable '{var}");
        err.insert(ContextKind::InvalidArg, ContextValue::String(said));
    }
    err
}

/// Every option of the definition and of its subcommands.
fn options(definition: &Command) -> impl Iterator<Item = &Arg> {
    definition.get_arguments().chain(
        definition
            .get_subcommands()
            .flat_map(Command::get_arguments),
    )
}

/// `-n` with `-w` on the command line asks for two timeouts at once (`-n`
/// is `-w 0`). `-n` with `LOCKRUN_TIMEOUT` is fine: the flag wins.
pub fn no_wait_with_timeout(matches: &ArgMatches) -> Result<(), String> {
    let given = |id| matches.value_source(id) == Some(ValueSource::CommandLine);
    if matches.subcommand().is_none() && given("no_wait") && given("timeout") {
        return Err(
            "-n (--no-wait) is -w 0, so -n with -w asks for two timeouts: give one of them".into(),
        );
    }
    Ok(())
}

/// A subcommand after options (`lockrun -b sqlite status`) is taken for the
/// command to run, whose lock has no name: the line that says to put the
/// subcommand first, with the words as they would then be.
pub fn subcommand_after_options(err: &clap::Error, args: &[OsString]) -> Option<String> {
    if err.kind() != ErrorKind::MissingRequiredArgument {
        return None;
    }
    let words: Vec<&OsString> = args
        .iter()
        .skip(1)
        .take_while(|word| *word != "--")
        .collect();
    let at = words
        .iter()
        .position(|word| *word == "status" || *word == "release")
        .filter(|&at| at > 0)?;
    let reordered: Vec<String> = std::iter::once(words[at])
        .chain(words[..at].iter().copied())
        .chain(words[at + 1..].iter().copied())
        .map(|word| word.to_string_lossy().into_owned())
        .collect();
    Some(format!(
        "'{}' after options is taken for the command to run; a subcommand comes first: lockrun {}",
        words[at].to_string_lossy(),
        reordered.join(" ")
    ))
}

/// clap's error for `first`, the first argument, when it is no subcommand but
/// resembles one (`stauts`). clap itself takes such a word for the command to
/// run, since a command may come first when `LOCKRUN_NAME` names the lock.
pub fn mistyped_subcommand(definition: &Command, first: &OsStr) -> Option<clap::Error> {
    if first.to_string_lossy().starts_with('-') {
        return None;
    }
    let subcommands_only =
        Command::new("lockrun").subcommands(definition.get_subcommands().cloned());
    let err = subcommands_only
        .try_get_matches_from([OsStr::new("lockrun"), first])
        .err()?;
    err.get(ContextKind::SuggestedSubcommand)
        .is_some()
        .then_some(err)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::Cli;

    fn line(args: &[&str]) -> String {
        one_line(Cli::try_parse_from(args).unwrap_err(), &[])
    }

    #[test]
    fn clap_errors_render_on_one_line() {
        let missing = line(&["lockrun", "true"]);
        assert!(
            missing.contains("--name") && !missing.contains('\n'),
            "{missing}"
        );
        assert_eq!(
            line(&["lockrun", "--name", "x", "--no-wiat", "true"]),
            "unexpected argument '--no-wiat' found; did you mean '--no-wait'?"
        );
        assert_eq!(
            line(&["lockrun", "--name", "x", "-b", "sqlit", "true"]),
            format!(
                "invalid value 'sqlit' for '--backend <BACKEND>' [possible values: {}]; did you mean 'sqlite'?",
                crate::backend::NAMES.join(", ")
            )
        );
    }

    #[test]
    fn typed_newlines_do_not_cut_the_message_short() {
        let bad = line(&["lockrun", "--name", "a\n\nb", "true"]);
        assert!(
            bad.starts_with("invalid value 'a\\n\\nb' for '--name <NAME>':")
                && bad.ends_with("control character"),
            "{bad}"
        );
    }

    #[test]
    fn only_words_like_a_subcommand_are_taken_for_mistyped_ones() {
        let definition = Cli::command();
        let mistyped = |word: &str| {
            mistyped_subcommand(&definition, OsStr::new(word)).map(|err| one_line(err, &[]))
        };
        assert_eq!(
            mistyped("stauts").as_deref(),
            Some("unrecognized subcommand 'stauts'; did you mean 'status'?")
        );
        for word in ["status", "release", "make", "./backup.sh", "-x", "--"] {
            assert!(mistyped(word).is_none(), "{word}");
        }
    }
}
