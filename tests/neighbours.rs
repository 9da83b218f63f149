//! Lock directories shared between users (docs/backends/file.md: "File backend"): who may
//! share one, and what a neighbour who shares it, or only the host, can do.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::users::{chmod, user};
use crate::support::*;

const PRINT_FENCE: [&str; 4] = ["--", "sh", "-c", "echo $LOCKRUN_FENCE"];

/// A directory tree others may enter, with the lock directory `locks` in it, of `mode`.
fn shared_tree(mode: u32) -> (Scratch, PathBuf) {
    let tree = Scratch::new();
    chmod(tree.dir(), 0o755);
    let dir = tree.path("locks");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, mode);
    (tree, dir)
}

/// Runs `lockrun` (already given its identity) on `x` in `dir` with `args`, printing the fence.
fn take(mut lockrun: Command, dir: &Path, args: &[&str]) -> Output {
    run(lockrun
        .arg("--dir")
        .arg(dir)
        .args(["--name", "x"])
        .args(args)
        .args(PRINT_FENCE))
}

fn fence(output: &Output) -> u64 {
    assert_status(output, 0);
    stdout(output).trim().parse().expect("a fence")
}

/// lockrun's one line for a refusal (exit 69), which must mention `what`.
fn assert_refused(output: &Output, what: &str) {
    assert_status(output, 69);
    let err = stderr(output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(what), "{err}");
}

#[test]
fn two_users_of_a_group_take_turns_on_one_lock() {
    let Some(first) = user(1) else { return };
    let second = user(2).expect("made like the first");
    let group = first.gid;
    // Group-writable without the setgid bit: the second user's files get the group from lockrun.
    let (tree, dir) = shared_tree(0o770);
    chown(&dir, Some(0), Some(group)).unwrap();
    let as_first = || first.lockrun(&[]);
    let as_second = || second.lockrun(&[group]);

    assert_eq!(fence(&take(as_first(), &dir, &[])), 1);
    assert_eq!(fence(&take(as_second(), &dir, &[])), 2);
    assert_eq!(fence(&take(as_first(), &dir, &[])), 3);

    // The second holds the lock while the first waits in line for its turn.
    let signals = tree.path("signals");
    fs::create_dir(&signals).unwrap();
    chmod(&signals, 0o777);
    let (ready, release) = (signals.join("ready"), signals.join("release"));
    let script = format!(
        "touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        ready.display(),
        release.display()
    );
    let mut holder = as_second()
        .arg("--dir")
        .arg(&dir)
        .args(["--name", "x", "-c", &script])
        .start();
    wait_for_file(&ready);
    let waiter = as_first()
        .arg("--dir")
        .arg(&dir)
        .args(["--name", "x", "-w", "20"])
        .args(PRINT_FENCE)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .start();
    let store = Store::file_in(&dir);
    wait_until("the first user in line", || {
        let output = run(store.status().args(["x", "--json"]));
        stdout(&output).contains(r#""state":"waiting""#)
    });
    fs::write(&release, "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
    assert_eq!(fence(&finish(waiter)), 5);

    for entry in fs::read_dir(&dir).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.gid()),
            (0o660, group),
            "every file is the group's"
        );
    }
}

#[test]
fn files_in_a_group_directory_are_the_groups_whatever_the_umask() {
    let (_tree, dir) = shared_tree(0o770);
    let mut strict = Command::new("sh");
    strict.args([
        "-c",
        "umask 077; exec \"$@\"",
        "sh",
        env!("CARGO_BIN_EXE_lockrun"),
    ]);
    assert_eq!(
        fence(&take(without_lockrun_variables(strict), &dir, &[])),
        1
    );
    let group = fs::metadata(&dir).unwrap().gid();
    let files: Vec<(String, u32, u32)> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            (
                entry.file_name().to_string_lossy().into_owned(),
                meta.mode() & 0o7777,
                meta.gid(),
            )
        })
        .collect();
    assert!(!files.is_empty());
    for (name, mode, gid) in files {
        assert_eq!((mode, gid), (0o660, group), "{name}");
    }
}

