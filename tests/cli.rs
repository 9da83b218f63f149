//! The command line (README: "Usage", "Exit status"): help, version, usage
//! errors that say what was meant, and what a nested lockrun reads.

use std::path::Path;

use crate::support::*;

#[test]
fn help_and_version_exit_zero() {
    for flag in ["--help", "--version", "-h", "-V"] {
        let output = run(lockrun().arg(flag));
        assert_status(&output, 0);
        assert!(!output.stdout.is_empty(), "{flag} prints to stdout");
    }
    let help = stdout(&run(lockrun().arg("--help")));
    for option in [
        "--name",
        "--backend",
        "--parallelism",
        "--no-wait",
        "--timeout",
        "--ttl",
        "--kill-grace",
        "LOCKRUN_TIMEOUT",
    ] {
        assert!(help.contains(option), "help mentions {option}");
    }
}

#[test]
fn environment_variables_set_options_and_flags_win() {
    let store = Store::file();
    let scratch = Scratch::new();
    let log = scratch.path("name");
    let script = format!(
        "echo \"$LOCKRUN_NAME $LOCKRUN_PARALLELISM\" >> '{}'",
        log.display()
    );
    let output = run(store
        .lockrun()
        .env("LOCKRUN_NAME", "from-env")
        .env("LOCKRUN_PARALLELISM", "4")
        .args(["-c", &script]));
    assert_status(&output, 0);
    let output = run(store.lockrun().env("LOCKRUN_NAME", "from-env").args([
        "--name",
        "from-flag",
        "-c",
        &script,
    ]));
    assert_status(&output, 0);
    assert_eq!(scratch.lines("name"), ["from-env 4", "from-flag 1"]);
    let output = run(store
        .lockrun()
        .env("LOCKRUN_TIMEOUT", "never")
        .args(["--name", "x", "true"]));
    assert_status(&output, 64);
}

#[test]
fn a_name_that_is_too_long_or_has_control_characters_is_refused() {
    let store = Store::file();
    for name in [
        "x".repeat(201),
        "a\tb".to_owned(),
        "a\u{1b}[31mb".to_owned(),
    ] {
        let line = usage_line(&run(store.lockrun().args(["--name", &name, "true"])));
        assert!(line.contains("name"), "{line}");
        assert!(
            !line.contains(char::is_control),
            "what was typed is escaped, never echoed raw: {line:?}"
        );
    }
    let line = usage_line(&run(store.lockrun().args([
        "--name",
        "a\u{1b}[31mb",
        "true",
    ])));
    assert!(line.contains(r"'a\u{1b}[31mb'"), "{line}");
    assert_status(
        &run(store.lockrun().args(["--name", &"é".repeat(100), "true"])),
        0,
    );
}

#[test]
fn a_mistyped_option_is_named_at_once_not_run_as_the_command() {
    let store = Store::file();
    for (args, meant) in [
        (&["--name", "x", "--no-wiat", "true"][..], "--no-wait"),
        (&["--name", "x", "--timout", "5", "--", "make"], "--timeout"),
        (
            &["--name", "x", "-p", "2", "--parallelsim", "2", "true"],
            "--parallelism",
        ),
    ] {
        let line = usage_line(&run(store.lockrun().args(args)));
        assert!(
            line.contains(&format!("did you mean '{meant}'?")),
            "{args:?}: {line}"
        );
    }
    // A command that starts with a dash needs `--`; without it, it is an unknown option.
    let line = usage_line(&run(store.lockrun().args(["--name", "x", "-y", "true"])));
    assert!(line.contains("'-- -y'"), "{line}");
    let output = run(store.lockrun().args(["--name", "x", "--", "-y"]));
    assert_status(&output, 127);
}

#[test]
fn the_command_keeps_its_dashes_and_double_dashes() {
    let store = Store::file();
    let printed = |args: &[&str]| {
        let output = run(store.lockrun().args(["--name", "x"]).args(args));
        assert_status(&output, 0);
        stdout(&output)
    };
    let words = "-l\n--\na b\n-v\n";
    assert_eq!(
        printed(&["printf", "%s\\n", "-l", "--", "a b", "-v"]),
        words
    );
    assert_eq!(
        printed(&["--", "printf", "%s\\n", "-l", "--", "a b", "-v"]),
        words
    );
}

#[test]
fn a_mistyped_subcommand_is_named_not_run() {
    let store = Store::file();
    for (args, line) in [
        (
            &["stauts"][..],
            "lockrun: unrecognized subcommand 'stauts'; did you mean 'status'? (see lockrun --help)",
        ),
        (
            &["relase", "x", "--force"],
            "lockrun: unrecognized subcommand 'relase'; did you mean 'release'? (see lockrun --help)",
        ),
    ] {
        assert_eq!(usage_line(&run(lockrun().args(args))), line);
        // Even when LOCKRUN_NAME would let a command come first.
        let named = run(lockrun().env("LOCKRUN_NAME", "x").args(args));
        assert_eq!(usage_line(&named), line);
    }
    let output = run(store.lockrun().args(["--name", "x", "--", "stauts"]));
    assert_status(&output, 127);
    assert!(stderr(&output).contains("stauts"), "{}", stderr(&output));
}

