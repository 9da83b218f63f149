//! Other users of this host, for tests of what a neighbour can and cannot do to
//! a lock: unprivileged users `lockrun-test-N`, made once with useradd when the
//! tests run as root. Without root such a test says why it did not run.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

pub struct User {
    pub uid: u32,
    /// Its own group (useradd --user-group).
    pub gid: u32,
}

/// Test user number `n`, made the first time it is asked for; `None` after a
/// printed notice when the tests do not run as root or the user cannot be made.
pub fn user(n: u32) -> Option<User> {
    static MAKING: Mutex<()> = Mutex::new(());
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "\n*** SKIPPED: not running as root, so this test cannot act as another user ***\n"
        );
        return None;
    }
    let _one_at_a_time = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let name = format!("lockrun-test-{n}");
    if id(&name, "-u").is_none() {
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/usr/sbin/nologin", &name])
            .status();
        if !made.is_ok_and(|status| status.success()) {
            eprintln!("\n*** SKIPPED: cannot make the test user {name} with useradd ***\n");
            return None;
        }
    }
    Some(User {
        uid: id(&name, "-u")?,
        gid: id(&name, "-g")?,
    })
}

fn id(name: &str, which: &str) -> Option<u32> {
    let output = Command::new("id").args([which, name]).output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

impl User {
    /// `program` run as this user, with `groups` as its supplementary groups.
    pub fn command(&self, program: impl AsRef<OsStr>, groups: &[u32]) -> Command {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid));
        if groups.is_empty() {
            command.arg("--clear-groups");
        } else {
            let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
            command.arg(format!("--groups={}", groups.join(",")));
        }
        command.arg("--").arg(program);
        command
    }

    /// lockrun run as this user, with `groups` as its supplementary groups.
    pub fn lockrun(&self, groups: &[u32]) -> Command {
        super::without_lockrun_variables(self.command(env!("CARGO_BIN_EXE_lockrun"), groups))
    }

    /// A shell command line run as this user, without supplementary groups.
    pub fn sh(&self, script: &str) -> Command {
        let mut command = self.command("/bin/sh", &[]);
        command.args(["-c", script]);
        command
    }
}

/// Sets `path`'s mode: a test's temporary directory is 0700, which no other user can enter.
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}
