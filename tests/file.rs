//! The file backend's own guarantees (docs/backends/file.md: "File backend"): the directory,
//! names, symlinks, kernel waits.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::core::hold;
use crate::support::*;

#[test]
fn names_never_leave_the_directory() {
    let scratch = Scratch::new();
    let dir = scratch.path("locks");
    for name in [
        "../escape",
        "a/b",
        "/etc/passwd",
        "..",
        ".",
        ".hidden",
        "x/../../y",
    ] {
        let output = run_in(&dir, &["--name", name, "true"]);
        assert_status(&output, 0);
    }
    let outside: Vec<_> = fs::read_dir(scratch.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        outside,
        ["locks"],
        "nothing was created beside the lock directory"
    );
    for entry in fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_file(), "{:?}", entry.path());
        assert!(
            !entry.file_name().to_string_lossy().starts_with('.'),
            "{:?}",
            entry.path()
        );
    }
}

#[test]
fn a_planted_symlink_is_refused_not_followed() {
    let scratch = Scratch::new();
    let dir = scratch.path("locks");
    fs::create_dir(&dir).unwrap();
    let target = scratch.path("precious");
    fs::write(&target, "keep me").unwrap();
    symlink(&target, dir.join("x.0.lock")).unwrap();
    let output = run_in(&dir, &["--name", "x", "true"]);
    assert_status(&output, 69);
    assert!(
        stderr(&output).contains("symbolic link"),
        "{}",
        stderr(&output)
    );
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep me");
    // A dangling link would be created through: refused too.
    symlink(scratch.path("created-through-link"), dir.join("y.0.lock")).unwrap();
    assert_status(&run_in(&dir, &["--name", "y", "true"]), 69);
    assert!(!scratch.path("created-through-link").exists());
}

#[test]
fn a_hard_link_is_refused() {
    let scratch = Scratch::new();
    let dir = scratch.path("locks");
    fs::create_dir(&dir).unwrap();
    let target = scratch.path("precious");
    fs::write(&target, "keep me").unwrap();
    fs::hard_link(&target, dir.join("x.0.lock")).unwrap();
    assert_status(&run_in(&dir, &["--name", "x", "true"]), 69);
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep me");
}

#[test]
fn a_directory_that_is_a_file_is_named_as_such() {
    let scratch = Scratch::new();
    let file = scratch.path("not-a-dir");
    fs::write(&file, "").unwrap();
    for output in [
        run_in(&file, &["--name", "x", "true"]),
        run(lockrun().arg("status").arg("--dir").arg(&file)),
    ] {
        assert_status(&output, 69);
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not-a-dir is not a directory"), "{err}");
    }
}

#[test]
fn the_default_directory_is_private_and_must_be_ours() {
    let scratch = Scratch::new();
    let (run_lock, var_tmp) = (scratch.path("run-lock"), scratch.path("var-tmp"));
    for dir in [&run_lock, &var_tmp] {
        fs::create_dir(dir).unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let Some(mut lockrun) = with_default_dirs_in(&run_lock, &var_tmp) else {
        return;
    };
    let output = run(lockrun
        .arg(env!("CARGO_BIN_EXE_lockrun"))
        .args(["--name", "x", "true"]));
    assert_status(&output, 0);
    let uid = nix::unistd::geteuid();
    let mine = run_lock.join(format!("lockrun-{uid}"));
    let meta = fs::symlink_metadata(&mine).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert!(mine.join("x.0.lock").exists());

    // A symlink where the directory should be is not used: lockrun moves on to
    // the next default, in /var/tmp.
    fs::remove_dir_all(&mine).unwrap();
    let elsewhere = scratch.path("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    symlink(&elsewhere, &mine).unwrap();
    let mut lockrun = with_default_dirs_in(&run_lock, &var_tmp).expect("allowed above");
    let output = run(lockrun
        .arg(env!("CARGO_BIN_EXE_lockrun"))
        .args(["--name", "y", "true"]));
    assert_status(&output, 0);
    assert_eq!(
        fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing written through the link"
    );
    assert!(var_tmp.join(format!("lockrun-{uid}/y.0.lock")).exists());
}

#[test]
fn a_single_slot_waiter_wakes_when_the_holder_exits() {
    let store = Store::file();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "handoff", &[]);
    let marker = scratch.path("second");
    // With a 30 s first retry delay, only a kernel wait can start the waiter promptly.
    let mut waiter = store
        .lockrun()
        .args([
            "--name",
            "handoff",
            "-v",
            "-w",
            "60",
            "--initial-delay",
            "30",
        ])
        .arg("--")
        .arg("touch")
        .arg(&marker)
        .stderr(Stdio::piped())
        .start();
    wait_for_stderr(&mut waiter, "waiting for handoff");
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    let released = Instant::now();
    assert_eq!(wait(&mut waiter).code(), Some(0));
    assert!(marker.exists());
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woke without waiting for a retry"
    );
}