#[test]
fn usage_errors_found_after_parsing_are_plain_lines_even_when_quiet() {
    let store = Store::file();
    for quiet in [
        &["-q"][..],
        &["--log-format", "json"],
        &["-q", "--log-format", "json"],
    ] {
        let line = usage_line(&run(store.lockrun().args(["--name", "x"]).args(quiet)));
        assert!(
            line.starts_with("lockrun: no command given"),
            "{quiet:?}: {line}"
        );
    }
}

#[test]
fn shared_mode_takes_one_slot() {
    let store = Store::file();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let touch = format!("touch '{}'", ran.display());
    for extra in [["-s", "-p", "2"], ["--shared", "--parallelism", "3"]] {
        let output = run(store
            .lockrun()
            .args(["--name", "x"])
            .args(extra)
            .args(["-c", &touch]));
        assert_status(&output, 64);
        let err = stderr(&output);
        assert!(err.contains("-p 1") && err.lines().count() == 1, "{err}");
    }
    assert!(!ran.exists(), "a refused run's command ran");
}

#[test]
fn a_nested_lockrun_does_not_take_the_outer_locks_name_or_slots() {
    let store = Store::file();
    let scratch = Scratch::new();
    let inner_script = format!(
        "echo \"$LOCKRUN_NAME $LOCKRUN_PARALLELISM\" > '{}'",
        scratch.path("inner").display()
    );
    let inner = store.argv(&[]);
    let outer = |inner_args: &[&str]| {
        let mut command = store.lockrun();
        command
            .args(["--name", "outer", "-p", "3", "--"])
            .args(&inner)
            .args(inner_args);
        run(&mut command)
    };
    // Without --name the inner lockrun would wait for its own parent's lock.
    let output = outer(&["--", "true"]);
    assert_status(&output, 64);
    assert!(stderr(&output).contains("--name"), "{}", stderr(&output));
    assert_status(&outer(&["--name", "inner", "-c", &inner_script]), 0);
    assert_eq!(
        scratch.lines("inner"),
        ["inner 1"],
        "the inner lock has its own name and one slot"
    );
}

#[test]
fn a_nested_lockrun_reads_its_own_flags_and_the_users_store_variables() {
    let scratch = Scratch::new();
    let db = scratch.path("locks.sqlite3");
    let dir = scratch.path("locks");
    // Where a lockrun that fell back on a default store would write.
    let home = scratch.path("home");
    // The outer lockrun holds "outer" and runs `script`, in which `$lockrun` is lockrun;
    // `user` is the environment the user gave it, which its command inherits.
    let nested = |user: &[(&str, &Path)], outer: &[&str], script: &str| {
        let output = run(lockrun()
            .env("lockrun", env!("CARGO_BIN_EXE_lockrun"))
            .env("HOME", &home)
            .env("XDG_STATE_HOME", home.join("state"))
            .env("XDG_RUNTIME_DIR", home.join("runtime"))
            .envs(user.iter().copied())
            .args(outer)
            .args(["--name", "outer", "-c", &format!("{script}; echo $?")]));
        assert_status(&output, 0);
        (stdout(&output).trim().to_owned(), stderr(&output))
    };
    let db_flag = ["-b", "sqlite", "--db", db.to_str().expect("UTF-8")];
    let inner = "\"$lockrun\" --name inner -- true";
    let same_lock = "\"$lockrun\" -b sqlite --name outer -n -- true";

    // The outer's backend and database came as flags: LOCKRUN_BACKEND says sqlite,
    // but the inner lockrun cannot know which database; it must be told.
    let (status, err) = nested(&[], &db_flag, inner);
    assert_eq!(status, "64");
    assert!(
        err.contains("inside a lock on sqlite") && err.contains("--backend"),
        "{err}"
    );
    // The same when the user chose sqlite with LOCKRUN_BACKEND: only the outer read it.
    let user_sqlite = [
        ("LOCKRUN_BACKEND", Path::new("sqlite")),
        ("LOCKRUN_DB", &db),
    ];
    assert_eq!(nested(&user_sqlite, &[], inner).0, "64");
    // Told its backend, the inner lockrun reads the user's LOCKRUN_DB: the outer's
    // database, where "outer" is held.
    assert_eq!(nested(&user_sqlite, &[], same_lock).0, "75");
    assert_eq!(nested(&[("LOCKRUN_DB", &db)], &db_flag, same_lock).0, "75");
    // Inside a file lock the default backend is the outer's; the user's LOCKRUN_DIR is read.
    let (status, _) = nested(
        &[("LOCKRUN_DIR", &dir)],
        &[],
        "\"$lockrun\" --name outer -n -- true",
    );
    assert_eq!(status, "75");
    assert!(!home.exists(), "nothing landed in a default store");
}

