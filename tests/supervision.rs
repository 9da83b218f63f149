//! Supervising the command (SPEC §3): stdio, escalation on a second signal.

use std::io::Write;
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
    assert_eq!(kinds, ["acquired", "released"]);
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
