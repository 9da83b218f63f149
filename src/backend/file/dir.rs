//! The lock directory: which one, and opening the files in it without being
//! led astray by anything a neighbour planted there.

use std::env;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `dir` as given, or the first usable default; created when missing if `create`.
pub fn choose(dir: Option<&Path>, create: bool) -> Result<PathBuf> {
    let Some(dir) = dir else {
        return default_dir(create);
    };
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Unavailable(format!(
            "the lock directory {} is not a directory",
            dir.display()
        )));
    }
    if !create && !dir.is_dir() {
        return Err(Error::Unavailable(format!(
            "there is no lock directory {}",
            dir.display()
        )));
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map(|()| dir.to_owned())
        .map_err(|err| {
            Error::unavailable(
                format!("cannot create lock directory {}", dir.display()),
                err,
            )
        })
}

/// Opens a lock file, creating it when missing, and refusing symlinks, FIFOs
/// and hard links so that nothing planted in a shared directory is ever written through.
pub fn open_lock_file(path: &Path) -> Result<File> {
    vet(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666)
            .custom_flags(flags())
            .open(path),
        path,
    )
}

/// Opens an existing lock file (a waiter's, ahead of us) without creating it; `None` when it is gone.
pub fn open_existing(path: &Path) -> Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(flags())
        .open(path);
    match opened {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        opened => vet(opened, path).map(Some),
    }
}

fn vet(opened: io::Result<File>, path: &Path) -> Result<File> {
    let file = opened.map_err(|err| match err.raw_os_error() {
        Some(code) if code == nix::errno::Errno::ELOOP as i32 => Error::Unavailable(format!(
            "refusing to follow the symbolic link at {}",
            path.display()
        )),
        _ => Error::unavailable(format!("cannot open lock file {}", path.display()), err),
    })?;
    let meta = file.metadata().map_err(|err| {
        Error::unavailable(format!("cannot inspect lock file {}", path.display()), err)
    })?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(Error::Unavailable(format!(
            "refusing to use {}: not a plain lock file (a special file or a hard link)",
            path.display()
        )));
    }
    Ok(file)
}

fn flags() -> i32 {
    // O_NONBLOCK keeps a planted FIFO from blocking the open; flock(2) ignores it.
    (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits()
}

/// `$XDG_RUNTIME_DIR/lockrun`, else `/run/lock/lockrun`, else `$TMPDIR/lockrun-$UID`:
/// the first that is (or, if `create`, can be made) a real directory of ours, mode 0700.
fn default_dir(create: bool) -> Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let mut candidates = Vec::new();
    if let Some(runtime) = env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(runtime).join("lockrun"));
    }
    candidates.push(PathBuf::from("/run/lock/lockrun"));
    candidates.push(env::temp_dir().join(format!("lockrun-{uid}")));
    let mut refusals = Vec::new();
    for dir in candidates {
        match private_dir(&dir, uid, create) {
            Ok(()) => return Ok(dir),
            Err(why) => refusals.push(format!("{} ({why})", dir.display())),
        }
    }
    Err(Error::Unavailable(format!(
        "no usable lock directory: {}; set --dir",
        refusals.join(", ")
    )))
}

fn private_dir(dir: &Path, uid: u32, create: bool) -> Result<(), String> {
    if create {
        match DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err.to_string()),
        }
    }
    let meta = fs::symlink_metadata(dir).map_err(|err| err.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("a symbolic link".into());
    }
    if !meta.is_dir() {
        return Err("not a directory".into());
    }
    if meta.uid() != uid {
        return Err(format!("owned by uid {}", meta.uid()));
    }
    Ok(())
}