#[test]
fn durations_that_look_like_typos_are_refused_saying_why() {
    let store = Store::file();
    for (duration, why) in [
        ("1h1h", "twice"),
        ("30m1h", "from the largest"),
        ("1e3", "unknown unit 'e'"),
        ("+5", "digits with at most one dot"),
    ] {
        let output = run(store
            .lockrun()
            .args(["--name", "x", "-w", duration, "true"]));
        assert_status(&output, 64);
        let err = stderr(&output);
        assert!(err.contains(why), "{duration}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_status(
        &run(store.lockrun().args(["--name", "x", "-w", "1h30m", "true"])),
        0,
    );
}

/// `--version` says what a fleet's operator needs to compare hosts (CHANGELOG.md:
/// "Compatibility"): the commit, the backends built in, and the store formats,
/// as the stores record them.
#[test]
fn version_names_the_commit_the_backends_and_the_store_formats() {
    let version = stdout(&run(lockrun().arg("--version")));
    let lines: Vec<&str> = version.lines().collect();
    assert_eq!(lines[0], format!("lockrun {}", env!("CARGO_PKG_VERSION")));
    let commit = lines[1].strip_prefix("commit: ").expect("a commit line");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success());
    match head {
        Some(head) => assert!(
            String::from_utf8_lossy(&head.stdout).starts_with(commit) && commit.len() >= 7,
            "{commit} is not HEAD"
        ),
        None => assert_eq!(commit, "unknown"),
    }
    assert_eq!(
        lines[2],
        format!("backends: {}", lockrun::backend::NAMES.join(", "))
    );
    // The SQLite format it names is the one a new database gets.
    let dir = tempfile::TempDir::new().unwrap();
    let db = dir.path().join("locks.sqlite3");
    assert_status(
        &run(lockrun()
            .args(["-b", "sqlite", "--db"])
            .arg(&db)
            .args(["--name", "x", "true"])),
        0,
    );
    let written: u32 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert!(
        lines.contains(
            &format!("store format: sqlite schema {written} (reads 1 to {written})").as_str()
        ),
        "{version}"
    );
    for format in lockrun::backend::FORMATS {
        assert!(
            lines.contains(&format!("store format: {format}").as_str()),
            "{version}"
        );
    }
}

/// `--help` ends with every exit status of the README's table, in one block.
#[test]
fn help_ends_with_every_exit_status() {
    let help = stdout(&run(lockrun().arg("--help")));
    let block = &help[help.rfind("\n\n").expect("blocks") + 2..];
    assert!(block.starts_with("Exit status:"), "{block}");
    let readme = crate::support::docs::Doc::load("README.md");
    // The table's first cells: `64`, `75 (-E)`, `126 / 127`, `128+N`; 0 is --help's own.
    let statuses: Vec<String> = readme
        .section("Exit status")
        .lines()
        .filter_map(|row| row.strip_prefix("| ")?.split(" | ").next())
        .flat_map(|cell| cell.split([' ', '/', '(']))
        .filter(|word| word.starts_with(|c: char| c.is_ascii_digit()) && *word != "0")
        .map(ToOwned::to_owned)
        .collect();
    assert!(statuses.len() >= 10, "{statuses:?}");
    for status in statuses {
        assert!(
            block.contains(&status),
            "--help lacks exit status {status}: {block}"
        );
    }
    let short = stdout(&run(lockrun().arg("-h")));
    assert!(short.trim_end().ends_with(block.trim_end()), "{short}");
}

/// flock(1)'s explicit exclusive mode is lockrun's default: a cron line
/// ported from `flock -xn` runs unchanged; with -s it asks for two modes.
#[test]
fn flocks_exclusive_flags_are_accepted_and_conflict_with_shared() {
    let store = Store::file();
    for flag in ["-x", "-e", "--exclusive"] {
        let output = run(store.lockrun().args([flag, "-n", "--name", "x", "true"]));
        assert_status(&output, 0);
        let line = usage_line(&run(store
            .lockrun()
            .args([flag, "-s", "--name", "x", "true"])));
        assert!(
            line.contains("'--exclusive' cannot be used with '--shared'"),
            "{flag}: {line}"
        );
    }
    let output = run(store.lockrun().args(["-xn", "--name", "x", "true"]));
    assert_status(&output, 0);
}

