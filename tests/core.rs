//! Behaviour every backend must show (README: "Exit status"; docs/guide.md:
//! "What the command gets"; the backends' pages), written once and run against each backend
//! through `backend_tests!`.

use std::collections::HashSet;
use std::fs;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

/// Instantiates every shared test for one backend: `backend_tests!(file_backend, Store::file());`.
/// The store may be an `Option<Store>`: `None` (its server is missing) skips the tests.
#[macro_export]
macro_rules! backend_tests {
    ($module:ident, $store:expr) => {
        $crate::backend_tests!(@each $module, $store,
            core::exit_statuses,
            core::environment_and_fence,
            core::busy_with_no_wait_and_timeout,
            core::exclusion_one_slot,
            core::exclusion_three_slots,
            core::signal_reaches_command_once,
            core::sigkill_of_lockrun_kills_command_and_frees_slot,
            core::max_runtime_stops_the_tree,
            core::min_hold_keeps_the_slot,
            core::status_shows_the_holder,
            core::status_shows_the_program_not_its_arguments,
            core::names_never_reach_each_other,
            core::one_thread_while_waiting_and_running,
            core::another_parallelism_is_refused,
            clocks::a_wall_clock_step_lets_no_run_into_a_held_slot,
            clocks::a_wall_clock_step_lets_no_run_into_a_kept_slot,
            sessions::status_on_a_store_not_made_yet_says_nothing_is_held,
            sessions::a_lease_found_lost_at_release_gives_76,
            sessions::a_run_that_would_wait_for_its_own_ancestor_fails_at_once,
            line::first_come_first_served_with_one_slot,
            line::first_come_first_served_with_two_slots,
            line::a_freed_slot_goes_to_the_head_of_the_line_at_once,
            line::a_dead_waiter_at_the_head_is_skipped_at_once,
            line::a_waiter_stopped_and_continued_takes_the_freed_slot_at_once,
            line::a_waiter_behind_a_holder_on_this_host_keeps_its_place_past_its_ttl,
            line::a_writers_release_starts_every_waiting_reader_at_once,
            line::dead_readers_at_the_head_hold_nobody_up,
            line::dead_waiters_at_the_head_hold_nobody_up,
            modes::readers_overlap_while_a_writer_is_kept_out,
            modes::a_stream_of_readers_does_not_starve_a_writer,
            modes::several_names_in_any_order_never_deadlock,
            modes::several_names_are_all_or_nothing,
            modes::the_first_name_is_kept_while_waiting_for_the_second,
            modes::release_force_breaks_one_sharer,
            modes::losing_any_names_lease_stops_the_command
        );
    };
    (@each $module:ident, $store:expr, $($group:ident :: $test:ident),+) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    use $crate::support::{MaybeStore, Store};
                    if let Some(store) = MaybeStore::into_store($store) {
                        $crate::$group::$test(&store);
                    }
                }
            )+
        }
    };
}

// Every backend, once: a new backend adds its line here.
backend_tests!(file_backend, Store::file());
backend_tests!(sqlite_backend, Store::sqlite());
backend_tests!(redis_backend, Store::redis());
backend_tests!(redis_cluster_backend, Store::redis_cluster());
#[cfg(feature = "postgres")]
backend_tests!(postgres_backend, Store::postgres());
#[cfg(feature = "etcd")]
backend_tests!(etcd_backend, Store::etcd());
#[cfg(feature = "s3")]
backend_tests!(s3_backend, Store::s3());

/// A command that holds the lock until `release` appears, after writing `ready`.
pub fn hold(store: &Store, scratch: &Scratch, name: &str, extra: &[&str]) -> Running {
    hold_after(store, scratch, name, extra, "")
}

/// Like `hold`, running the shell code `first` (ending in `;` and a space) before it says it is ready.
pub fn hold_after(
    store: &Store,
    scratch: &Scratch,
    name: &str,
    extra: &[&str],
    first: &str,
) -> Running {
    start_holding(store.lockrun(), scratch, name, extra, first)
}

