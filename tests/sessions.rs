//! Where users run lockrun (docs/recipes.md: "Recipes"; docs/backends/file.md:
//! "File backend"; README: "Exit status"):
//! cron next to a login shell, containers without an init, shell scripts that
//! nest lockruns, and the monitoring that asks `status`.

use crate::support::*;

#[test]
fn max_runtime_zero_means_no_limit() {
    let store = Store::file();
    let output = run(store
        .lockrun()
        .args(["--name", "x", "--max-runtime", "0", "-c", "exit 3"]));
    assert_status(&output, 3);
}

#[test]
fn a_bad_value_from_a_variable_names_the_variable() {
    let store = Store::file();
    let line = usage_line(&run(store
        .lockrun()
        .env("LOCKRUN_TIMEOUT", "bogus")
        .args(["--name", "x", "true"])));
    assert!(line.contains("LOCKRUN_TIMEOUT"), "{line}");
    // Typed on the command line, it is the option's.
    let line = usage_line(&run(store
        .lockrun()
        .env("LOCKRUN_TIMEOUT", "bogus")
        .args(["--name", "x", "-w", "never", "true"])));
    assert!(
        !line.contains("LOCKRUN_TIMEOUT") && line.contains("--timeout"),
        "{line}"
    );
    let line = usage_line(&run(store
        .status()
        .env("LOCKRUN_PREFIX", "x")
        .env("LOCKRUN_LOG_FORMAT", "yaml")));
    assert!(line.contains("LOCKRUN_LOG_FORMAT"), "{line}");
}

#[test]
fn backend_names_are_taken_in_any_case() {
    let dir = tempfile::TempDir::new().unwrap();
    let db = dir.path().join("locks.sqlite3");
    let scratch = Scratch::new();
    let output = run(lockrun()
        .args(["-b", "SQLite", "--db"])
        .arg(&db)
        .args(["--name", "x", "-c"])
        .arg(format!(
            "echo $LOCKRUN_BACKEND > {}",
            scratch.path("backend").display()
        )));
    assert_status(&output, 0);
    assert_eq!(scratch.lines("backend"), ["sqlite"]);
    let output = run(lockrun()
        .env("LOCKRUN_BACKEND", "FILE")
        .arg("status")
        .arg("--dir")
        .arg(dir.path()));
    assert_status(&output, 0);
}

/// A login shell's lockrun (with `XDG_RUNTIME_DIR`, `TMPDIR` and `HOME` of its
/// session) holds a name; cron's (none of them) must find it held, and `-v`
/// and `status` say where it is.
#[test]
fn cron_and_a_login_shell_share_the_default_directory() {
    let scratch = Scratch::new();
    let (run_lock, var_tmp) = (scratch.path("run-lock"), scratch.path("var-tmp"));
    for dir in [&run_lock, &var_tmp] {
        std::fs::create_dir(dir).unwrap();
        let sticky = std::os::unix::fs::PermissionsExt::from_mode(0o1777);
        std::fs::set_permissions(dir, sticky).unwrap();
    }
    let Some(mut shell) = with_default_dirs_in(&run_lock, &var_tmp) else {
        return;
    };
    let script = format!(
        r#"ready='{ready}'
XDG_RUNTIME_DIR='{session}' TMPDIR='{session}' "$lockrun" -v --name nightly -- sh -c ": > '$ready'; sleep 30" 2> '{holder}' &
holder=$!
while [ ! -e "$ready" ]; do sleep 0.01; done
env -u XDG_RUNTIME_DIR -u TMPDIR HOME=/nonexistent "$lockrun" -n --name nightly -- true 2> '{cron}'
echo "cron $?"
"$lockrun" status
kill $holder; wait"#,
        ready = scratch.path("ready").display(),
        session = scratch.dir().display(),
        holder = scratch.path("holder.err").display(),
        cron = scratch.path("cron.err").display(),
    );
    let output = run(shell.args(["sh", "-c", &script]));
    let out = stdout(&output);
    assert!(
        out.contains("cron 75"),
        "cron's run found the lock held: {out}"
    );
    let uid = nix::unistd::geteuid();
    let dir = format!("directory /run/lock/lockrun-{uid}");
    assert!(
        out.contains(&format!("locks in {dir}")),
        "status says where: {out}"
    );
    let said = std::fs::read_to_string(scratch.path("holder.err")).unwrap();
    assert!(
        said.contains(&format!("the lock is in {dir}")),
        "-v says where: {said}"
    );
    assert!(
        run_lock
            .join(format!("lockrun-{uid}/nightly.0.lock"))
            .exists()
    );
}