#[test]
fn a_world_writable_directory_without_the_sticky_bit_is_refused() {
    let (_tree, dir) = shared_tree(0o777);
    assert_refused(&take(lockrun(), &dir, &[]), "sticky bit");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "nothing made in it");
    chmod(&dir, 0o1777);
    assert_eq!(fence(&take(lockrun(), &dir, &[])), 1);
}

#[test]
fn fences_never_go_back_nor_wrap_around() {
    let store = Store::file();
    let counter = store.dir().join("x.fence");
    for expected in 1..=3 {
        assert_eq!(fence(&take(lockrun(), &store.dir(), &[])), expected);
    }
    // Rewritten (or removed and made again): the slot's file still knows the last fence.
    fs::write(&counter, "1").unwrap();
    assert_eq!(fence(&take(lockrun(), &store.dir(), &[])), 4);
    fs::remove_file(&counter).unwrap();
    assert_eq!(fence(&take(lockrun(), &store.dir(), &[])), 5);

    fs::write(&counter, u64::MAX.to_string()).unwrap();
    assert_refused(&take(lockrun(), &store.dir(), &[]), "no fence can follow");
}

#[test]
fn a_fence_counter_a_neighbour_wrote_is_refused_rather_than_followed_back() {
    let Some(neighbour) = user(1) else { return };
    // Like /tmp: anyone may create files, so the neighbour made the counter first.
    let (_tree, dir) = shared_tree(0o1777);
    let counter = dir.join("x.fence");
    let write = |number: u64| {
        let script = format!(
            "echo {number} > '{0}' && chmod 666 '{0}'",
            counter.display()
        );
        assert!(neighbour.sh(&script).status().unwrap().success());
    };
    write(100);
    // Two slots, the first kept taken: the second acquisition numbers slot 1,
    // whose file knows no earlier fence, from the counter alone.
    let args = ["-p", "2", "--min-hold", "60s"];
    let mut fences = Vec::new();
    for _ in 0..2 {
        let output = take(lockrun(), &dir, &args);
        if output.status.code() == Some(69) {
            assert_refused(&output, "refusing the fence counter");
            break;
        }
        fences.push(fence(&output));
        write(3);
    }
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fences went back: {fences:?}"
    );
}

#[test]
fn a_neighbour_holding_the_fence_or_line_lock_cannot_stall_a_timeout() {
    let store = Store::file();
    assert_eq!(fence(&take(lockrun(), &store.dir(), &[])), 1);
    let bounded = |args: &[&str], within: Duration| {
        let started = Instant::now();
        let output = finish(
            store
                .lockrun()
                .args(["--name", "x"])
                .args(args)
                .arg("true")
                .stderr(Stdio::piped())
                .start(),
        );
        assert!(
            started.elapsed() < within,
            "{args:?} took {:?}",
            started.elapsed()
        );
        output
    };

    let fence_lock = File::open(store.dir().join("x.fence")).unwrap();
    fence_lock.lock_shared().unwrap();
    // A lock held by a neighbour is trouble that may pass: `-n` rides it out for its 10 s.
    assert_refused(&bounded(&["-n"], Duration::from_secs(13)), "x.fence");
    assert_refused(&bounded(&["-w", "0.5"], Duration::from_secs(3)), "x.fence");
    drop(fence_lock);

    // With the slot held, a newcomer waits, and past its first 100 ms must
    // join the line: a lock stuck there is trouble ridden out until its timeout.
    let scratch = Scratch::new();
    let holder = crate::core::hold(&store, &scratch, "x", &[]);
    let line_lock = File::open(store.dir().join("x.line")).unwrap();
    line_lock.lock().unwrap();
    let output = bounded(&["-w", "0.5"], Duration::from_secs(3));
    assert_status(&output, 75);
    assert!(stderr(&output).contains("x.line"), "{}", stderr(&output));
    drop(line_lock);
    fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
    assert_status(&bounded(&["-n"], Duration::from_secs(5)), 0);
}
