//! Who a holder is: enough to show it in `status` and, on the same host, to
//! tell whether its process is still alive (pid + process start time + boot id).

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::platform::pidfd::ProcessEnd;
use crate::platform::proc::{Seen, boot_id, look_up};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/PID/stat`); 0 when unknown.
    #[serde(default)]
    pub start_time: u64,
    /// The kernel's boot id and the process's pid namespace, `BOOT-ID/pid:[INODE]`:
    /// pids can only be compared between processes that share both. Empty when unknown.
    #[serde(default)]
    pub boot_id: String,
    pub host: String,
}

impl Process {
    pub fn current() -> Self {
        let pid = std::process::id();
        Self {
            pid,
            start_time: start_time(pid).unwrap_or(0),
            boot_id: here().boot_id.clone(),
            host: here().host.clone(),
        }
    }

    /// This process for a backend that never asks whether a holder is gone
    /// (file: the kernel frees a dead holder's lock): pid and host only,
    /// without the `/proc` reads for start time and boot id.
    pub fn current_without_liveness() -> Self {
        Self {
            pid: std::process::id(),
            start_time: 0,
            boot_id: String::new(),
            host: host_name(),
        }
    }

    /// True when both run on the same boot of the same host, in one pid
    /// namespace: only then can one tell whether the other is alive.
    pub fn shares_host_with(&self, other: &Self) -> bool {
        !self.boot_id.is_empty() && self.boot_id == other.boot_id && self.host == other.host
    }

    /// True when this process certainly no longer exists: it ran on this boot of
    /// this machine and its pid is gone or now belongs to a younger process.
    pub fn is_gone(&self) -> bool {
        if !self.runs_here() {
            return false;
        }
        match look_up(self.pid) {
            // A start time of 0 means the holder could not read its own: it cannot be told apart.
            Seen::Running { start_time } => self.start_time != 0 && start_time != self.start_time,
            Seen::Dead => true,
            Seen::Unknown => false,
        }
    }

    /// Watches this process for its end, if it runs here and can be watched.
    pub fn watch_end(&self) -> Option<ProcessEnd> {
        self.runs_here()
            .then(|| ProcessEnd::watch(self.pid, self.start_time))
            .flatten()
    }

    /// Whether it ran on this boot of this machine, in our pid namespace:
    /// otherwise its pids mean nothing here.
    fn runs_here(&self) -> bool {
        let here = here();
        !self.boot_id.is_empty() && self.boot_id == here.boot_id && self.host == here.host
    }
}

/// This process's boot, pid namespace and host, which a waiter compares with
/// every entry ahead of it at every look: read once, as they are this
/// process's for its life (the host name as it started, as its entries say).
struct Here {
    boot_id: String,
    host: String,
}

fn here() -> &'static Here {
    static HERE: OnceLock<Here> = OnceLock::new();
    HERE.get_or_init(|| Here {
        boot_id: boot_id(),
        host: host_name(),
    })
}

fn start_time(pid: u32) -> Option<u64> {
    match look_up(pid) {
        Seen::Running { start_time } => Some(start_time),
        Seen::Dead | Seen::Unknown => None,
    }
}

/// The name of the user this process runs as, or its uid where it has none.
pub fn user_name() -> String {
    let uid = nix::unistd::getuid();
    name_of(uid).unwrap_or_else(|| uid.to_string())
}

/// The name of the user `uid`, if it has one. /etc/passwd is read first, as
/// glibc's own "files" source reads it: NSS's start (nsswitch.conf, nscd's
/// socket, perhaps a module loaded) costs about 0.1 ms of a 2 ms run
/// (BENCHMARKS.md: "Less work per run: the user's name, the spawn's stack, the
/// watchdog's title"). NSS is asked only for a user the file does not list (a
/// directory's: LDAP, sssd).
pub fn name_of(uid: nix::unistd::Uid) -> Option<String> {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| listed_user_name(&passwd, uid.as_raw()).map(str::to_owned))
        .or_else(|| {
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|user| user.name)
        })
}

/// The name on the first line of a passwd(5) file with this uid; NIS's
/// `+`/`-` lines and comments name nobody.
fn listed_user_name(passwd: &str, uid: u32) -> Option<&str> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let listed_uid = fields.nth(1)?.parse::<u32>().ok()?;
        let named = !name.is_empty() && !name.starts_with(['+', '-', '#']);
        (named && listed_uid == uid).then_some(name)
    })
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

/// A random token unique to one acquisition (`LOCKRUN_TOKEN`): 16 bytes from
/// the kernel (getrandom(2)), in hex. Taken directly rather than from a seeded
/// generator: an uncontended run needs no other random number, and seeding one
/// costs more than this (BENCHMARKS.md).
pub fn new_token() -> Result<String> {
    let mut bytes = [0_u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| Error::internal("making a token", err))?;
    Ok(bytes
        .iter()
        .fold(String::with_capacity(32), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        }))
}

/// Milliseconds since the Unix epoch, the form times are stored in.
pub fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert!(
            a.len() == 32 && a.bytes().all(|c| c.is_ascii_hexdigit()),
            "{a}"
        );
        assert_ne!(a, b);
    }

    #[test]
    fn a_user_is_named_by_the_first_passwd_line_with_its_uid() {
        let passwd = "# local users\n+nis:x:1000:1000::/:/bin/sh\nroot:x:0:0:root:/root:/bin/bash\n\
                      alice:x:1000:1000::/home/alice:/bin/sh\nalias:x:1000:1000::/:/bin/sh\nbad:x:12x:1::/:\n";
        assert_eq!(listed_user_name(passwd, 0), Some("root"));
        assert_eq!(listed_user_name(passwd, 1000), Some("alice"));
        assert_eq!(listed_user_name(passwd, 12), None);
        assert_eq!(listed_user_name(passwd, 4242), None);
    }

    #[test]
    fn this_process_is_alive() {
        let me = Process::current();
        assert!(me.start_time > 0);
        assert!(!me.is_gone());
    }

    /// A child that runs until its stdin closes, and its identity read while it lives.
    fn living_child() -> (std::process::Child, Process) {
        let child = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut it = Process::current();
        it.pid = child.id();
        it.start_time = start_time(child.id()).unwrap();
        assert!(!it.is_gone());
        (child, it)
    }

    #[test]
    fn a_reaped_child_is_gone() {
        let (mut child, it) = living_child();
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(it.is_gone());
    }

    #[test]
    fn an_unreaped_child_is_gone() {
        let (mut child, it) = living_child();
        drop(child.stdin.take());
        // Exited but not reaped: a zombie, which holds nothing.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !it.is_gone() {
            assert!(std::time::Instant::now() < deadline, "still not gone");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
    }

    #[test]
    fn a_holder_without_a_start_time_is_never_judged_gone_while_its_pid_lives() {
        let mut it = Process::current();
        it.start_time = 0;
        assert!(!it.is_gone());
    }

    #[test]
    fn a_reused_pid_is_gone_and_another_boot_is_unknown() {
        let mut it = Process::current();
        it.start_time += 1;
        assert!(it.is_gone(), "same pid, different start time");
        it.boot_id = "another-boot".into();
        assert!(
            !it.is_gone(),
            "a holder from another boot or host cannot be judged"
        );
    }
}
