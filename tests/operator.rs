//! Operator tools (docs/operating.md: "Operating lockrun"; docs/guide.md: "The
//! waiting line"): status,
//! release, the live waiting line on a terminal, `-v` text and `--log-format json` events.

use std::fs::{self, File};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::core::{hold, start_holding};
use crate::support::*;

/// Lets the test go on: the holder started by `hold` exits.
fn let_go(scratch: &Scratch, mut holder: Running) {
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

fn is_rfc3339(text: &str) -> bool {
    // 2026-11-21T12:56:05.123Z
    let bytes = text.as_bytes();
    bytes.len() == 24
        && text.ends_with('Z')
        && bytes[10] == b'T'
        && text[..4].parse::<u32>().is_ok()
        && [4, 7].iter().all(|&i| bytes[i] == b'-')
        && [13, 16].iter().all(|&i| bytes[i] == b':')
}

#[test]
fn status_prints_an_aligned_table_of_real_holders() {
    let store = Store::file();
    let first = Scratch::new();
    let second = Scratch::new();
    let backup = hold(&store, &first, "backup", &[]);
    let report = hold(&store, &second, "nightly report", &["-p", "3"]);
    let output = run(&mut store.status());
    assert_status(&output, 0);
    let text = stdout(&output);
    let place = format!("locks in directory {}", store.dir().display());
    assert!(
        text.starts_with(&format!("{place}\n")),
        "where they are first: {text}"
    );
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "a header and one row per holder: {text}");
    for column in [
        "NAME", "STATE", "SLOT", "LINE", "PID", "HOST", "SINCE", "FOR", "EXPIRES", "FENCE",
        "COMMAND",
    ] {
        assert!(lines[0].contains(column), "{text}");
    }
    assert!(lines[1].starts_with("backup ") && lines[1].contains(&backup.id().to_string()));
    assert!(lines[2].starts_with("nightly report ") && lines[2].contains(&report.id().to_string()));
    // Columns line up: every cell starts where its header does.
    let command_at = lines[0].find("COMMAND").unwrap();
    for line in &lines[1..] {
        assert!(line[command_at..].starts_with("/bin/sh"), "{text}");
        assert_eq!(&line[command_at - 2..command_at], "  ", "{text}");
    }

    let output = run(store.status().arg("backup"));
    assert_eq!(
        stdout(&output).lines().count(),
        3,
        "only the name asked for"
    );
    let_go(&first, backup);
    let_go(&second, report);
    assert_eq!(
        stdout(&run(store.status().arg("backup"))),
        format!(
            "backup is not held in directory {}\n",
            store.dir().display()
        )
    );
    assert_eq!(
        stdout(&run(&mut store.status())),
        format!("no lock is held in directory {}\n", store.dir().display())
    );
}

#[test]
fn status_aligns_wide_characters_by_the_columns_they_take() {
    let store = Store::file();
    let first = Scratch::new();
    let second = Scratch::new();
    // Six columns each: wider than NAME, as wide as each other.
    let wide = hold(&store, &first, "备份🔒", &[]);
    let narrow = hold(&store, &second, "backup", &[]);
    let text = stdout(&run(&mut store.status()));
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert!(lines[0].starts_with("NAME    STATE"), "{text}");
    assert!(lines[1].starts_with("backup  holding"), "{text}");
    assert!(lines[2].starts_with("备份🔒  holding"), "{text}");
    let_go(&first, wide);
    let_go(&second, narrow);
}

#[test]
fn status_json_has_exactly_the_spec_keys() {
    let store = Store::file();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "keys", &[]);
    let output = run(store.status().arg("--json"));
    assert_status(&output, 0);
    let holders: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let object = holders[0].as_object().expect("an array of objects");
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "acquired_at",
            "backend",
            "command",
            "expires_at",
            "fence",
            "host",
            "mode",
            "name",
            "note",
            "pid",
            "position",
            "slot",
            "state",
            "user"
        ]
    );
    assert_eq!(object["backend"], "file");
    assert_eq!(object["state"], "holding");
    assert_eq!(object["position"], 0);
    assert_eq!(object["slot"], 0);
    assert!(object["fence"].as_u64().is_some_and(|f| f >= 1));
    assert!(
        object["acquired_at"].as_str().is_some_and(is_rfc3339),
        "{object:?}"
    );
    assert_eq!(
        object["expires_at"],
        Value::Null,
        "file locks have no lease"
    );
    assert_eq!(object["command"], "/bin/sh", "the program, not its script");
    // By name, or by uid where the user has none (as `id` says).
    let id = |flag: &str| std::process::Command::new("id").arg(flag).output();
    let by_name = id("-un").expect("id runs");
    let user = if by_name.status.success() {
        by_name
    } else {
        id("-u").expect("id runs")
    };
    let user = String::from_utf8_lossy(&user.stdout);
    assert_eq!(object["user"], user.trim(), "the holder's user");
    let_go(&scratch, holder);
}