/// A contended exclusive run first waits in the kernel on the slot's lock, as
/// flock(1) does: it takes its place in line, where `status` shows it, only
/// once it has waited 100 ms (docs/guide.md: "The waiting line").
#[test]
fn a_contended_run_waits_in_the_kernel_before_it_takes_its_place_in_line() {
    let store = Store::file();
    let scratch = Scratch::new();
    let holder = hold(&store, &scratch, "unseen", &[]);
    let started = Instant::now();
    let mut waiter = store
        .lockrun()
        .args([
            "--name",
            "unseen",
            "-w",
            "60",
            "--initial-delay",
            "30",
            "true",
        ])
        .start();
    let pid = waiter.id();
    wait_until("status to show the waiter in line", || {
        waiting_pids(&store, "unseen") == [u64::from(pid)]
    });
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "in line after {:?}",
        started.elapsed()
    );
    let_go(&scratch, holder);
    assert_eq!(wait(&mut waiter).code(), Some(0));
    assert_eq!(places(&store), 0, "its place went with it");
}

/// A run still waiting in the kernel, not yet in line, that gets the slot's
/// lock leaves it to a waiter in line: it counts as a newcomer until then.
/// The waiter ahead must stand in line within the run's first 100 ms; a
/// loaded host may not let this test place it in time, so it tries afresh.
#[test]
fn a_run_not_yet_in_line_does_not_pass_a_waiter_in_line() {
    for _ in 0..10 {
        let store = Store::file();
        let scratch = Scratch::new();
        let holder = hold(&store, &scratch, "unseen", &[]);
        let marker = scratch.path("ran");
        let mut waiter = store
            .lockrun()
            .args(["--name", "unseen", "-w", "60", "--initial-delay", "30"])
            .arg("--")
            .arg("touch")
            .arg(&marker)
            .start();
        let pid = waiter.id();
        let slot = store.dir().join("unseen.0.lock");
        let deadline = Instant::now() + Duration::from_secs(2);
        while !blocked_on(&slot).contains(&pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A waiter in line ahead of it, as one holds its files.
        let line = fs::File::create(store.dir().join("unseen.line")).unwrap();
        line.lock_shared().unwrap();
        let ahead = store.dir().join("unseen.00000000000000000001-1.wait");
        let place = fs::File::create(&ahead).unwrap();
        place.lock().unwrap();
        if places(&store) != 1 || !blocked_on(&slot).contains(&pid) {
            // It stood in line before the one planted ahead: not this test's case.
            drop((place, line));
            let_go(&scratch, holder);
            assert_eq!(wait(&mut waiter).code(), Some(0));
            continue;
        }
        let_go(&scratch, holder);
        wait_until("the waiter to stand in line", || {
            waiting_pids(&store, "unseen") == [u64::from(pid)]
        });
        assert!(!marker.exists(), "it passed the waiter ahead of it");
        drop((place, line));
        assert_eq!(wait(&mut waiter).code(), Some(0));
        assert!(marker.exists());
        return;
    }
    panic!("the waiter stood in line before one could be placed ahead of it, 10 times");
}

/// Newcomers that find a slot free each lock the line for the moment it takes
/// to see whether anyone waits. Another newcomer's moment must not pass for a
/// waiter: a herd let go at one instant with `--no-wait -p 3` once ran 2.
#[test]
fn a_newcomer_checking_the_line_turns_no_other_away_from_a_free_slot() {
    let (store, line) = herd_with_a_free_slot();
    line.lock().unwrap();
    assert_status(&newcomer_to_the_herd(&store), 0);
}

#[test]
fn a_newcomer_does_not_pass_a_waiter_that_is_joining_the_line() {
    let (store, line) = herd_with_a_free_slot();
    // Held as a waiter holds them between taking the line's lock and its place appearing.
    line.lock_shared().unwrap();
    let joining_path = store.dir().join("herd.00000000000000000001-1.joining");
    let joining = fs::File::create(&joining_path).unwrap();
    joining.lock().unwrap();
    assert_status(&newcomer_to_the_herd(&store), 75);
    // The file of a joiner that died is not locked: it turns nobody away.
    drop(joining);
    assert_status(&newcomer_to_the_herd(&store), 0);
    assert!(
        joining_path.exists(),
        "a newcomer leaves others' files alone"
    );
}

/// A file store where the name `herd` has been held once and is free, and its line's file, open.
fn herd_with_a_free_slot() -> (Store, fs::File) {
    let store = Store::file();
    assert_status(&run(store.lockrun().args(["--name", "herd", "true"])), 0);
    let line = fs::File::open(store.dir().join("herd.line")).unwrap();
    (store, line)
}

fn newcomer_to_the_herd(store: &Store) -> std::process::Output {
    run(store
        .lockrun()
        .args(["--name", "herd", "--no-wait", "true"]))
}

#[test]
fn leftover_metadata_without_a_live_lock_is_not_a_holder() {
    let store = Store::file();
    assert_status(&run(store.lockrun().args(["--name", "gone", "true"])), 0);
    let output = run(store.status().args(["gone", "--json"]));
    assert_eq!(stdout(&output).trim(), "[]");
}

#[test]
fn lock_files_are_kept_after_release() {
    let scratch = Scratch::new();
    let dir = scratch.path("locks");
    assert_status(&run_in(&dir, &["--name", "kept", "true"]), 0);
    let inode = fs::metadata(dir.join("kept.0.lock")).unwrap().ino();
    assert_status(&run_in(&dir, &["--name", "kept", "true"]), 0);
    assert_eq!(
        fs::metadata(dir.join("kept.0.lock")).unwrap().ino(),
        inode,
        "the same inode serves every holder"
    );
}

#[test]
fn a_corrupt_fence_file_is_an_error_not_a_reset() {
    let scratch = Scratch::new();
    let dir = scratch.path("locks");
    assert_status(&run_in(&dir, &["--name", "f", "true"]), 0);
    fs::write(dir.join("f.fence"), "not a number").unwrap();
    let output = run_in(&dir, &["--name", "f", "true"]);
    assert_status(&output, 69);
    assert!(stderr(&output).contains("fence"), "{}", stderr(&output));
}

#[test]
fn an_inherited_blocked_sigalrm_does_not_defeat_the_timeout() {
    let store = Store::file();
    let scratch = Scratch::new();
    let mut holder = hold(&store, &scratch, "alarm", &[]);
    // python3 blocks SIGALRM, then becomes lockrun: the single-slot wait is timed by SIGALRM.
    let argv = store.argv(&["--name", "alarm", "-w", "0.3", "true"]);
    let script = "import os, signal, sys\n\
                  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n\
                  os.execv(sys.argv[1], sys.argv[1:])";
    let output = run(std::process::Command::new("python3")
        .args(["-c", script])
        .args(&argv));
    assert_status(&output, 75);
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

/// A lockrun killed (SIGKILL) while its command runs, after it waited for
/// the slot (its watchdog was started then, before the slot was its): the
/// slot stays taken while anything of the command's still runs, though strace
/// holds the watchdog up for 3 s on its way to end it. An exclusive holder
/// and a sharer, whose lock on slot 0's file keeps exclusive runs out.
#[test]
fn killed_after_waiting_it_keeps_the_slot_while_its_command_runs() {
    if !strace_traces("watchdog held up") {
        return;
    }
    for mode in [&[][..], &["--shared"][..]] {
        let store = Store::file();
        let scratch = Scratch::new();
        let holder = hold(&store, &scratch, "k", &[]);
        let script = format!(
            "sleep 30 & echo $! > '{bg}'; wait",
            bg = scratch.path("bg").display()
        );
        let mut waiter = store
            .lockrun()
            .args(["--name", "k"])
            .args(mode)
            .args(["-c", &script])
            .start();
        wait_until("the waiter in line", || {
            !waiting_pids(&store, "k").is_empty()
        });
        fs::write(scratch.path("release"), "").unwrap();
        assert_status(&finish(holder), 0);
        let background = read_pid(&scratch.path("bg"));
        let watchdog = watchdog_of(waiter.id());
        let mut strace = Command::new("strace")
            .args(["-o", "/dev/null", "-e", "trace=recvmsg"])
            .args(["-e", "inject=recvmsg:delay_enter=3000000", "-p"])
            .arg(watchdog.to_string())
            .stderr(Stdio::piped())
            .start();
        wait_for_stderr(&mut strace, "attached");
        signal(waiter.id(), Signal::SIGKILL);
        wait(&mut waiter);
        let output = run(store.lockrun().args(["--name", "k", "-n", "true"]));
        assert!(
            process_exists(background),
            "{mode:?}: the command's child ended before the watchdog was let go"
        );
        assert_status(&output, 75);
        wait_until("the watchdog to end the command", || {
            !process_exists(background)
        });
        let output = run(store.lockrun().args(["--name", "k", "-w", "10", "true"]));
        assert_status(&output, 0);
        let _ = wait(&mut strace);
    }
}

/// Runs lockrun on the file backend in `dir` with `args`.
fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    run(lockrun().arg("--dir").arg(dir).args(args))
}

#[test]
fn status_neither_hangs_on_a_fifo_nor_reads_a_huge_lock_file_whole() {
    let store = Store::file();
    let fifo = |name: &str| {
        nix::unistd::mkfifo(&store.dir().join(name), nix::sys::stat::Mode::S_IRWXU).unwrap();
    };
    fifo("pipe.0.lock");
    fifo("pipe.00000000000000000001-1.wait");
    // A live holder's slot file of 3 GiB (sparse): status reads the record at its start.
    let huge = fs::File::create(store.dir().join("huge.0.lock")).unwrap();
    huge.set_len(3 << 30).unwrap();
    huge.lock().unwrap();
    // With 256 MiB of address space, reading the file whole fails.
    let status = |args: &[&str]| {
        let mut command = std::process::Command::new("sh");
        command
            .args(["-c", "ulimit -v 262144 && exec \"$@\"", "sh"])
            .arg(env!("CARGO_BIN_EXE_lockrun"))
            .arg("status")
            .args(store.args())
            .args(args);
        let started = Instant::now();
        let output = run(&mut without_lockrun_variables(command));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "status {args:?} took {:?}",
            started.elapsed()
        );
        assert_status(&output, 0);
        stdout(&output)
    };
    for args in [&[][..], &["--json"]] {
        let shown = status(args);
        assert!(!shown.contains("pipe"), "{shown}");
    }
    assert!(status(&["pipe"]).starts_with("pipe is not held in directory "));
    let shown = status(&["huge"]);
    assert!(
        shown.contains(&format!(
            "holding  exclusive  0     -     {}",
            std::process::id()
        )),
        "{shown}"
    );
    // Taking the lock opens the files the same way: the FIFO is refused at once.
    let output = run(store.lockrun().args(["--name", "pipe", "-n", "true"]));
    assert_status(&output, 69);
}

