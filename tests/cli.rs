//! The command line: help, version and usage errors (SPEC §1, §2).

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
    for name in ["x".repeat(201), "a\tb".to_owned()] {
        let output = run(store.lockrun().args(["--name", &name, "true"]));
        assert_status(&output, 64);
        assert!(stderr(&output).contains("name"), "{}", stderr(&output));
    }
    assert_status(
        &run(store.lockrun().args(["--name", &"é".repeat(100), "true"])),
        0,
    );
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