#[test]
fn release_on_the_file_backend_refuses_with_or_without_force() {
    let store = Store::file();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "kept", &[]);
    let release = |extra: &[&str]| run(store.release().arg("kept").args(extra));
    for extra in [&[][..], &["--force"], &["--force", "--slot", "0"]] {
        let output = release(extra);
        assert_status(&output, 64);
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("held by pid {}", holder.id())),
            "{extra:?}: {err}"
        );
    }
    let_go(&scratch, holder);
    let output = release(&["--force"]);
    assert_status(&output, 64);
    assert!(
        stderr(&output).contains("nobody holds it"),
        "{}",
        stderr(&output)
    );
}

/// A waiter on `name` with `args`, once `hold` has the lock.
fn waiter(store: &Store, name: &str, args: &[&str]) -> std::process::Command {
    let mut command = store.lockrun();
    command
        .args(["--name", name])
        .args(args)
        .stdout(Stdio::null());
    command
}

#[test]
fn a_wait_on_a_terminal_shows_one_self_updating_line() {
    use nix::pty::Winsize;

    let store = Store::file();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "backup", &[]);
    let size = Winsize {
        ws_row: 24,
        ws_col: 200,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = crate::support::pty::open(Some(&size));
    // Retry steps of 20 s: every redraw comes from the live line, not from a backoff step.
    let mut command = waiter(
        &store,
        "backup",
        &[
            "-w",
            "60",
            "--initial-delay",
            "20",
            "--max-delay",
            "20",
            "true",
        ],
    );
    command.stderr(Stdio::from(pty.slave));
    let spawned = Instant::now();
    let mut lockrun = command.start();
    drop(command); // our copy of the terminal's slave side: the reader sees EOF once lockrun is done
    let (sender, receiver) = mpsc::channel();
    let mut master = File::from(pty.master);
    thread::spawn(move || {
        let mut buffer = [0; 4096];
        // Reading the master fails (EIO) once every slave side is closed.
        while let Ok(n @ 1..) = master.read(&mut buffer) {
            let _ = sender.send((buffer[..n].to_vec(), Instant::now()));
        }
    });

    let mut screen = String::new();
    let mut first_draw = None;
    let count_draws = |screen: &str| screen.matches("\r\x1b[Kwaiting for backup").count();
    while count_draws(&screen) < 3 {
        let (bytes, at) = receiver.recv_timeout(PATIENCE).expect("the waiting line");
        screen.push_str(&String::from_utf8_lossy(&bytes));
        first_draw.get_or_insert(at);
    }
    assert!(
        first_draw.unwrap() - spawned >= Duration::from_secs(1),
        "the line waits a second before it appears"
    );
    let_go(&scratch, holder);
    let released = Instant::now();
    assert_eq!(wait(&mut lockrun).code(), Some(0));
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "the kernel wait still wakes the waiter at once"
    );
    while let Ok((bytes, _)) = receiver.recv_timeout(PATIENCE) {
        screen.push_str(&String::from_utf8_lossy(&bytes));
    }

    assert!(
        !screen.contains('\n'),
        "one line, rewritten in place: {screen:?}"
    );
    assert!(
        screen.ends_with("\r\x1b[K"),
        "cleared once acquired: {screen:?}"
    );
    let drawn: Vec<&str> = screen
        .split("\r\x1b[K")
        .filter(|text| !text.is_empty())
        .collect();
    let holder_pid = drawn[0]
        .split("held by pid ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("the holder's pid");
    assert!(
        holder_pid.parse::<u32>().is_ok() && drawn[0].contains("(/bin/sh)"),
        "who holds it: {drawn:?}"
    );
    assert!(
        drawn.iter().all(|text| text.chars().count() < 200),
        "cut to the terminal's width, so it never wraps: {drawn:?}"
    );
    // The first three draws came while the holder was certainly there.
    assert!(
        drawn[..3]
            .windows(2)
            .all(|pair| pair[0] != pair[1] && pair[1].contains(" for ")),
        "each redraw says for how long it has been held: {drawn:?}"
    );
}

