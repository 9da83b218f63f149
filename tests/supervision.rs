//! Supervising the command (docs/guide.md: "What the command gets"): stdio, escalation on a second signal,
//! starting it for any size of arguments and environment.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::Signal;

use crate::support::*;

#[test]
fn stdin_and_stdout_belong_to_the_command() {
    let store = Store::file();
    let mut child = store
        .lockrun()
        .args(["--name", "pipe", "-v", "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .start();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let output = finish(child);
    assert_eq!(
        output.stdout, b"HELLO\n",
        "nothing but the command's output on stdout"
    );
    assert!(
        stderr(&output).contains("acquired"),
        "-v diagnostics go to stderr"
    );
}

#[test]
fn a_second_sigterm_stops_the_whole_tree() {
    let store = Store::file();
    let scratch = Scratch::new();
    // The command ignores the first SIGTERM; its background child would too.
    let script = format!(
        "trap 'echo term >> {log}' TERM; sleep 300 & echo $! > {gc}; touch {ready}; while :; do sleep 0.02; done",
        log = scratch.path("log").display(),
        gc = scratch.path("grandchild").display(),
        ready = scratch.path("ready").display(),
    );
    let mut lockrun = store
        .lockrun()
        .args(["--name", "twice", "--kill-grace", "0.5", "-c", &script])
        .start();
    wait_for_file(&scratch.path("ready"));
    signal(lockrun.id(), Signal::SIGTERM);
    wait_until("the first SIGTERM to reach the command", || {
        scratch.lines("log").len() == 1
    });
    signal(lockrun.id(), Signal::SIGTERM);
    let status = wait(&mut lockrun);
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "the command ignored SIGTERM and was killed"
    );
    let grandchild = read_pid(&scratch.path("grandchild"));
    wait_until("the grandchild to be stopped", || {
        !process_exists(grandchild)
    });
}

#[test]
fn json_events_are_one_object_per_line() {
    let store = Store::file();
    let output = run(store
        .lockrun()
        .args(["--name", "events", "--log-format", "json", "true"]));
    assert_status(&output, 0);
    let events: Vec<serde_json::Value> = stderr(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["notice", "acquired", "released"]);
    assert_eq!(
        events[0]["message"],
        format!("the lock is in directory {}", store.dir().display())
    );
    for event in &events {
        assert_eq!(event["name"], "events");
        assert!(event["ts"].as_str().unwrap().ends_with('Z'));
    }
}

/// `lockrun BACKEND-FLAGS ARGS` as one shell-quoted command line.
fn command_line(store: &Store, args: &[&str]) -> String {
    let words = store.argv(args);
    let quoted: Vec<String> = words
        .iter()
        .map(|word| format!("'{}'", word.replace('\'', r"'\''")))
        .collect();
    quoted.join(" ")
}

/// Runs lockrun through `sh -c "PRELUDE; exec lockrun ..."`, so the shell sets up what lockrun inherits.
fn lockrun_after(store: &Store, prelude: &str, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("{prelude}; exec {}", command_line(store, args)));
    command
}

#[test]
fn signals_the_parent_ignored_stay_ignored() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = format!(
        "trap 'echo usr1 >> {log}; exit 0' USR1; touch {ready}; while :; do sleep 0.02; done",
        log = scratch.path("log").display(),
        ready = scratch.path("ready").display(),
    );
    let mut lockrun =
        lockrun_after(&store, "trap '' INT", &["--name", "ignored", "-c", &script]).start();
    wait_for_file(&scratch.path("ready"));
    // Two SIGINTs would stop the command's tree if lockrun listened to them.
    signal(lockrun.id(), Signal::SIGINT);
    signal(lockrun.id(), Signal::SIGINT);
    signal(lockrun.id(), Signal::SIGUSR1);
    assert_eq!(
        wait(&mut lockrun).code(),
        Some(0),
        "the command ended on SIGUSR1, not by a stop"
    );
    assert_eq!(scratch.lines("log"), ["usr1"]);
}