#[test]
fn status_and_release_on_a_missing_directory_say_so_and_create_nothing() {
    let scratch = Scratch::new();
    let typo = scratch.path("typo/locks");
    let output = run(lockrun().arg("status").arg("--dir").arg(&typo));
    assert_status(&output, 0);
    let out = stdout(&output);
    assert!(
        out.starts_with("no lock is held: there is no lock directory"),
        "{out}"
    );
    let output = run(lockrun()
        .args(["release", "x", "--force", "--dir"])
        .arg(&typo));
    assert_status(&output, 69);
    let err = stderr(&output);
    assert!(err.contains("there is no lock directory"), "{err}");
    assert!(!scratch.path("typo").exists(), "no directory made for it");

    // Nor is a default directory made.
    let (run_lock, var_tmp) = (scratch.path("run-lock"), scratch.path("var-tmp"));
    for dir in [&run_lock, &var_tmp] {
        fs::create_dir(dir).unwrap();
    }
    for (args, code) in [(&["status"][..], 0), (&["release", "x", "--force"], 69)] {
        let Some(mut lockrun) = with_default_dirs_in(&run_lock, &var_tmp) else {
            return;
        };
        let output = run(lockrun.arg(env!("CARGO_BIN_EXE_lockrun")).args(args));
        assert_status(&output, code);
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert!(
            said.contains("there is no lock directory /run/lock/lockrun-"),
            "{said}"
        );
        for dir in [&run_lock, &var_tmp] {
            assert_eq!(
                fs::read_dir(dir).unwrap().count(),
                0,
                "{args:?}: nothing made"
            );
        }
    }
}