#[test]
fn without_a_terminal_a_wait_is_silent_unless_verbose() {
    let store = Store::file();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "quiet", &[]);
    let output = run(&mut waiter(&store, "quiet", &["-w", "1.3", "true"]));
    assert_status(&output, 75);
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "only the give-up line: {err:?}");
    assert!(!err.contains('\r'));

    let output = run(&mut waiter(
        &store,
        "quiet",
        &["-v", "-w", "0.4", "--initial-delay", "0.1", "true"],
    ));
    assert_status(&output, 75);
    let err = stderr(&output);
    let lines = one_runs_lines(&err);
    let place = format!("the lock is in directory {}", store.dir().display());
    assert_eq!(lines[0], place, "{err}");
    let holder_pid = holder.id();
    assert!(
        lines[1].starts_with(&format!(
            "waiting for quiet: 1st in line, held by pid {holder_pid} on "
        )) && lines[1].contains("(/bin/sh)"),
        "{err}"
    );
    // The waiter sleeps in the kernel until the holder goes: there is no next try to announce.
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines[2].contains("gave up after"), "{err}");
    assert!(!err.contains('\r'), "plain lines: {err:?}");
    let_go(&scratch, holder);

    let output = run(&mut waiter(&store, "quiet", &["-v", "true"]));
    assert_status(&output, 0);
    let err = stderr(&output);
    let lines = one_runs_lines(&err);
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[1].starts_with("acquired quiet (slot 0, fence 2) after "),
        "{err}"
    );
    assert_eq!(lines[2], "released quiet (slot 0)");
}

/// The text of `-v` lines, which all name the same run: `lockrun[PID]: ...`.
fn one_runs_lines(err: &str) -> Vec<&str> {
    let mut pids = std::collections::HashSet::new();
    let lines = err
        .lines()
        .map(|line| {
            let (pid, text) = line
                .strip_prefix("lockrun[")
                .and_then(|rest| rest.split_once("]: "))
                .unwrap_or_else(|| panic!("a line that names its run: {line:?}"));
            pids.insert(pid.parse::<u32>().expect("a pid"));
            text
        })
        .collect();
    assert_eq!(pids.len(), 1, "one run's lines: {err}");
    lines
}

/// Every stderr line as a JSON event, checking the fields every event has.
fn events(output: &std::process::Output, name: &str) -> Vec<Value> {
    stderr(output)
        .lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line).expect("one JSON object per line");
            assert!(event["ts"].as_str().is_some_and(is_rfc3339), "{line}");
            assert_eq!(event["name"], name, "{line}");
            assert!(event["pid"].as_u64().is_some(), "{line}");
            event
        })
        .collect()
}