#[test]
fn an_ignored_sigchld_does_not_lose_the_status() {
    let store = Store::file();
    let output = run(&mut lockrun_after(
        &store,
        "trap '' CHLD",
        &["--name", "chld", "-c", "exit 3"],
    ));
    assert_status(&output, 3);
}

#[test]
fn a_forwarded_signal_continues_a_stopped_command() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = format!(
        "trap 'exit 7' TERM; echo $$ > {ready}; while :; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
    );
    let mut lockrun = store
        .lockrun()
        .args(["--name", "stopped", "-c", &script])
        .start();
    let command = read_pid(&scratch.path("ready"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(command), Signal::SIGSTOP).unwrap();
    wait_until("the command to stop", || {
        process_state(command) == Some('T')
    });
    signal(lockrun.id(), Signal::SIGTERM);
    assert_eq!(
        wait(&mut lockrun).code(),
        Some(7),
        "the command woke up and handled SIGTERM"
    );
}

#[test]
fn sigtstp_stops_the_command_before_lockrun() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = format!(
        "echo $$ > {ready}; while [ ! -e {release} ]; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display(),
    );
    let mut lockrun = store
        .lockrun()
        .args(["--name", "tstp", "-c", &script])
        .start();
    let command = read_pid(&scratch.path("ready"));
    signal(lockrun.id(), Signal::SIGTSTP);
    let lockrun_pid = lockrun.id().cast_signed();
    wait_until("the command and then lockrun to stop", || {
        process_state(command) == Some('T') && process_state(lockrun_pid) == Some('T')
    });
    signal(lockrun.id(), Signal::SIGCONT);
    wait_until("the command to run again", || {
        process_state(command) != Some('T')
    });
    std::fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut lockrun).code(), Some(0));
}

#[test]
fn lockrun_rests_while_it_waits_for_the_kill_grace() {
    let store = Store::file();
    let lockrun = command_line(
        &store,
        &[
            "--name",
            "spin",
            "--max-runtime",
            "0.1",
            "--kill-grace",
            "1.5",
        ],
    );
    // bash's `times` ends with the CPU time its children used: lockrun must not spin after --max-runtime.
    let script = format!("{lockrun} -c 'trap \"\" TERM; sleep 30'; echo status=$?; times");
    let output = run(std::process::Command::new("bash").arg("-c").arg(&script));
    let text = stdout(&output);
    assert!(text.contains("status=124"), "{text}");
    let children = text.lines().last().unwrap();
    let cpu: f64 = children.split_whitespace().map(minutes_and_seconds).sum();
    assert!(
        cpu < 0.5,
        "lockrun and its command used {cpu}s of CPU in a 1.5 s grace: {children}"
    );
}

/// `0m0.012s` → 0.012
fn minutes_and_seconds(time: &str) -> f64 {
    let (minutes, seconds) = time
        .trim_end_matches('s')
        .split_once('m')
        .expect("bash times format");
    minutes.parse::<f64>().unwrap() * 60.0 + seconds.parse::<f64>().unwrap()
}

/// Writes an executable file `name` in `dir`.
fn executable(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A script without `#!` (which execvp(3) runs with /bin/sh) that writes its
/// argument count and last argument to `out`, then the lines `extra` prints, and exits 7.
fn counting_script(scratch: &Scratch, extra: &str) -> PathBuf {
    let text = format!(
        "{{ echo $#; for last; do :; done; echo \"$last\"; {extra} }} > '{out}'\nexit 7\n",
        out = scratch.path("out").display(),
    );
    executable(scratch.dir(), "count", &text)
}

fn numbers(count: usize) -> Vec<String> {
    (1..=count).map(|n| n.to_string()).collect()
}

#[test]
fn a_script_without_shebang_gets_a_hundred_thousand_arguments() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = counting_script(&scratch, "");
    let output = run(store
        .lockrun()
        .args(["--name", "args", "--"])
        .arg(&script)
        .args(numbers(100_000)));
    assert_status(&output, 7);
    assert_eq!(scratch.lines("out"), ["100000", "100000"]);
}