/// Like `hold`, in a process group of its own (out of reach of signals to the
/// test's group), writing `$LOCKRUN_FENCE` to `fence` and, when SIGTERM stops
/// it, the time (ns since the epoch) to `stopped` before it exits 1.
pub fn hold_recording(store: &Store, scratch: &Scratch, name: &str, extra: &[&str]) -> Running {
    let first = format!(
        // Written whole, then named, so that a reader that sees the file sees its time.
        "trap 'date +%s%N > {stopped}.tmp && mv {stopped}.tmp {stopped}; exit 1' TERM; \
         echo $LOCKRUN_FENCE > {fence}; ",
        stopped = scratch.path("stopped").display(),
        fence = scratch.path("fence").display(),
    );
    let mut command = store.lockrun();
    command.process_group(0);
    start_holding(command, scratch, name, extra, &first)
}

/// Like `hold`, run by `command` (lockrun, or a program that runs it, with the store's flags).
pub fn start_holding(
    mut command: std::process::Command,
    scratch: &Scratch,
    name: &str,
    extra: &[&str],
    first: &str,
) -> Running {
    let script = format!(
        "{first}echo $$ > '{ready}.tmp' && mv '{ready}.tmp' '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
        ready = scratch.path("ready").display(),
        release = scratch.path("release").display()
    );
    let child = command
        .args(["--name", name])
        .args(extra)
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .start();
    wait_for_file(&scratch.path("ready"));
    child
}

/// `name` is held by a crashed holder on host "elsewhere" whose lease ends in a
/// moment: status shows it, and a waiter whose retries are 30 s apart takes the
/// slot within seconds, woken by the lease's end, not by a retry.
pub fn takes_the_slot_of_a_lapsing_holder_elsewhere(store: &Store, name: &str) {
    let output = run(store.status().args([name, "--json"]));
    assert!(stdout(&output).contains("elsewhere"), "{}", stdout(&output));
    let started = std::time::Instant::now();
    let args = ["--name", name, "-w", "20", "--initial-delay", "30", "true"];
    assert_status(&run(store.lockrun().args(args)), 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "took the slot when the lease expired, after {:?}",
        started.elapsed()
    );
}

/// The server is lost (`lose`) while a holder holds with `--ttl ttl`: lockrun
/// tells its command to stop and exits 76 within `within` of the loss.
pub fn losing_the_server_stops_the_holder(
    store: &Store,
    ttl: &str,
    within: std::time::Duration,
    lose: impl FnOnce(),
) {
    let scratch = Scratch::new();
    let mut holder = hold_recording(store, &scratch, "lost", &["--ttl", ttl]);
    lose();
    let since = std::time::Instant::now();
    let status = wait(&mut holder);
    let took = since.elapsed();
    assert_eq!(status.code(), Some(76), "{}", stderr(&finish(holder)));
    assert!(
        scratch.path("stopped").exists(),
        "the command was told to stop"
    );
    assert!(took < within, "stopped after {took:?}");
}

/// `count` waiters for `name` (with `extra` flags), each joining once the one
/// before is in line, each a command that appends its place and the time it
/// started (ns) to `served` in `scratch` (read back with [`served`]).
pub fn line_up(
    store: &Store,
    scratch: &Scratch,
    name: &str,
    count: usize,
    extra: &[&str],
) -> Vec<Running> {
    let log = scratch.path("served");
    (0..count)
        .map(|place| {
            let events = scratch.path(&format!("events.{place}"));
            // Then the waiting lockrun's wake-ups and CPU time so far (see [`waited`]).
            let script = format!(
                "echo {place} $(date +%s%N) >> '{}'; cat /proc/$PPID/status /proc/$PPID/schedstat > '{}'",
                log.display(),
                scratch.path(&format!("work.{place}")).display()
            );
            let waiter = store
                .lockrun()
                .args(["--name", name, "--log-format", "json"])
                .args(extra)
                .args(["-c", &script])
                .stderr(fs::File::create(&events).unwrap())
                .start();
            wait_until("a waiter to join the line", || {
                fs::read_to_string(&events).is_ok_and(|text| text.contains(r#""waiting""#))
                    && places_made(store, name) > place
            });
            waiter
        })
        .collect()
}

/// How many waiters hold a place in the file backend's line for `name` (its
/// `.wait` files): a run that says it waits stands there only after its first 100 ms
/// in the kernel (docs/guide.md: "The waiting line"). Elsewhere a waiting
/// event means a place: `usize::MAX`.
fn places_made(store: &Store, name: &str) -> usize {
    if store.kind != "file" {
        return usize::MAX;
    }
    fs::read_dir(store.dir())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|file| {
            file.starts_with(&format!("{name}.")) && file.rsplit('.').next() == Some("wait")
        })
        .count()
}

/// The places of [`line_up`]'s waiters in the order they were served, each with when it started.
pub fn served(scratch: &Scratch) -> Vec<(usize, i128)> {
    fs::read_to_string(scratch.path("served"))
        .unwrap()
        .lines()
        .map(|line| {
            let (place, at) = line.split_once(' ').unwrap();
            (place.parse().unwrap(), at.parse().unwrap())
        })
        .collect()
}

/// A process's wake-ups (voluntary context switches) and CPU time so far, from
/// its `/proc/PID/status` and `/proc/PID/schedstat` as `text` has them, in that order.
pub fn counters(text: &str) -> Option<(u64, Duration)> {
    let wakeups = text.lines().find_map(|line| {
        line.strip_prefix("voluntary_ctxt_switches:")?
            .trim()
            .parse()
            .ok()
    })?;
    let cpu_ns = text
        .lines()
        .last()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((wakeups, Duration::from_nanos(cpu_ns)))
}

/// The same for the process `pid`, now.
pub fn counters_of(pid: u32) -> Option<(u64, Duration)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let schedstat = fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    counters(&format!("{status}{schedstat}"))
}