/// A reader on `name` that runs once every reader of `together` has
/// started (the number of files there reaches `group`), so that the readers
/// of a group must all hold at once; its retries are 30 s apart, so only
/// the kernel's wake-ups start it in time. Returned once it stands last in line.
fn reader_in_a_group(
    store: &Store,
    name: &str,
    together: &std::path::Path,
    group: usize,
    id: usize,
) -> Running {
    let script = format!(
        "touch '{dir}/{id}'; n=0; while [ $(ls '{dir}' | wc -l) -lt {group} ]; do n=$((n+1)); [ $n -lt 500 ] || exit 3; sleep 0.01; done",
        dir = together.display()
    );
    join_line(store, name, &["-s", "-c", &script])
}

/// Starts lockrun on `name` with `args`, waiting up to a minute with retries
/// 30 s apart; returned once `status` shows it last in line.
fn join_line(store: &Store, name: &str, args: &[&str]) -> Running {
    let waiter = store
        .lockrun()
        .args(["--name", name, "-w", "60", "--initial-delay", "30"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .start();
    wait_until("the waiter to join the line", || {
        waiting_pids(store, name).last() == Some(&u64::from(waiter.id()))
    });
    waiter
}

/// The places in line in the store's directory (a waiter's, or one being made).
fn places(store: &Store) -> usize {
    fs::read_dir(store.dir())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|file| {
            let kind = file.rsplit('.').next();
            kind == Some("wait") || kind == Some("joining")
        })
        .count()
}

fn let_go(scratch: &Scratch, mut holder: Running) {
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

/// Eight readers wait behind a writer, and behind one more reader that is
/// stopped (Ctrl-Z) while it waits. The writer's release is the one event
/// that lets them in, and it lets all eight in at once: each waits in the
/// kernel on slot 0's lock, shared, not for the reader ahead of it to go.
#[test]
fn a_writers_release_wakes_every_reader_waiting_behind_it_at_once() {
    const READERS: usize = 8;
    let store = Store::file();
    let (scratch, group) = (Scratch::new(), Scratch::new());
    let writer = hold(&store, &scratch, "report", &[]);
    let mut stopped = join_line(&store, "report", &["-s", "true"]);
    signal(stopped.id(), Signal::SIGSTOP);
    let pid = stopped.id().cast_signed();
    wait_until("the first reader to stop", || {
        process_state(pid) == Some('T')
    });
    let mut readers: Vec<Running> = (0..READERS)
        .map(|id| reader_in_a_group(&store, "report", group.dir(), READERS, id))
        .collect();
    let released = Instant::now();
    let_go(&scratch, writer);
    for reader in &mut readers {
        assert_eq!(wait(reader).code(), Some(0), "the readers ran together");
    }
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken, not at a retry"
    );
    signal(stopped.id(), Signal::SIGCONT);
    assert_eq!(wait(&mut stopped).code(), Some(0));
}

/// A writer that dies in line between readers lets the readers behind it
/// join the ones ahead of it: once the holder goes, all of them hold at once.
/// Readers waiting for that writer together do not take its gone file for a
/// live waiter because of each other's locks on it.
#[test]
fn readers_behind_a_dead_writer_in_line_go_with_the_readers_ahead_of_it() {
    let store = Store::file();
    let (scratch, group) = (Scratch::new(), Scratch::new());
    let holder = hold(&store, &scratch, "journal", &[]);
    let mut first = reader_in_a_group(&store, "journal", group.dir(), 3, 1);
    let ran = scratch.path("writer-ran");
    let touch = format!("touch '{}'", ran.display());
    let mut writer = join_line(&store, "journal", &["-c", &touch]);
    let mut behind: Vec<Running> = (2..4)
        .map(|id| reader_in_a_group(&store, "journal", group.dir(), 3, id))
        .collect();
    writer.kill().unwrap();
    writer.wait().unwrap();
    wait_until("the dead writer to leave the line", || {
        waiting_pids(&store, "journal").len() == 3
    });
    let_go(&scratch, holder);
    for reader in behind.iter_mut().chain([&mut first]) {
        assert_eq!(wait(reader).code(), Some(0), "the readers ran together");
    }
    assert!(!ran.exists());
}

/// A sharer released with `--min-hold` keeps writers out until then, not
/// readers; a writer's keeps readers out. A writer waiting for a kept
/// sharer sleeps until the hold ends, and no longer.
#[test]
fn min_hold_keeps_the_other_mode_out() {
    let store = Store::file();
    for (first, other) in [("-s", "-p1"), ("-p1", "-s")] {
        let started = Instant::now();
        let kept = run(store
            .lockrun()
            .args(["--name", "kept", first, "--min-hold", "2", "true"]));
        assert_status(&kept, 0);
        let no_wait = ["--name", "kept", other, "-n", "true"];
        assert_status(&run(store.lockrun().args(no_wait)), 75);
        let same = ["--name", "kept", first, "-n", "-c", "echo $LOCKRUN_SLOT"];
        let beside = run(store.lockrun().args(same));
        if first == "-s" {
            assert_status(&beside, 0);
            assert_eq!(stdout(&beside).trim(), "1", "the kept slot 0 stays taken");
        } else {
            assert_status(&beside, 75);
        }
        let waits = ["--name", "kept", other, "-w", "10", "--initial-delay", "30"];
        assert_status(&run(store.lockrun().args(waits).arg("true")), 0);
        let waited = started.elapsed();
        assert!(
            (Duration::from_secs(2)..Duration::from_secs(5)).contains(&waited),
            "{first} kept {other} out for {waited:?}"
        );
    }
}

/// Sharers hold slot 0's file with a shared lock, as `flock -s` does: an
/// exclusive lock on it, as an older lockrun's exclusive run takes, waits
/// for them; a shared one joins them, and keeps a writer out in turn.
#[test]
fn sharers_lock_slot_0_as_flock_s_does() {
    let store = Store::file();
    let scratch = Scratch::new();
    let reader = hold(&store, &scratch, "flk", &["-s"]);
    let slot_0 = fs::File::open(store.dir().join("flk.0.lock")).unwrap();
    assert!(matches!(
        slot_0.try_lock(),
        Err(fs::TryLockError::WouldBlock)
    ));
    let_go(&scratch, reader);
    slot_0.try_lock_shared().unwrap();
    assert_status(
        &run(store.lockrun().args(["--name", "flk", "-n", "true"])),
        75,
    );
    assert_status(
        &run(store.lockrun().args(["--name", "flk", "-s", "-n", "true"])),
        0,
    );
}

/// Sharers hold a name with `-p 1`: a `-p 3` run is refused beside them,
/// and a sharer beside `-p 3` holders, even when slot 0 is free.
#[test]
fn a_sharer_and_another_parallelism_are_refused_both_ways() {
    let store = Store::file();
    let scratch = Scratch::new();
    let reader = hold(&store, &scratch, "mix", &["-s"]);
    let three = ["--name", "mix", "-p", "3", "-n", "true"];
    assert_status(&run(store.lockrun().args(three)), 64);
    let_go(&scratch, reader);

    let (first, second) = (Scratch::new(), Scratch::new());
    let on_slot_0 = hold(&store, &first, "mix", &["-p", "3"]);
    let on_slot_1 = hold(&store, &second, "mix", &["-p", "3"]);
    let sharer = ["--name", "mix", "-s", "-n", "true"];
    assert_status(&run(store.lockrun().args(sharer)), 64);
    let_go(&first, on_slot_0);
    assert_status(&run(store.lockrun().args(sharer)), 64);
    let_go(&second, on_slot_1);
    assert_status(&run(store.lockrun().args(sharer)), 0);
}

/// While every one of the 1024 share slots is taken, a sharer waits in line
/// without spinning, and takes the first one let go at once, woken by the
/// directory's watch, not a retry. (The test holds the slots' files itself.)
#[test]
fn a_sharer_waits_for_a_share_slot_when_every_one_is_taken() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    const SHARERS: usize = 1024;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard < 2 * SHARERS as u64 {
        eprintln!("skipped: at most {hard} open files");
        return;
    }
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    let store = Store::file();
    let mut shares: Vec<fs::File> = (0..SHARERS)
        .map(|slot| {
            let file = fs::File::create(store.dir().join(format!("full.{slot}.shared"))).unwrap();
            file.lock().unwrap();
            file
        })
        .collect();
    assert_status(
        &run(store.lockrun().args(["--name", "full", "-s", "-n", "true"])),
        75,
    );
    let mut waiter = join_line(&store, "full", &["-s", "-c", "exit $LOCKRUN_SLOT"]);
    let pid = waiter.id();
    let cpu = || {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<u64> = stat
            .rsplit_once(") ")
            .unwrap()
            .1
            .split(' ')
            .skip(11)
            .take(2)
            .map(|field| field.parse().unwrap())
            .collect();
        fields.iter().sum::<u64>()
    };
    let before = cpu();
    // A window to see it spin in, not a wait for anything.
    std::thread::sleep(Duration::from_millis(500));
    assert!(cpu() - before < 10, "the waiter spun");
    let released = Instant::now();
    drop(shares.remove(700));
    assert_eq!(wait(&mut waiter).code(), Some(700 % 256));
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken, not at a retry"
    );
}

