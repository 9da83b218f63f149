//! What `/proc` tells about processes and file locks. Reading it never takes a
//! lock or changes anything.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;

/// What this host knows about a pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Running {
        /// Start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
        start_time: u64,
    },
    /// No such process, or a zombie (dead, holding nothing, only waiting to be reaped).
    Dead,
    /// Hidden from us (`/proc` mounted with `hidepid`) or unreadable: maybe alive.
    Unknown,
}

pub fn look_up(pid: u32) -> Seen {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // Only the kernel's "no such process" proves it gone; another user's hidden process is not.
        let exists = i32::try_from(pid)
            .ok()
            .filter(|&pid| pid > 0)
            .map(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None));
        return match exists {
            Some(Err(nix::errno::Errno::ESRCH)) => Seen::Dead,
            _ => Seen::Unknown,
        };
    };
    // The command name (field 2) may contain spaces and parentheses: skip past its last ')'.
    let Some(close) = stat.rfind(')') else {
        return Seen::Unknown;
    };
    let mut fields = stat[close + 1..].split_whitespace();
    match fields.next() {
        Some("Z" | "X") => Seen::Dead,
        _ => fields
            .nth(18)
            .and_then(|field| field.parse().ok())
            .map_or(Seen::Unknown, |start_time| Seen::Running { start_time }),
    }
}

/// Whether a process of `group` is still running (not a zombie): every
/// process's `/proc/PID/stat` read, so only for the rare moment it matters.
/// When `/proc` cannot be listed, the group counts as running.
pub fn group_has_live_process(group: nix::unistd::Pid) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return true;
    };
    let group = group.as_raw().to_string();
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| fs::read_to_string(entry.path().join("stat")).ok())
        .any(|stat| {
            // State (field 3) and process group (field 5), past the command name's last ')'.
            let fields = stat
                .rfind(')')
                .map(|close| stat[close + 1..].split_whitespace().collect::<Vec<_>>());
            fields.is_some_and(|fields| {
                fields.get(2) == Some(&group.as_str())
                    && !matches!(fields.first(), Some(&("Z" | "X")))
            })
        })
}

/// The pids of this process's ancestors, its parent first, up to PID 1.
pub fn ancestors() -> Vec<u32> {
    let parent = |pid: u32| -> Option<u32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Field 4, after the state; the command name may hold spaces and parentheses.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let mut chain = Vec::new();
    let mut pid = std::process::id();
    while let Some(up) = parent(pid).filter(|&up| up > 0 && !chain.contains(&up)) {
        chain.push(up);
        pid = up;
    }
    chain
}

/// This boot and pid namespace, `BOOT-ID/pid:[INODE]`: pids can only be compared
/// between processes that share both. Empty when either cannot be read.
pub fn boot_id() -> String {
    let boot = kernel_boot_id();
    let pid_namespace = fs::read_link("/proc/self/ns/pid");
    match (boot.is_empty(), pid_namespace) {
        (false, Ok(namespace)) => format!("{boot}/{}", namespace.display()),
        _ => String::new(),
    }
}

/// Whether process `pid` runs the same program as this one, by their command
/// names (`/proc/PID/comm`, readable for every process); `None` when it
/// cannot be told (it is gone, or hidden from us).
pub fn runs_this_program(pid: u32) -> Option<bool> {
    let comm = |pid: &str| fs::read_to_string(format!("/proc/{pid}/comm")).ok();
    Some(comm(&pid.to_string())? == comm("self")?)
}

/// This boot of the kernel: whose `CLOCK_BOOTTIME` every process on it shares
/// (pid namespaces included). Empty when it cannot be read.
pub fn kernel_boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|boot| boot.trim().to_owned())
        .unwrap_or_default()
}

/// An flock(2) lock held right now, from `/proc/locks`.
pub struct LiveFlock {
    dev: u64,
    ino: u64,
    pub pid: u32,
}

impl LiveFlock {
    /// True when this lock is on the file of `meta`. Filesystems with anonymous
    /// devices (btrfs subvolumes, overlayfs) may report another device in stat(2)
    /// than in `/proc/locks`; there the inode number alone decides.
    pub fn is_on(&self, meta: &fs::Metadata) -> bool {
        self.ino == meta.ino() && (self.dev == meta.dev() || nix::sys::stat::major(self.dev) == 0)
    }
}

/// Exclusive flock(2) locks held right now; reading them never takes a lock, so
/// `status` cannot make a real waiter miss a slot.
pub fn live_flocks() -> Vec<LiveFlock> {
    let Some(text) = read_in_large_pieces("/proc/locks") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            // "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; blocked waiters are marked "->".
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(1) != Some(&"FLOCK") || fields.get(3) != Some(&"WRITE") {
                return None;
            }
            let mut dev = fields.get(5)?.split(':');
            let major = u64::from_str_radix(dev.next()?, 16).ok()?;
            let minor = u64::from_str_radix(dev.next()?, 16).ok()?;
            Some(LiveFlock {
                dev: nix::sys::stat::makedev(major, minor),
                ino: dev.next()?.parse().ok()?,
                pid: fields.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

/// A `/proc` table in reads as large as the kernel gives (a page of lines each).
/// The kernel walks its list afresh for every read(2), so a line can be skipped
/// when others come and go between two reads: `fs::read_to_string`'s small first
/// reads made `status` miss a live holder while other processes took locks.
fn read_in_large_pieces(path: &str) -> Option<String> {
    let mut file = fs::File::open(path).ok()?;
    let mut text = Vec::new();
    let mut piece = vec![0; 64 * 1024];
    loop {
        match file.read(&mut piece) {
            Ok(0) => break,
            Ok(read) => text.extend_from_slice(&piece[..read]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_flocks_sees_a_held_lock() {
        let dir = tempfile::tempdir().unwrap();
        let file = fs::File::create(dir.path().join("x.0.lock")).unwrap();
        file.lock().unwrap();
        let meta = file.metadata().unwrap();
        let found = live_flocks().into_iter().find(|l| l.is_on(&meta));
        assert_eq!(found.map(|l| l.pid), Some(std::process::id()));
    }
}