/// The wake-ups and CPU time each of [`line_up`]'s waiters spent
/// from `before` (their counters then) to its command's start.
pub fn waited(scratch: &Scratch, before: &[Option<(u64, Duration)>]) -> Vec<(u64, Duration)> {
    before
        .iter()
        .enumerate()
        .filter_map(|(place, before)| {
            let (wakeups, cpu) = (*before)?;
            let text = fs::read_to_string(scratch.path(&format!("work.{place}"))).ok()?;
            let (at_start, cpu_at_start) = counters(&text)?;
            Some((
                at_start.saturating_sub(wakeups),
                cpu_at_start.saturating_sub(cpu),
            ))
        })
        .collect()
}

/// Runs `true` under `name`, retrying quickly for up to 10 s: the slot must come free by then.
fn take_soon(store: &Store, name: &str) -> std::process::Output {
    let args = [
        "--name",
        name,
        "-w",
        "10",
        "--initial-delay",
        "0.05",
        "true",
    ];
    run(store.lockrun().args(args))
}

pub fn exit_statuses(store: &Store) {
    let code = |args: &[&str]| run(store.lockrun().args(args)).status.code();
    assert_eq!(
        code(&["--name", "st", "--", "sh", "-c", "exit 3"]),
        Some(3),
        "the command's own"
    );
    assert_eq!(
        code(&["--name", "st", "-c", "kill -TERM $$"]),
        Some(128 + 15),
        "128 + signal"
    );
    assert_eq!(
        code(&["--name", "st", "--", "/nonexistent/command"]),
        Some(127),
        "not found"
    );
    assert_eq!(
        code(&["--name", "st", "--", "/dev/null"]),
        Some(126),
        "cannot execute"
    );
    assert_eq!(code(&["--name", "st", "-c", "exit 0"]), Some(0));
    assert_eq!(
        code(&["--name", "st", "--max-runtime", "0.2", "--", "sleep", "30"]),
        Some(124)
    );
    for bad in [
        &["true"][..],
        &["--name", "", "true"],
        &["--name", "st", "--timeout", "soon", "true"],
        &["--name", "st", "-p", "0", "true"],
        &["--name", "st", "-p", "1025", "true"],
        &["--name", "st", "--backoff-multiplier", "0.5", "true"],
        &["--name", "st"],
        &["--name", "st", "-E", "256", "true"],
        &["--name", "st", "--bogus", "true"],
    ] {
        let output = run(store.lockrun().args(bad));
        assert_status(&output, 64);
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "one line for {bad:?}: {err}");
    }
}