#[test]
fn a_huge_environment_and_many_arguments_reach_the_command() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = counting_script(
        &scratch,
        "echo ${#SPAWN_BIG}; echo \"$SPAWN_0 $SPAWN_9999\";",
    );
    let mut lockrun = store.lockrun();
    // The kernel takes at most 128 KiB in one variable, and 2 MiB in all with an 8 MiB stack limit.
    lockrun.env("SPAWN_BIG", "x".repeat(120_000));
    for n in 0..10_000 {
        lockrun.env(format!("SPAWN_{n}"), format!("{n:0>40}"));
    }
    let output = run(lockrun
        .args(["--name", "env", "--"])
        .arg(&script)
        .args(numbers(40_000)));
    assert_status(&output, 7);
    assert_eq!(
        scratch.lines("out"),
        [
            "40000".to_owned(),
            "40000".to_owned(),
            "120000".to_owned(),
            format!("{:0>40} {:0>40}", 0, 9999),
        ]
    );
}

#[test]
fn a_missing_interpreter_is_named_and_the_script_cannot_execute() {
    let store = Store::file();
    let scratch = Scratch::new();
    let script = executable(scratch.dir(), "broken", "#! /nonexistent/interpreter -x\n");
    let by_path = run(store
        .lockrun()
        .args(["--name", "interp", "--"])
        .arg(&script));
    let search = format!(
        "{}:{}",
        scratch.dir().display(),
        std::env::var("PATH").unwrap()
    );
    let in_path = run(store
        .lockrun()
        .env("PATH", search)
        .args(["--name", "interp", "--", "broken"]));
    for output in [by_path, in_path] {
        assert_status(&output, 126);
        let err = stderr(&output);
        assert!(
            err.contains("its interpreter /nonexistent/interpreter was not found"),
            "{err}"
        );
        assert!(err.contains(&script.display().to_string()), "{err}");
    }
}

#[test]
fn the_command_is_looked_up_in_path_as_execvp_does() {
    let store = Store::file();
    let scratch = Scratch::new();
    let (denied, allowed) = (scratch.path("denied"), scratch.path("allowed"));
    for dir in [&denied, &allowed] {
        fs::create_dir(dir).unwrap();
    }
    fs::write(denied.join("tool"), "exit 1\n").unwrap();
    let marker = format!("echo ran > '{}'\n", scratch.path("ran").display());
    executable(&allowed, "tool", &marker);
    let search = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
    let lookup = |path: std::ffi::OsString, name: &str| {
        run(store
            .lockrun()
            .env("PATH", path)
            .current_dir(&allowed)
            .args(["--name", "lookup", "--", name]))
    };
    // A file that may not be executed is passed over for one further on.
    assert_status(&lookup(search(&[&denied, &allowed]), "tool"), 0);
    assert_eq!(scratch.lines("ran"), ["ran"]);
    fs::remove_file(scratch.path("ran")).unwrap();
    // An empty entry is the current directory.
    assert_status(&lookup(search(&[&denied, Path::new("")]), "tool"), 0);
    assert_eq!(scratch.lines("ran"), ["ran"]);
    // Found only where it may not be executed: cannot execute, not "not found".
    let output = lookup(search(&[&denied, &scratch.path("none")]), "tool");
    assert_status(&output, 126);
    assert!(stderr(&output).contains("Permission denied"));
    let output = lookup(search(&[&denied, &allowed]), "absent");
    assert_status(&output, 127);
    assert!(stderr(&output).contains("command not found: absent"));
}