/// `status` on a store nobody made yet (a fresh account, a new database, an
/// empty server): nothing is held, exit 0, and nothing is made for asking.
pub fn status_on_a_store_not_made_yet_says_nothing_is_held(store: &Store) {
    let scratch = Scratch::new();
    // The file and SQLite stores are paths: point them at ones that do not exist yet.
    let missing = scratch.path("not-yet/locks");
    let status = || {
        let mut command = lockrun();
        command.arg("status");
        let mut args = store.args().iter();
        while let Some(arg) = args.next() {
            command.arg(arg);
            if arg == "--dir" || arg == "--db" {
                args.next();
                command.arg(&missing);
            }
        }
        command
    };
    let output = run(&mut status());
    assert_status(&output, 0);
    let out = stdout(&output);
    assert!(out.starts_with("no lock is held"), "{out}");
    let output = run(status().args(["nightly", "--json"]));
    assert_status(&output, 0);
    assert_eq!(stdout(&output), "[]\n");
    assert!(!scratch.path("not-yet").exists(), "nothing made");
}

#[test]
fn a_released_file_slot_keeps_no_command_line() {
    let store = Store::file();
    let output = run(store
        .lockrun()
        .args(["--name", "db", "--", "true", "--password=s3cret"]));
    assert_status(&output, 0);
    let record = std::fs::read_to_string(store.dir().join("db.0.lock")).unwrap();
    assert!(!record.contains("s3cret"), "{record}");
    assert!(record.contains("\"fence\":1"), "the fence stays: {record}");
}

/// In a container whose PID 1 never reaps, the command's leftovers end as
/// zombies that lockrun, their subreaper, reaps: the next run has the lock
/// within 50 ms of the group's end, not after the kill grace.
#[test]
fn the_lock_is_free_at_once_under_a_pid_1_that_never_reaps() {
    let Some(mut container) = in_a_pid_namespace() else {
        return;
    };
    let store = Store::file();
    let scratch = Scratch::new();
    let dir = store.dir();
    let script = format!(
        r#"cd '{scratch}'
"$lockrun" --dir '{dir}' --name z -- sh -c ': > held; sleep 100 & sleep 0.2; date +%s%N > ended' &
while [ ! -e held ]; do sleep 0.01; done
"$lockrun" --dir '{dir}' --name z --log-format json -- true 2> next &
exec sleep 60"#,
        scratch = scratch.dir().display(),
        dir = dir.display(),
    );
    let _container = container.args(["sh", "-c", &script]).start();
    let mut acquired = None;
    wait_until("the next run's acquisition", || {
        acquired = scratch
            .lines("next")
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|event| event["event"] == "acquired");
        acquired.is_some()
    });
    let ended: u128 = scratch.lines("ended")[0].parse().unwrap();
    let at = acquired.unwrap()["ts"].as_str().unwrap().to_owned();
    let taken = epoch_millis_of(&at);
    let gap = taken.saturating_sub(ended / 1_000_000);
    assert!(
        gap < 50,
        "the next run had the lock {gap} ms after the group ended"
    );
}

/// Under a PID 1 that never reaps (a container), lockrun reaps its own
/// watchdog: twenty runs leave no zombie behind, where a cron job would
/// otherwise leave one a minute.
#[test]
fn runs_leave_no_zombie_under_a_pid_1_that_never_reaps() {
    let store = Store::file();
    let scratch = Scratch::new();
    let runs = format!(
        r#"for i in $(seq 20); do "$lockrun" --dir '{dir}' --name z -- true; done"#,
        dir = store.dir().display(),
    );
    if let Some(zombies) = zombies_under_a_pid_1_that_never_reaps(&scratch, &runs) {
        assert!(zombies.is_empty(), "zombies left: {zombies:?}");
    }
}

