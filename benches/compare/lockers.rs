//! The contenders: how bare `true`, flock(1) and each lockrun backend run a command under a
//! named lock, in a clean environment, and how each shows who is waiting in its line.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::SLOTS;
use crate::builds::Build;
use crate::machine::first_line;

/// How a command holds its lock: alone (the default of lockrun and flock(1)) or
/// together with the other sharers (`-s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
}

/// The lock a command runs under: its name, how many slots it has, the
/// command's place in its round (flock(1) gives it slot file `id % slots`) and
/// its mode. [`Lock::named`] is one slot, exclusive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lock<'a> {
    pub(crate) name: &'a str,
    pub(crate) slots: u32,
    pub(crate) id: usize,
    pub(crate) mode: Mode,
}

impl<'a> Lock<'a> {
    pub(crate) fn named(name: &'a str) -> Self {
        Self {
            name,
            slots: 1,
            id: 0,
            mode: Mode::Exclusive,
        }
    }

    /// `slots` slots, for the `id`-th command of a round.
    pub(crate) fn slots(self, slots: u32, id: usize) -> Self {
        Self { slots, id, ..self }
    }

    pub(crate) fn mode(self, mode: Mode) -> Self {
        Self { mode, ..self }
    }
}

/// How one contender runs a command under the lock called `name`.
#[derive(Clone, Debug)]
pub(crate) enum Locker {
    Bare,
    Flock {
        dir: PathBuf,
    },
    Lockrun {
        build: Build,
        backend: &'static str,
        /// `--backend` and the store's own flag.
        flags: Vec<OsString>,
    },
}

impl Locker {
    pub(crate) fn label(&self) -> String {
        match self {
            Self::Bare => "bare".into(),
            Self::Flock { .. } => "flock(1)".into(),
            Self::Lockrun { backend, build, .. } if build.label == "default build" => {
                format!("lockrun {backend}")
            }
            Self::Lockrun { backend, build, .. } => format!("lockrun {backend} ({})", build.label),
        }
    }

    /// The same contender run by another build of lockrun.
    pub(crate) fn with_build(&self, other: &Build) -> Self {
        match self {
            Self::Lockrun { backend, flags, .. } => Self::Lockrun {
                build: other.clone(),
                backend,
                flags: flags.clone(),
            },
            other => other.clone(),
        }
    }

    pub(crate) fn command<S: AsRef<std::ffi::OsStr>>(&self, name: &str, argv: &[S]) -> Command {
        self.command_under(Lock::named(name), argv)
    }

    /// `argv` under `lock`. flock(1) has one slot per file: with more, the
    /// command is given file `id % slots` beforehand, so its waiter never looks
    /// for a free one (no line and no search: the least any slot handoff costs).
    /// A shared lock is flock(1)'s `-s` and lockrun's `-s`.
    pub(crate) fn command_under<S: AsRef<std::ffi::OsStr>>(
        &self,
        lock: Lock,
        argv: &[S],
    ) -> Command {
        let shared = lock.mode == Mode::Shared;
        let mut command = match self {
            Self::Bare => Command::new(&argv[0]),
            Self::Flock { dir } => {
                let slot = lock.id % lock.slots as usize;
                let mut command = Command::new("flock");
                if shared {
                    command.arg("-s");
                }
                command
                    .arg(Self::flock_file(dir, lock.name, slot))
                    .arg(&argv[0]);
                command
            }
            Self::Lockrun {
                build,
                backend,
                flags,
            } => {
                let mut command = Command::new(&build.path);
                command.args(flags);
                identity(&mut command, backend);
                if lock.slots > 1 {
                    command.args(["-p", &lock.slots.to_string()]);
                }
                if shared {
                    command.arg("-s");
                }
                command.args(["--name", lock.name, "--"]).arg(&argv[0]);
                command
            }
        };
        command.args(&argv[1..]);
        clean_environment(&mut command);
        command.stdin(Stdio::null()).stdout(Stdio::null());
        command
    }

    /// Runs `true` under `lock` once; why not when it fails (lockrun's words on stderr).
    pub(crate) fn probe(&self, lock: Lock) -> Result<(), String> {
        let output = self
            .command_under(lock, &["true"])
            .stderr(Stdio::piped())
            .output()
            .map_err(|err| format!("cannot run {}: {err}", self.label()))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(match stderr.trim() {
            "" => output.status.to_string(),
            said => said.to_owned(),
        })
    }

    fn flock_file(dir: &Path, name: &str, slot: usize) -> PathBuf {
        dir.join(format!("{name}.{slot}.flock"))
    }