/// flock(1) holding `lock` until `scratch`'s file `go` appears (ten seconds
/// at most, so that no lock outlives a failed test).
fn flock_holding(lock: &std::path::Path, scratch: &Scratch) -> Running {
    let script = format!(
        "touch '{held}'; for i in $(seq 1000); do [ -e '{go}' ] && exit 0; sleep 0.01; done",
        held = scratch.path("held").display(),
        go = scratch.path("go").display(),
    );
    let flock = std::process::Command::new("flock")
        .arg(lock)
        .args(["sh", "-c", &script])
        .start();
    wait_until("flock(1) to hold the lock", || {
        scratch.path("held").exists()
    });
    flock
}

/// A lock file that flock(1) holds is not an earlier lockrun's, whose record
/// is still in it: `status` and a busy run name flock's pid, never that
/// lockrun's, with its old "for ...".
#[test]
fn a_lock_that_flock_holds_is_not_shown_as_an_earlier_lockruns() {
    if !program_installed("flock", "flock(1) beside lockrun") {
        return;
    }
    let store = Store::file();
    let scratch = Scratch::new();
    assert_status(&run(store.lockrun().args(["--name", "x", "true"])), 0);
    let mut flock = flock_holding(&store.dir().join("x.0.lock"), &scratch);
    let pid = flock.id();
    let output = run(store.lockrun().args(["--name", "x", "-n", "true"]));
    assert_status(&output, 75);
    let busy = stderr(&output);
    assert!(
        busy.contains(&format!("held by pid {pid} (not lockrun: flock(1)?)")),
        "{busy}"
    );
    let listed = stdout(&run(store.status().args(["x", "--json"])));
    let holders: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(holders[0]["pid"], pid, "{listed}");
    assert_eq!(holders[0]["command"], "not lockrun: flock(1)?", "{listed}");
    assert_eq!(
        holders[0]["acquired_at"],
        serde_json::Value::Null,
        "{listed}"
    );
    fs::write(scratch.path("go"), "").unwrap();
    assert!(flock.wait().unwrap().success());
}

