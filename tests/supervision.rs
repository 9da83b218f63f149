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
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let output = child.wait_with_output().unwrap();
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
        .spawn()
        .unwrap();
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