/// Settings that contradict each other, or that lockrun could only honour by
/// changing them silently, are refused with one line (64), and nothing runs.
#[test]
fn contradicting_settings_are_refused_not_silently_changed() {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let touch = format!("touch '{}'", ran.display());
    for (store, args, says) in [
        (Store::file(), &["-n", "-w", "5"][..], "-n with -w"),
        (Store::file(), &["--no-wait", "--timeout=5"], "-n with -w"),
        (
            Store::file(),
            &["--initial-delay", "10s", "--max-delay", "1s"],
            "--initial-delay 10s is longer than --max-delay 1s",
        ),
        (
            Store::sqlite(),
            &["--kill-grace", "20s"],
            "--kill-grace 20s is longer than a third of --ttl 30s (10s)",
        ),
        (
            Store::sqlite(),
            &["--kill-grace", "2s", "--ttl", "3s"],
            "--kill-grace 2s is longer than a third of --ttl 3s (1s)",
        ),
    ] {
        let line = usage_line(&run(store
            .lockrun()
            .args(["--name", "x"])
            .args(args)
            .args(["-c", &touch])));
        assert!(line.contains(says), "{args:?}: {line}");
        assert!(!ran.exists(), "{args:?}: the command ran");
    }
    // What is no contradiction runs: -n wins over LOCKRUN_TIMEOUT, as a flag over its
    // variable; without a lease, any grace can be given whole.
    for (store, args, var) in [
        (Store::file(), &["-n"][..], Some(("LOCKRUN_TIMEOUT", "5"))),
        (Store::file(), &["--kill-grace", "20s"], None),
        (Store::sqlite(), &["--kill-grace", "10s"], None),
    ] {
        let mut command = store.lockrun();
        command.args(["--name", "x"]).args(args).arg("true");
        command.envs(var);
        assert_status(&run(&mut command), 0);
    }
}

/// A brace in the Redis prefix would move the names' Cluster hash tag
/// (docs/backends/redis.md: "Redis backend"): refused before any server is asked.
#[test]
fn a_redis_prefix_with_a_brace_is_a_usage_error() {
    let unused = format!("redis://127.0.0.1:{}", free_port());
    for prefix in ["p{t}", "a}", "{"] {
        let line = usage_line(&run(lockrun().args([
            "-b",
            "redis",
            "--redis-url",
            &unused,
            "--prefix",
            prefix,
            "--name",
            "x",
            "true",
        ])));
        assert!(line.contains("brace"), "{prefix}: {line}");
        let line = usage_line(&run(lockrun()
            .args(["status", "-b", "redis", "--redis-url", &unused])
            .env("LOCKRUN_PREFIX", prefix)));
        assert!(line.contains("brace"), "{prefix}: {line}");
    }
}

/// A value that came from a variable is named by that variable, which is what
/// the user set, not by the flag they never typed.
#[test]
fn errors_about_a_value_from_a_variable_name_the_variable() {
    let store = Store::file();
    let scratch = Scratch::new();
    let line = usage_line(&run(store
        .lockrun()
        .env("LOCKRUN_PARALLELISM", "2")
        .args(["-s", "--name", "x", "true"])));
    assert!(line.contains("not LOCKRUN_PARALLELISM=2"), "{line}");
    let holder = crate::core::hold(&store, &scratch, "x", &[]);
    let asked = |command: &mut std::process::Command| {
        usage_line(&run(command.args(["--name", "x", "-n", "true"])))
    };
    let line = asked(store.lockrun().env("LOCKRUN_PARALLELISM", "2"));
    assert!(
        line.contains("this run asked for LOCKRUN_PARALLELISM=2"),
        "{line}"
    );
    let line = asked(store.lockrun().args(["-p", "2"]));
    assert!(line.contains("this run asked for -p 2"), "{line}");
    std::fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
    if cfg!(feature = "postgres") {
        // An option lockrun does not support is a bad URL: 69, as for every bad URL.
        let url = "postgres://u:s3cret@127.0.0.1:1/db?nosuch=1";
        for (command, named) in [
            (
                lockrun()
                    .env("LOCKRUN_POSTGRES_URL", url)
                    .args(["-b", "postgres", "--name", "x", "true"]),
                "LOCKRUN_POSTGRES_URL: ",
            ),
            (
                lockrun().args([
                    "-b",
                    "postgres",
                    "--postgres-url",
                    url,
                    "--name",
                    "x",
                    "true",
                ]),
                "--postgres-url: ",
            ),
            (
                lockrun()
                    .env("LOCKRUN_POSTGRES_URL", url)
                    .args(["status", "-b", "postgres"]),
                "LOCKRUN_POSTGRES_URL: ",
            ),
        ] {
            let output = run(command);
            assert_status(&output, 69);
            let said = stderr(&output);
            assert!(
                said.starts_with(&format!("lockrun: {named}")) && said.contains("\"nosuch\""),
                "{said}"
            );
            assert!(!said.contains("s3cret"), "{said}");
        }
    }
}