pub fn environment_and_fence(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("env");
    let script = format!(
        "echo \"$LOCKRUN_NAME $LOCKRUN_BACKEND $LOCKRUN_SLOT $LOCKRUN_PARALLELISM $LOCKRUN_FENCE $LOCKRUN_TOKEN\" >> '{}'",
        log.display()
    );
    for _ in 0..3 {
        assert_status(
            &run(store
                .lockrun()
                .args(["--name", "env test", "-p", "2", "-c", &script])),
            0,
        );
    }
    let lines = scratch.lines("env");
    assert_eq!(lines.len(), 3);
    let mut fences = Vec::new();
    let mut tokens = HashSet::new();
    for line in &lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[..2], ["env", "test"], "{line}");
        assert_eq!(fields[2], store.kind);
        assert!(
            fields[3] == "0" || fields[3] == "1",
            "slot in range: {line}"
        );
        assert_eq!(fields[4], "2");
        fences.push(fields[5].parse::<u64>().expect("numeric fence"));
        assert!(
            fields[6].len() >= 16 && tokens.insert(fields[6].to_owned()),
            "unique token: {line}"
        );
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase: {fences:?}"
    );
    // argv reaches the command exactly as given, and stdout is the command's alone.
    let output = run(store.lockrun().args([
        "--name", "argv", "--", "printf", "[%s]", "a b", "*", "$HOME", "",
    ]));
    assert_eq!(stdout(&output), "[a b][*][$HOME][]");
}

/// lockrun is one thread, waiting in line and running its command with its
/// lease renewed: the signal mask, the watchdog's fork and the spawn depend on
/// it (ARCHITECTURE.md), so a dependency that starts a thread fails here.
pub fn one_thread_while_waiting_and_running(store: &Store) {
    let threads = |pid: u32| fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    let scratch = Scratch::new();
    let holder = hold(store, &scratch, "threads", &[]);
    let script = format!(
        "sleep 1; ls /proc/$PPID/task | wc -l > '{}'",
        scratch.path("threads").display()
    );
    let mut waiter = store
        .lockrun()
        .args(["--name", "threads", "--ttl", "0.3", "-v", "-c", &script])
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting for threads");
    assert_eq!(threads(waiter.id()), 1, "while waiting");
    fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
    let output = finish(waiter);
    assert_status(&output, 0);
    // Counted after a few renewals (every third of the lease) have gone out, on lease backends.
    assert_eq!(scratch.lines("threads"), ["1"], "while running");
}

pub fn busy_with_no_wait_and_timeout(store: &Store) {
    let scratch = Scratch::new();
    let mut holder = hold(store, &scratch, "busy", &[]);
    let output = run(store.lockrun().args(["--name", "busy", "-n", "true"]));
    assert_status(&output, 75);
    let err = stderr(&output);
    assert!(err.contains("busy") && err.lines().count() == 1, "{err}");
    assert_status(
        &run(store
            .lockrun()
            .args(["--name", "busy", "-n", "-E", "9", "true"])),
        9,
    );
    let output = run(store.lockrun().args([
        "--name",
        "busy",
        "-w",
        "0.3",
        "--initial-delay",
        "0.05",
        "true",
    ]));
    assert_status(&output, 75);
    assert!(
        stderr(&output).contains("gave up after"),
        "{}",
        stderr(&output)
    );
    assert_status(
        &run(store.lockrun().args(["--name", "busy", "-n", "-q", "true"])),
        75,
    );
    assert!(
        run(store.lockrun().args(["--name", "busy", "-n", "-q", "true"]))
            .stderr
            .is_empty(),
        "-q is silent"
    );
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_status(
        &run(store.lockrun().args(["--name", "busy", "-n", "true"])),
        0,
    );
}

pub fn exclusion_one_slot(store: &Store) {
    exclusion(store, 1);
}

/// A name's slot count is part of the lock: a run whose `-p` differs from
/// that of the name's holders or waiters exits 64 naming both numbers, at
/// once, without running its command; once the name is free, any `-p` works.
pub fn another_parallelism_is_refused(store: &Store) {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let refused = |parallelism: &str, wait: &[&str], theirs: &str| {
        let touch = format!("touch '{}'", ran.display());
        let output = run(store
            .lockrun()
            .args(["--name", "counted", "-p", parallelism])
            .args(wait)
            .args(["-c", &touch]));
        assert_status(&output, 64);
        let err = stderr(&output);
        assert!(
            err.contains(&format!("with -p {theirs};"))
                && err.contains(&format!("asked for -p {parallelism}"))
                && err.lines().count() == 1,
            "{err}"
        );
        assert!(!ran.exists(), "the refused run's command ran");
    };
    let holds = |extra: &[&str]| {
        let scratch = Scratch::new();
        let holder = hold(store, &scratch, "counted", extra);
        (scratch, holder)
    };
    let release = |(scratch, mut holder): (Scratch, Running)| {
        fs::write(scratch.path("release"), "").unwrap();
        assert_eq!(wait(&mut holder).code(), Some(0));
    };
    // Beside a -p 1 holder, a -p 3 run takes none of the two slots it would see free.
    let one = holds(&[]);
    refused("3", &["-n"], "1");
    refused("3", &["-w", "60"], "1");
    release(one);
    // A -p 1 run takes no slot 0 left free by a -p 3 holder while another holds slot 1.
    let first = holds(&["-p", "3"]);
    let second = holds(&["-p", "3"]);
    release(first);
    refused("1", &["-n"], "3");
    // Nor does it wait behind -p 3 holders and waiters.
    let third = holds(&["-p", "3"]);
    let fourth = holds(&["-p", "3"]);
    let waiter = line_up(store, &scratch, "counted", 1, &["-p", "3"]);
    refused("1", &["-w", "60"], "3");
    for holder in [second, third, fourth] {
        release(holder);
    }
    for waiter in waiter {
        assert_status(&finish(waiter), 0);
    }
    // Free again: any -p.
    for parallelism in ["2", "1"] {
        let output =
            run(store
                .lockrun()
                .args(["--name", "counted", "-n", "-p", parallelism, "true"]));
        assert_status(&output, 0);
    }
}