/// During a migration, flock(1) pointed at `DIR/NAME.0.lock` and lockrun
/// (`-p 1`) exclude each other, both ways (docs/backends/file.md: "File backend").
#[test]
fn flock_and_lockrun_exclude_each_other_both_ways() {
    if !program_installed("flock", "flock(1) beside lockrun") {
        return;
    }
    let store = Store::file();
    let scratch = Scratch::new();
    let lock = store.dir().join("x.0.lock");
    // flock holds: lockrun is busy, and a waiting lockrun starts once flock lets go.
    let mut flock = flock_holding(&lock, &scratch);
    assert_status(
        &run(store.lockrun().args(["--name", "x", "-n", "true"])),
        75,
    );
    let ran = scratch.path("ran");
    let mut waiter = store
        .lockrun()
        .args(["--name", "x", "-w", "10", "--", "touch"])
        .arg(&ran)
        .start();
    wait_until("the waiter to join the line", || {
        stdout(&run(store.status().args(["x", "--json"]))).contains("\"waiting\"")
    });
    assert!(!ran.exists(), "lockrun ran while flock(1) held the lock");
    fs::write(scratch.path("go"), "").unwrap();
    assert!(flock.wait().unwrap().success());
    assert!(waiter.wait().unwrap().success());
    assert!(ran.exists());
    // lockrun holds: flock -n is busy (its status 1), and takes the lock once lockrun ends.
    let holder = hold(&store, &scratch, "x", &[]);
    let flock_n = || {
        std::process::Command::new("flock")
            .args(["-n"])
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(flock_n(), Some(1), "flock(1) got the lock lockrun holds");
    fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
    assert_eq!(flock_n(), Some(0));
}