#[test]
fn json_events_for_waiting_retry_error_acquired_and_released() {
    // A backend that is told when the line moves looks again after each backoff step at the latest.
    let store = Store::sqlite();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "logged", &[]);
    let json = ["--log-format", "json"];
    let output =
        run(waiter(&store, "logged", &json).args(["-w", "0.4", "--initial-delay", "0.1", "true"]));
    assert_status(&output, 75);
    let mut busy = events(&output, "logged");
    let place = busy.remove(0);
    assert_eq!(place["event"], "notice");
    assert!(
        place["message"]
            .as_str()
            .is_some_and(|said| said.starts_with("the lock is in SQLite database ")),
        "{place}"
    );
    let kinds: Vec<&str> = busy.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "waiting", "{kinds:?}");
    assert_eq!(kinds[1], "retry", "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"error"), "{kinds:?}");
    assert_eq!(busy[0]["position"], 1);
    assert_eq!(busy[0]["holders"][0]["pid"], holder.id());
    assert_eq!(busy[0]["holders"][0]["slot"], 0);
    assert!(
        busy[0]["holders"][0]["acquired_at"]
            .as_str()
            .is_some_and(is_rfc3339)
    );
    assert_eq!(busy[1]["reason"], "contended");
    assert_eq!(busy[1]["position"], 1);
    let delay = busy[1]["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        (50..=150).contains(&delay),
        "jittered around 100ms: {delay}"
    );
    assert!(
        busy.last().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("busy")
    );
    let_go(&scratch, holder);

    let output = run(waiter(&store, "logged", &json).arg("true"));
    assert_status(&output, 0);
    let mut done = events(&output, "logged");
    assert_eq!(done.remove(0)["event"], "notice", "where the lock is");
    assert_eq!(done.len(), 2, "{done:?}");
    assert_eq!(done[0]["event"], "acquired");
    assert_eq!(done[0]["slot"], 0);
    assert!(done[0]["fence"].as_u64().is_some_and(|fence| fence >= 2));
    assert!(done[0]["waited_ms"].as_u64().is_some());
    assert_eq!(done[1]["event"], "released");
    assert_eq!(done[1]["slot"], 0);
    assert_eq!(done[1]["pid"], done[0]["pid"]);

    // -q silences JSON events too, and the environment chooses the format.
    let output = run(waiter(&store, "logged", &["-q"])
        .env("LOCKRUN_LOG_FORMAT", "json")
        .arg("true"));
    assert!(output.stderr.is_empty());
    let output = run(waiter(&store, "logged", &[])
        .env("LOCKRUN_LOG_FORMAT", "json")
        .arg("true"));
    assert_eq!(
        events(&output, "logged").len(),
        3,
        "notice, acquired, released"
    );
}

#[test]
fn a_failed_write_to_stdout_is_an_output_error_and_a_closed_pipe_is_none() {
    let store = Store::file();
    let full = File::create("/dev/full").expect("/dev/full");
    let output = finish(store.status().stdout(full).stderr(Stdio::piped()).start());
    assert_status(&output, 74);
    assert_eq!(
        stderr(&output),
        "lockrun: cannot write to stdout: No space left on device\n"
    );

    // `lockrun status | head -0`: the reader is gone before lockrun writes.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = finish(store.status().stdout(writer).stderr(Stdio::piped()).start());
    assert_status(&output, 0);
    assert_eq!(stderr(&output), "", "nothing scary on a closed pipe");
}

#[test]
fn a_holder_started_without_stderr_writes_its_diagnostics_into_no_lock_file() {
    // Without its standard descriptors, the slot's lock file would be opened as
    // fd 2 and `-v`'s lines written over the holder's record.
    let store = Store::file();
    let scratch = Scratch::new();
    let mut closed_stderr = without_lockrun_variables(Command::new("sh"));
    closed_stderr
        .args([
            "-c",
            "exec 2>&-; exec \"$@\"",
            "sh",
            env!("CARGO_BIN_EXE_lockrun"),
            "-v",
        ])
        .args(store.args());
    let holder = start_holding(closed_stderr, &scratch, "backup", &[], "");
    let output = run(store.status().args(["backup", "--json"]));
    assert_status(&output, 0);
    let entries: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(entries[0]["name"], "backup", "{entries}");
    assert!(
        entries[0]["command"] == "/bin/sh" && entries[0]["user"].is_string(),
        "the holder's record is intact: {entries}"
    );
    let_go(&scratch, holder);
}