    /// The pids waiting in the line of `name`, in line order where the locker
    /// keeps one: lockrun's `status NAME --json`; for flock(1) the blocked
    /// requests on its files in /proc/locks. `None` when that cannot be read.
    pub(crate) fn waiting_pids(&self, name: &str) -> Option<Vec<u32>> {
        match self {
            Self::Bare => None,
            Self::Flock { dir } => {
                // Every slot's file that exists: a line of one file per slot has no order.
                let inodes: Vec<u64> = (0..SLOTS as usize)
                    .filter_map(|slot| fs::metadata(Self::flock_file(dir, name, slot)).ok())
                    .map(|meta| meta.ino())
                    .collect();
                let locks = fs::read_to_string("/proc/locks").ok()?;
                Some(
                    locks
                        .lines()
                        .filter_map(|line| {
                            // "2: -> FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
                            let fields: Vec<&str> = line.split_whitespace().collect();
                            if fields.get(1) != Some(&"->") || fields.get(2) != Some(&"FLOCK") {
                                return None;
                            }
                            let file_inode: u64 =
                                fields.get(6)?.rsplit(':').next()?.parse().ok()?;
                            inodes
                                .contains(&file_inode)
                                .then(|| fields.get(5)?.parse().ok())?
                        })
                        .collect(),
                )
            }
            Self::Lockrun {
                build,
                backend,
                flags,
            } => {
                let mut command = Command::new(&build.path);
                identity(&mut command, backend);
                command
                    .arg("status")
                    .args(flags)
                    .args([name, "--json"])
                    .stdin(Stdio::null())
                    .stderr(Stdio::null());
                clean_environment(&mut command);
                let output = command.output().ok()?;
                let entries: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
                let mut waiters: Vec<(u64, u32)> = entries
                    .as_array()?
                    .iter()
                    .filter(|entry| entry["state"] == "waiting")
                    .filter_map(|entry| {
                        Some((entry["position"].as_u64()?, entry["pid"].as_u64()? as u32))
                    })
                    .collect();
                waiters.sort_unstable();
                Some(waiters.into_iter().map(|(_, pid)| pid).collect())
            }
        }
    }
}

/// No `LOCKRUN_*` variable of the benchmark's own environment reaches a
/// contender, nor the directories cargo puts in front of `LD_LIBRARY_PATH` for
/// `cargo bench`: every dynamically linked program (flock(1), `true`, lockrun)
/// would look for each of its libraries in all of them first, about 0.3 ms per
/// run here, which no one running lockrun pays.
fn clean_environment(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKRUN_") {
            command.env_remove(key);
        }
    }
    match users_library_path() {
        Some(path) => command.env("LD_LIBRARY_PATH", path),
        None => command.env_remove("LD_LIBRARY_PATH"),
    };
}

/// A lockrun of the S3 backend signs with the identity of the tests' SeaweedFS
/// server (tests/support/s3.rs), which the benchmark starts.
fn identity(command: &mut Command, backend: &str) {
    #[cfg(feature = "s3")]
    if backend == "s3" {
        command
            .env("AWS_ACCESS_KEY_ID", crate::support::s3::KEY)
            .env("AWS_SECRET_ACCESS_KEY", crate::support::s3::SECRET);
    }
    #[cfg(not(feature = "s3"))]
    let _ = (command, backend);
}

/// `LD_LIBRARY_PATH` without the target directory's and the Rust toolchain's entries.
fn users_library_path() -> Option<&'static OsString> {
    static PATH: OnceLock<Option<OsString>> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::var_os("LD_LIBRARY_PATH")?;
        let own = PathBuf::from(env!("CARGO_BIN_EXE_lockrun"));
        let target = own.parent().and_then(Path::parent)?.to_owned();
        let sysroot = PathBuf::from(first_line("rustc", &["--print", "sysroot"]));
        let kept: Vec<PathBuf> = std::env::split_paths(&path)
            .filter(|dir| !dir.starts_with(&target) && !dir.starts_with(&sysroot))
            .collect();
        (!kept.is_empty())
            .then(|| std::env::join_paths(kept).ok())
            .flatten()
    })
    .as_ref()
}

/// The locker, or why it cannot be measured (`lockrun --backend X -- true` fails).
pub(crate) fn available(locker: Locker) -> Result<Locker, String> {
    locker
        .probe(Lock::named("probe"))
        .map_err(|why| format!("backend unavailable: {why}"))?;
    Ok(locker)
}

pub(crate) fn run_ok(command: &mut Command) {
    let status = command.status().expect("spawn a benchmarked command");
    assert!(status.success(), "{command:?} failed: {status}");
}

impl crate::Bench {
    /// flock(1) and every backend, each with its locker or why it has none.
    pub(crate) fn every_locker(&self) -> Vec<(&'static str, Result<Locker, String>)> {
        vec![
            ("flock(1)", Ok(self.flock.clone())),
            ("file", Ok(self.file.clone())),
            ("sqlite", self.sqlite.clone()),
            ("redis", crate::servers::locker(&self.redis)),
            ("postgres", crate::servers::locker(&self.postgres)),
            ("etcd", crate::servers::locker(&self.etcd)),
        ]
    }
}