/// The zombies that the shell code `lines`, run in `scratch` by a child of a
/// PID 1 that never reaps (a container), leaves behind (`$lockrun` is lockrun);
/// `None` where no pid namespace can be made.
fn zombies_under_a_pid_1_that_never_reaps(scratch: &Scratch, lines: &str) -> Option<Vec<String>> {
    let mut container = in_a_pid_namespace()?;
    let script = format!(
        r"cd '{scratch}'
( {lines}
  ps -eo stat=,args= > processes; : > done ) &
exec sleep 60",
        scratch = scratch.dir().display(),
    );
    let _container = container.args(["sh", "-c", &script]).start();
    wait_until("the runs", || scratch.path("done").exists());
    let processes = scratch.lines("processes");
    Some(
        processes
            .into_iter()
            .filter(|line| line.starts_with('Z'))
            .collect(),
    )
}

/// A waiting lockrun has its command's watchdog already; ended by a signal
/// while it waits (SIGTERM, SIGHUP), it ends and reaps it first, so it leaves
/// no zombie under a PID 1 that never reaps (a container), however often a
/// job that waits is cancelled.
#[test]
fn a_waiter_ended_by_a_signal_leaves_no_zombie_under_a_pid_1_that_never_reaps() {
    let store = Store::file();
    let scratch = Scratch::new();
    let runs = format!(
        r#""$lockrun" --dir '{dir}' --name z -- sh -c ': > held; while [ ! -e release ]; do sleep 0.01; done' &
  while [ ! -e held ]; do sleep 0.01; done
  for signal in TERM HUP; do
    "$lockrun" --dir '{dir}' --name z -- true & waiter=$!
    until ps -o comm= --ppid $waiter | grep -q lr-watchdog; do sleep 0.01; done
    kill -$signal $waiter; wait $waiter; echo $? >> statuses
  done
  : > release; wait"#,
        dir = store.dir().display(),
    );
    if let Some(zombies) = zombies_under_a_pid_1_that_never_reaps(&scratch, &runs) {
        assert_eq!(
            scratch.lines("statuses"),
            ["143", "129"],
            "ended by the signals"
        );
        assert!(zombies.is_empty(), "zombies left: {zombies:?}");
    }
}

/// Told at the end of the command's group, a watchdog that outlives lockrun
/// stops nothing, however long the release takes: not even a process that has
/// the command's pid, and so its group's id, by then. A holder whose release
/// strace holds up for 3 s is killed meanwhile, after a new process group took
/// the command's id (the pid namespace's next pid set to it); it must live on.
#[test]
fn a_holder_killed_in_its_release_leaves_a_new_owner_of_its_commands_pid_alone() {
    if !strace_traces("a release held up") {
        return;
    }
    let Some(mut container) = in_a_pid_namespace() else {
        return;
    };
    let store = Store::file();
    let scratch = Scratch::new();
    let script = format!(
        r#"cd '{scratch}'
"$lockrun" --dir '{dir}' --name r -- sh -c 'echo $$ > command; while [ ! -e end ]; do sleep 0.01; done' & holder=$!
while [ ! -s command ]; do sleep 0.01; done
command=$(cat command)
strace -o /dev/null -e trace=flock -e inject=flock:delay_enter=3000000 -p $holder 2> strace & tracer=$!
until grep -q attached strace; do sleep 0.01; done
: > end
while [ -e /proc/$command ]; do sleep 0.01; done
echo $((command - 1)) > /proc/sys/kernel/ns_last_pid
setsid sleep 60 & stranger=$!
[ "$stranger" = "$command" ] && echo took > taken
kill -KILL $holder; wait $holder $tracer
while ps -eo stat=,comm= | grep -v '^Z' | grep -q lr-watchdog; do sleep 0.01; done
kill -0 $stranger && echo alive > stranger
: > done
exec sleep 60"#,
        scratch = scratch.dir().display(),
        dir = store.dir().display(),
    );
    let _container = container.args(["sh", "-c", &script]).start();
    wait_until("the holder killed and its watchdog gone", || {
        scratch.path("done").exists()
    });
    assert_eq!(
        scratch.lines("taken"),
        ["took"],
        "a new process had the command's pid"
    );
    assert_eq!(
        scratch.lines("stranger"),
        ["alive"],
        "the watchdog killed the group that took the command's id"
    );
}