#[test]
fn text_a_neighbour_wrote_reaches_no_terminal_raw() {
    let store = Store::file();
    let red = "\u{1b}[31m";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // The pid of the process that holds the planted locks (this one), as a lockrun's record has it.
    let me = std::process::id();
    let owner = format!(
        r#""token":"t","pid":{me},"host":"web{red}","command":"rm{red} -rf /""#,
        red = "\\u001b[31m"
    );
    let _holder = planted_lock(
        &store.dir().join("evil.0.lock"),
        &format!(
            r#"{{"name":"evil{red}",{owner},"acquired_at":{now},"fence":7}}"#,
            red = "\\u001b[31m"
        ),
    );
    let _waiter = planted_lock(
        &store.dir().join("evil.00000000000000000001-1.wait"),
        &format!(
            r#"{{"name":"evil{red}",{owner},"since":{now}}}"#,
            red = "\\u001b[31m"
        ),
    );
    let raw = |output: &std::process::Output| {
        output.stdout.contains(&0x1b) || output.stderr.contains(&0x1b)
    };

    for args in [&["evil"][..], &[]] {
        let output = run(store.status().args(args));
        assert_status(&output, 0);
        assert!(!raw(&output), "{output:?}");
        let table = stdout(&output);
        assert_eq!(
            table.lines().count(),
            4,
            "where, a holder and a waiter: {table}"
        );
        assert!(table.contains(r"rm\u{1b}[31m -rf /"), "{table}");
    }
    let output = run(store.status().arg("--json"));
    assert!(!raw(&output), "{output:?}");
    let entries: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        entries[0]["host"],
        format!("web{red}"),
        "JSON keeps the text, escaped"
    );
    assert_eq!(entries[1]["name"], format!("evil{red}"));

    let output = run(store.lockrun().args(["--name", "evil", "-v", "-n", "true"]));
    assert_status(&output, 75);
    assert!(!raw(&output), "{output:?}");
    let err = stderr(&output);
    assert!(
        err.contains(&format!(r"held by pid {me} on web\u{{1b}}[31m")),
        "{err}"
    );

    let output = run(store.release().args(["evil", "--force"]));
    assert_status(&output, 64);
    assert!(!raw(&output), "{output:?}");
}

#[test]
fn a_holder_that_wrote_no_record_shows_unknown_times_not_1970() {
    let store = Store::file();
    let _holder = planted_lock(&store.dir().join("mute.0.lock"), "");
    let me = std::process::id();

    let output = run(store.status().arg("mute"));
    assert_status(&output, 0);
    let table = stdout(&output);
    let row = table.lines().nth(2).expect("a row for the holder");
    let cells: Vec<&str> = row.split_whitespace().collect();
    // NAME STATE MODE SLOT LINE PID USER SINCE FOR EXPIRES FENCE COMMAND; the host is empty, and
    // the command says that the holder (this test) is not lockrun.
    assert_eq!(
        cells,
        [
            "mute",
            "holding",
            "exclusive",
            "0",
            "-",
            &me.to_string(),
            "-",
            "-",
            "-",
            "-",
            "-",
            "not",
            "lockrun:",
            "flock(1)?"
        ],
        "{table}"
    );
    assert!(!table.contains("1970"), "{table}");

    let output = run(store.status().args(["mute", "--json"]));
    let entries: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(entries[0]["acquired_at"], Value::Null, "{entries}");
    assert_eq!(entries[0]["pid"], me);

    let output =
        run(store
            .lockrun()
            .args(["--name", "mute", "-v", "-n", "--log-format", "json", "true"]));
    assert_status(&output, 75);
    let waiting = events(&output, "mute").remove(0);
    assert_eq!(
        waiting["holders"][0]["acquired_at"],
        Value::Null,
        "{waiting}"
    );

    let output = run(store.lockrun().args(["--name", "mute", "-v", "-n", "true"]));
    let err = stderr(&output);
    assert!(
        err.contains(&format!("held by pid {me} (not lockrun: flock(1)?)\n")),
        "{err}"
    );
    assert!(!err.contains("1970") && !err.contains(" for "), "{err}");
}

/// `lockrun check` on a store that needs no probe: it says that the store
/// answers (exit 0), that none is made yet, or why it cannot be used (69).
#[test]
fn check_says_whether_the_store_answers() {
    let store = Store::file();
    let output = run(lockrun().arg("check").args(store.args()));
    assert_status(&output, 0);
    assert!(
        stdout(&output).starts_with("reachable: "),
        "{}",
        stdout(&output)
    );
    let scratch = Scratch::new();
    let missing = scratch.path("not-yet.sqlite3");
    let output = run(lockrun()
        .args(["check", "-b", "sqlite", "--db"])
        .arg(&missing));
    assert_status(&output, 0);
    assert!(
        stdout(&output).starts_with("no lockrun store yet"),
        "{}",
        stdout(&output)
    );
    assert!(!missing.exists(), "check made the database");
    let not_a_database = scratch.path("text");
    fs::write(&not_a_database, "not a database, not at all, just text").unwrap();
    let output = run(lockrun()
        .args(["check", "-b", "sqlite", "--db"])
        .arg(&not_a_database));
    assert_status(&output, 69);
}