/// `killall -9 lockrun`, `pkill -9 lockrun` and `pkill -9 -f lockrun` kill every
/// process called lockrun: the watchdog is not one of them, and ends the
/// command's background children before another holder can start. Run in a pid
/// namespace of its own, so that no other test's lockrun is in reach.
#[test]
fn killing_lockrun_by_name_leaves_nothing_running_without_the_lock() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a pid namespace of the test's own needs root");
        return;
    }
    for kill_by_name in [
        "pkill -9 lockrun",
        "pkill -9 -f lockrun",
        "pkill -9 -x lockrun",
    ] {
        let scratch = Scratch::new();
        let lockrun = scratch.path("lockrun");
        // Run as `lockrun` whatever cargo named the binary, as an operator would see it.
        std::fs::copy(env!("CARGO_BIN_EXE_lockrun"), &lockrun).unwrap();
        let script = format!(
            r#"cd '{dir}'
./lockrun --dir locks --name k -c 'sleep 300 & echo $! > bg; touch ready; wait' &
while [ ! -e ready ]; do sleep 0.01; done
{kill_by_name}
bg=$(cat bg)
while kill -0 "$bg" 2>/dev/null; do sleep 0.01; done
./lockrun --dir locks --name k -n true && touch free"#,
            dir = scratch.dir().display(),
        );
        let output = run(std::process::Command::new("unshare").args([
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            &script,
        ]));
        assert!(
            output.status.success(),
            "{kill_by_name}: {}",
            stderr(&output)
        );
        assert!(
            scratch.path("free").exists(),
            "{kill_by_name}: the background child was stopped and the lock is free"
        );
    }
}

/// A lockrun that is stopped alone (SIGSTOP, a debugger) cannot stop its
/// command at the lease's end: its watchdog does, before another holder starts.
#[test]
fn the_watchdog_stops_the_command_of_a_stopped_lockrun_before_its_lease_ends() {
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let script = format!(
        "echo $$ > '{ready}'; while :; do date +%s%N > '{last}.tmp' && mv '{last}.tmp' '{last}'; sleep 0.01; done",
        ready = scratch.path("ready").display(),
        last = scratch.path("last").display(),
    );
    let mut holder = store
        .lockrun()
        .args([
            "--name",
            "stalled",
            "--ttl",
            "1.5",
            "--kill-grace",
            "0.3",
            "-c",
            &script,
        ])
        .start();
    read_pid(&scratch.path("ready"));
    let mut next = store
        .lockrun()
        .args(["--name", "stalled", "-w", "20", "--", "sh", "-c"])
        .arg(format!("date +%s%N > '{}'", scratch.path("next").display()))
        .start();
    signal(holder.id(), Signal::SIGSTOP);
    assert_eq!(
        wait(&mut next).code(),
        Some(0),
        "the next holder got the slot"
    );
    let nanos = |name: &str| -> i128 {
        std::fs::read_to_string(scratch.path(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let gap_ms = (nanos("next") - nanos("last")) as f64 / 1e6;
    assert!(
        gap_ms > 0.0,
        "the stopped holder's command ran {:.0} ms into the next holder's turn",
        -gap_ms
    );
    signal(holder.id(), Signal::SIGCONT);
    assert_eq!(wait(&mut holder).code(), Some(76), "the lease was lost");
}

/// With -v, why lockrun stopped the command comes before the release.
#[test]
fn verbose_says_why_the_command_was_stopped_before_the_release() {
    let store = Store::file();
    let output = run(store.lockrun().args([
        "-v",
        "--name",
        "x",
        "--max-runtime",
        "0.2",
        "--",
        "sleep",
        "30",
    ]));
    assert_status(&output, 124);
    let err = stderr(&output);
    let at = |what: &str| {
        err.find(what)
            .unwrap_or_else(|| panic!("no {what:?} in {err}"))
    };
    assert!(
        at("stopped the command: --max-runtime") < at("released x"),
        "{err}"
    );
}