/// Milliseconds since the epoch of an RFC 3339 time in UTC with milliseconds (`2026-11-21T13:09:17.402Z`).
fn epoch_millis_of(ts: &str) -> u128 {
    let output = std::process::Command::new("date")
        .args(["-d", ts, "+%s%3N"])
        .output()
        .expect("date(1)");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("a time")
}

#[test]
fn a_killed_watchdog_is_said_even_without_verbose() {
    let store = Store::file();
    let scratch = Scratch::new();
    let mut holder = crate::core::hold(&store, &scratch, "guarded", &[]);
    signal(watchdog_of(holder.id()), nix::sys::signal::Signal::SIGKILL);
    wait_for_stderr(&mut holder, "the watchdog (lr-watchdog, pid");
    std::fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(
        wait(&mut holder).code(),
        Some(0),
        "the command's status stands"
    );
}

/// A holder whose lease was broken, and whose slot another run took, finds
/// the lease gone when it releases: 76, and a line that names its command's
/// own status, even though the command ended before a renewal could notice.
pub fn a_lease_found_lost_at_release_gives_76(store: &Store) {
    if store.kind == "file" {
        return; // No lease to break: the kernel holds the lock.
    }
    let scratch = Scratch::new();
    let holder = crate::core::hold(store, &scratch, "broken", &["--ttl", "30"]);
    assert_status(&run(store.release().args(["broken", "--force"])), 0);
    assert_status(
        &run(store.lockrun().args(["--name", "broken", "-n", "true"])),
        0,
    );
    std::fs::write(scratch.path("release"), "").unwrap();
    let output = finish(holder);
    assert_status(&output, 76);
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("found lost") && err.contains("the command exited with status 0"),
        "{err}"
    );
}

/// A lockrun inside a command that lockrun runs, asking for the lock its own
/// ancestor holds, fails at once instead of waiting out its `--timeout`.
pub fn a_run_that_would_wait_for_its_own_ancestor_fails_at_once(store: &Store) {
    let inner = store.argv(&["--name", "nest", "-w", "60", "true"]);
    let started = std::time::Instant::now();
    let output = run(store
        .lockrun()
        .args([
            "--name",
            "nest",
            "--",
            "sh",
            "-c",
            "\"$@\"; echo \"inner $?\"",
            "sh",
        ])
        .args(&inner));
    assert_status(&output, 0);
    assert_eq!(stdout(&output), "inner 75\n");
    let err = stderr(&output);
    assert!(err.contains("would wait for itself"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // A nested run for another name is not held up.
    let other = store.argv(&["--name", "other", "-n", "true"]);
    let output = run(store.lockrun().args(["--name", "nest", "--"]).args(&other));
    assert_status(&output, 0);
}

#[test]
fn hints_for_what_users_bring_from_flock_and_habit() {
    let store = Store::file();
    let line = usage_line(&run(lockrun().args(["-b", "sqlite", "status"])));
    assert!(
        line.contains("a subcommand comes first: lockrun status -b sqlite"),
        "{line}"
    );
    let line = usage_line(&run(store
        .lockrun()
        .args(["--name", "x", "-w", "-1", "true"])));
    assert!(
        line.contains("-w inf waits forever") && !line.contains("-- -1"),
        "{line}"
    );
    // Each option that takes no negative number says what it takes instead.
    for (option, says) in [
        ("-E", "-E takes an exit status from 0 to 255"),
        ("--max-runtime", "0, or none, means no limit"),
        ("-p", "-p takes a number of slots from 1 to 1024"),
    ] {
        let line = usage_line(&run(store
            .lockrun()
            .args(["--name", "x", option, "-1", "true"])));
        assert!(
            line.contains(says) && !line.contains("-w inf"),
            "{option}: {line}"
        );
    }
    let line = usage_line(&run(store
        .lockrun()
        .args(["--name", "x", "--events", "true"])));
    assert!(
        line.contains("--log-format json") && !line.contains("-- --events"),
        "{line}"
    );
    for (flag, says) in [
        ("-u", "releases the lock when the command exits"),
        ("-o", "never lets the command inherit"),
        ("-F", "always runs the command as its child"),
    ] {
        let line = usage_line(&run(store.lockrun().args([flag, "--name", "x", "true"])));
        assert!(
            line.contains(&format!("{flag} is flock(1)'s")) && line.contains(says),
            "{line}"
        );
    }
}
