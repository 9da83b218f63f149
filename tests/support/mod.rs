//! Test harness: real lockrun processes against real stores, with every wait bounded.

#![allow(dead_code)]

pub mod pty;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long any single wait in a test may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A lock store for one test: the backend flags plus whatever keeps it alive.
pub struct Store {
    pub kind: &'static str,
    args: Vec<OsString>,
    _keep: Box<dyn std::any::Any>,
}

impl Store {
    /// The file backend in a fresh directory.
    pub fn file() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let args = vec![
            "--backend".into(),
            "file".into(),
            "--dir".into(),
            dir.path().into(),
        ];
        Self {
            kind: "file",
            args,
            _keep: Box::new(dir),
        }
    }

    /// The backend flags, for commands built by hand.
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// `lockrun BACKEND-FLAGS` with no `LOCKRUN_*` variable leaking in from the test's environment.
    pub fn lockrun(&self) -> Command {
        let mut command = lockrun();
        command.args(&self.args);
        command
    }

    /// `lockrun status BACKEND-FLAGS`.
    pub fn status(&self) -> Command {
        let mut command = lockrun();
        command.arg("status").args(&self.args);
        command
    }
}

/// The lockrun binary with a clean environment for its own variables.
pub fn lockrun() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockrun"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKRUN_") {
            command.env_remove(key);
        }
    }
    command.stdin(Stdio::null());
    command
}

/// A scratch directory for markers and logs the commands write.
pub struct Scratch(TempDir);

impl Scratch {
    pub fn new() -> Self {
        Self(TempDir::new().expect("temp dir"))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    pub fn dir(&self) -> &Path {
        self.0.path()
    }

    /// The lines of a log file (empty when it does not exist).
    pub fn lines(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.path(name))
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// Runs to completion within `PATIENCE`, capturing output.
pub fn run(command: &mut Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockrun");
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    if let Ok(output) = receiver.recv_timeout(PATIENCE) {
        output.expect("wait for lockrun")
    } else {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
        panic!("lockrun (pid {pid}) did not finish within {PATIENCE:?}");
    }
}

/// Waits for a spawned child within `limit`; kills it and fails the test otherwise.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn wait(child: &mut Child) -> ExitStatus {
    wait_within(child, PATIENCE)
}

/// Waits until `condition` holds, failing the test after `PATIENCE`.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the child's piped stderr until a line contains `needle`; the rest is drained in the background.
pub fn wait_for_stderr(child: &mut Child, needle: &str) {
    let stderr = child.stderr.take().expect("stderr piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let started = Instant::now();
    loop {
        let left = PATIENCE.saturating_sub(started.elapsed());
        match receiver.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(err) => panic!("no {needle:?} on stderr within {PATIENCE:?}: {err}"),
        }
    }
}

pub fn wait_for_file(path: &Path) {
    wait_until(&format!("{} to appear", path.display()), || path.exists());
}

/// Reads a pid a command wrote to `path`, once it is there.
pub fn read_pid(path: &Path) -> i32 {
    let mut pid = None;
    wait_until(&format!("a pid in {}", path.display()), || {
        pid = fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        pid.is_some()
    });
    pid.expect("set above")
}

pub fn process_exists(pid: i32) -> bool {
    // A zombie is as good as gone: it runs no code. Field 3 of /proc/PID/stat is its state.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

pub fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), signal);
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts lockrun's exit status and that any diagnostic it printed is one line.
pub fn assert_status(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stderr: {}",
        stderr(output)
    );
}