pub fn exclusion_three_slots(store: &Store) {
    exclusion(store, 3);
}

/// A wait for a contended name that looks again quickly (its backoff steps 10 to 50 ms).
pub const QUICK_WAIT: [&str; 6] = ["-w", "60", "--initial-delay", "0.01", "--max-delay", "0.05"];

/// Runs each of `commands` `runs` times over, all of them at once, each in a
/// thread of its own: every run must exit 0.
pub fn every_run_exits_zero(commands: impl Iterator<Item = std::process::Command>, runs: usize) {
    let workers: Vec<_> = commands
        .map(|mut command| {
            thread::spawn(move || {
                (0..runs)
                    .map(|_| run(&mut command).status.code())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for worker in workers {
        let codes = worker.join().unwrap();
        assert!(codes.iter().all(|code| *code == Some(0)), "{codes:?}");
    }
}

/// 8 processes x 12 runs: never more than N holders at once, never two in one slot.
fn exclusion(store: &Store, slots: u32) {
    let scratch = Scratch::new();
    fs::create_dir(scratch.path("holders")).unwrap();
    let script = r#"d=$1
mkdir "$d/slot-$LOCKRUN_SLOT" 2>/dev/null || echo "slot $LOCKRUN_SLOT held twice" >> "$d/violations"
touch "$d/holders/$$"
n=$(ls "$d/holders" | wc -l)
[ "$n" -le "$LOCKRUN_PARALLELISM" ] || echo "$n holders at once" >> "$d/violations"
echo "$LOCKRUN_FENCE" >> "$d/fences"
sleep 0.01
rm "$d/holders/$$"
rmdir "$d/slot-$LOCKRUN_SLOT""#;
    let commands = (0..8).map(|_| {
        let mut command = store.lockrun();
        command.args(["--name", "contended", "-p", &slots.to_string()]);
        command
            .args(QUICK_WAIT)
            .args(["--", "sh", "-c", script, "sh"])
            .arg(scratch.dir());
        command
    });
    every_run_exits_zero(commands, 12);
    assert_eq!(scratch.lines("violations"), Vec::<String>::new());
    let fences: HashSet<String> = scratch.lines("fences").into_iter().collect();
    assert_eq!(fences.len(), 96, "96 runs, each with its own fence");
}

pub fn signal_reaches_command_once(store: &Store) {
    for (signal, to_group) in [
        (Signal::SIGTERM, false),
        (Signal::SIGINT, true),
        (Signal::SIGHUP, false),
        (Signal::SIGUSR1, false),
    ] {
        let scratch = Scratch::new();
        let name = format!("{signal}");
        let script = format!(
            "trap 'echo got >> {log}; exit 7' {sig}; touch {ready}; while :; do sleep 0.02; done",
            log = scratch.path("log").display(),
            ready = scratch.path("ready").display(),
            sig = &name[3..],
        );
        let mut command = store.lockrun();
        command
            .args(["--name", &name, "-c", &script])
            .process_group(0);
        let mut lockrun = command.start();
        wait_for_file(&scratch.path("ready"));
        let pid = nix::unistd::Pid::from_raw(lockrun.id().cast_signed());
        if to_group {
            nix::sys::signal::killpg(pid, signal).unwrap();
        } else {
            nix::sys::signal::kill(pid, signal).unwrap();
        }
        assert_eq!(
            wait(&mut lockrun).code(),
            Some(7),
            "{name}: the command's status"
        );
        assert_eq!(
            scratch.lines("log"),
            ["got"],
            "{name} reached the command exactly once"
        );
    }
}

pub fn sigkill_of_lockrun_kills_command_and_frees_slot(store: &Store) {
    let scratch = Scratch::new();
    let background = format!("sleep 300 & echo $! > '{}'; ", scratch.path("bg").display());
    let mut holder = hold_after(store, &scratch, "killed", &[], &background);
    let command_pid = read_pid(&scratch.path("ready"));
    let background_pid = read_pid(&scratch.path("bg"));
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_until(
        "the command and its background child to die with lockrun",
        || !process_exists(command_pid) && !process_exists(background_pid),
    );
    assert_status(&take_soon(store, "killed"), 0);
}

pub fn max_runtime_stops_the_tree(store: &Store) {
    let scratch = Scratch::new();
    let script = format!(
        "trap '' TERM; sleep 300 & echo $! > {gc}; sleep 300",
        gc = scratch.path("grandchild").display()
    );
    let output = run(store.lockrun().args([
        "--name",
        "runtime",
        "--max-runtime",
        "0.3",
        "--kill-grace",
        "0.3",
        "-c",
        &script,
    ]));
    assert_status(&output, 124);
    assert!(
        stderr(&output).contains("--max-runtime"),
        "{}",
        stderr(&output)
    );
    let grandchild = read_pid(&scratch.path("grandchild"));
    wait_until("the background grandchild to be stopped", || {
        !process_exists(grandchild)
    });

    // A background process left behind by a command that exited is stopped too: it would run without the lock.
    let script = format!(
        "sleep 300 & echo $! > {gc}",
        gc = scratch.path("left").display()
    );
    assert_status(
        &run(store.lockrun().args(["--name", "runtime", "-c", &script])),
        0,
    );
    let left = read_pid(&scratch.path("left"));
    assert!(
        !process_exists(left),
        "a leftover is gone by the time lockrun exits"
    );
}

pub fn min_hold_keeps_the_slot(store: &Store) {
    let started = std::time::Instant::now();
    // lockrun exits with its command: no process stays behind to keep the slot.
    let output = run(store
        .lockrun()
        .args(["--name", "minhold", "--min-hold", "3", "--", "true"]));
    assert_status(&output, 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "exited before the minimum hold was over"
    );
    assert_status(
        &run(store.lockrun().args(["--name", "minhold", "-n", "true"])),
        75,
    );
    let shown = run(store.status().args(["minhold", "--json"]));
    assert!(stdout(&shown).contains("\"holding\""), "{}", stdout(&shown));
    assert_status(&take_soon(store, "minhold"), 0);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(3),
        "the slot stayed taken"
    );
}

pub fn status_shows_the_holder(store: &Store) {
    let scratch = Scratch::new();
    let mut holder = hold(store, &scratch, "shown", &[]);
    let output = run(store.status().args(["shown", "--json"]));
    assert_status(&output, 0);
    let holders: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("status --json is JSON");
    let holders = holders.as_array().expect("an array");
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["name"], "shown");
    assert_eq!(holders[0]["backend"], store.kind);
    assert_eq!(holders[0]["pid"], holder.id());
    fs::write(scratch.path("release"), "").unwrap();
    wait(&mut holder);
    let output = run(store.status().args(["shown", "--json"]));
    assert_eq!(
        stdout(&output).trim(),
        "[]",
        "a released lock has no holder"
    );
}

/// The store records the program's name, the user and `--note`, not the
/// command's arguments (a password?), unless `--record-command` asks for them.
pub fn status_shows_the_program_not_its_arguments(store: &Store) {
    let (quiet, recorded) = (Scratch::new(), Scratch::new());
    let holding = |scratch: &Scratch, name: &str, extra: &[&str]| {
        let script = format!(
            "touch '{ready}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
            ready = scratch.path("ready").display(),
            release = scratch.path("release").display()
        );
        let child = store
            .lockrun()
            .args(["--name", name])
            .args(extra)
            .args(["sh", "-c", &script, "x", "--password=hunter2"])
            .start();
        wait_for_file(&scratch.path("ready"));
        child
    };
    let mut holders = [
        holding(&quiet, "quiet", &["--note", "nightly backup"]),
        holding(&recorded, "recorded", &["--record-command"]),
    ];
    let listed = |name: &str| {
        let output = run(store.status().args([name, "--json"]));
        assert_status(&output, 0);
        let entries: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("status --json is JSON");
        entries[0].clone()
    };
    let quiet_entry = listed("quiet");
    assert!(
        !quiet_entry.to_string().contains("hunter2"),
        "{quiet_entry}"
    );
    assert_eq!(quiet_entry["command"], "sh", "{quiet_entry}");
    assert_eq!(quiet_entry["note"], "nightly backup", "{quiet_entry}");
    assert!(
        quiet_entry["user"]
            .as_str()
            .is_some_and(|user| !user.is_empty()),
        "{quiet_entry}"
    );
    let table = stdout(&run(store.status().arg("quiet")));
    assert!(table.contains("nightly backup"), "{table}");
    assert!(!table.contains("hunter2"), "{table}");
    let recorded_entry = listed("recorded");
    assert!(
        recorded_entry["command"]
            .as_str()
            .is_some_and(|command| command.starts_with("sh -c ")
                && command.ends_with(" x --password=hunter2")),
        "{recorded_entry}"
    );
    assert_eq!(recorded_entry["note"], serde_json::Value::Null);
    for (scratch, holder) in [&quiet, &recorded].into_iter().zip(&mut holders) {
        fs::write(scratch.path("release"), "").unwrap();
        wait(holder);
    }
}

/// Once lockrun has started, no user sees `password` (given in the store's
/// URL) in its arguments: neither `ps` nor /proc/PID/cmdline shows it.
pub fn no_password_stays_in_ps(store: &Store, password: &str) {
    assert!(
        store
            .args()
            .iter()
            .any(|arg| arg.to_string_lossy().contains(password)),
        "the store's URL has the password"
    );
    let scratch = Scratch::new();
    let holder = hold(store, &scratch, "hidden", &[]);
    let cmdline = fs::read(format!("/proc/{}/cmdline", holder.id())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(!cmdline.contains(password), "{cmdline}");
    assert!(
        cmdline.contains("@127.0.0.1:"),
        "the URL is there: {cmdline}"
    );
    let ps = std::process::Command::new("ps")
        .args(["-ww", "-o", "args=", "-p", &holder.id().to_string()])
        .output()
        .expect("run ps");
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(ps.contains("hidden") && !ps.contains(password), "{ps}");
    fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
}

/// `x}:slot:0` and `x*` look like the keys and patterns of `x` to a store that
/// builds them from names as given: `status x` and `release x --force` must not
/// see or touch them.
pub fn names_never_reach_each_other(store: &Store) {
    let (first, second) = (Scratch::new(), Scratch::new());
    let mut holders = [
        hold(store, &first, "x}:slot:0", &[]),
        hold(store, &second, "x*", &[]),
    ];
    let mut waiter = store
        .lockrun()
        .args(["--name", "x*", "-w", "60", "true"])
        .start();
    let listed = |name: &str| -> Vec<serde_json::Value> {
        let output = run(store.status().args([name, "--json"]));
        assert_status(&output, 0);
        serde_json::from_slice(&output.stdout).expect("status --json is JSON")
    };
    wait_until("the waiter of x* in line", || listed("x*").len() == 2);

    assert_eq!(listed("x"), Vec::<serde_json::Value>::new());
    let not_held = stdout(&run(store.status().arg("x")));
    assert!(not_held.starts_with("x is not held in "), "{not_held}");
    for slot in [&[][..], &["--slot", "0"]] {
        let output = run(store.release().args(["x", "--force"]).args(slot));
        let err = stderr(&output);
        assert!(
            !err.contains("pid") && !stdout(&output).contains("released"),
            "{err}"
        );
    }
    let names: Vec<String> = {
        let output = run(store.status().arg("--json"));
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
        entries
            .iter()
            .map(|e| format!("{} {}", e["name"].as_str().unwrap(), e["state"]))
            .collect()
    };
    assert_eq!(
        names,
        [
            r#"x* "holding""#,
            r#"x* "waiting""#,
            r#"x}:slot:0 "holding""#
        ],
        "both holders keep their slots"
    );
    for (scratch, holder) in [&first, &second].into_iter().zip(&mut holders) {
        fs::write(scratch.path("release"), "").unwrap();
        assert_eq!(wait(holder).code(), Some(0));
    }
    assert_eq!(wait(&mut waiter).code(), Some(0));
}
