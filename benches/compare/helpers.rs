//! The helper commands the benchmark runs as itself: `compare stamp`, the command the queue
//! rounds run under the lock, and `compare rss`, the peak-RSS wrapper of (e).

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use nix::time::{ClockId, clock_gettime};

use crate::queue::Counters;

/// `compare rss PROGRAM ARGS...`: runs the program and prints the peak RSS (KiB)
/// of it and every descendant it waited for (`getrusage(RUSAGE_CHILDREN)`).
pub(crate) fn rss(argv: &[OsString]) {
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .status()
        .expect("spawn the measured program");
    assert!(status.success(), "{argv:?} failed: {status}");
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    println!("{}", usage.max_rss());
}

/// `compare stamp LOG ID hold MS` or `compare stamp LOG ID until FILE`: the
/// command the queue benchmarks run under the lock. It appends one line to LOG,
/// in one write: `START END ID WAKEUPS CPU_NS`, START as it begins and END just
/// before it exits (`CLOCK_MONOTONIC` nanoseconds), then the voluntary context
/// switches and CPU time of its parent (the lockrun or flock(1) that waited for
/// the lock) as it began. `until FILE` first creates FILE.held.ID, then holds
/// until FILE exists.
pub(crate) fn stamp(args: &[OsString]) {
    let start = monotonic_nanos();
    let parent = Counters::of(std::os::unix::process::parent_id()).unwrap_or_default();
    let [log, id, mode, value] = args else {
        panic!("usage: stamp LOG ID hold MS | stamp LOG ID until FILE");
    };
    let id = id.to_string_lossy();
    if mode == "hold" {
        let millis = value
            .to_str()
            .and_then(|v| v.parse().ok())
            .expect("hold MS");
        thread::sleep(Duration::from_millis(millis));
    } else {
        let release = PathBuf::from(value);
        fs::write(release.with_extension(format!("held.{id}")), "").expect("write the held marker");
        while !release.exists() {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let line = format!(
        "{start} {} {id} {} {}\n",
        monotonic_nanos(),
        parent.wakeups,
        parent.cpu_ns
    );
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .expect("append to the stamp log");
}

fn monotonic_nanos() -> i128 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec())
}
