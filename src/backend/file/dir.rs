//! The lock directory: which one, who shares it, and opening the files in it
//! without being led astray by anything a neighbour planted there.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, fchown};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The lock directory and who may share its locks (docs/backends/file.md: "File backend").
pub struct LockDir {
    path: PathBuf,
    sharing: Sharing,
}

#[derive(Clone, Copy, Debug)]
enum Sharing {
    /// Nobody else may create files in it: its files are as the umask makes them.
    Private,
    /// Group-writable, not world-writable: its group's members share its locks.
    /// Every file lockrun makes is 0660 with the directory's group.
    Group { gid: u32 },
    /// World-writable with the sticky bit (`/tmp`): anyone may create files, so
    /// each user's files are theirs alone (0600), and only files of this user,
    /// root or the directory's owner are trusted.
    World { dir_owner: u32 },
}

/// The mode of a file shared with the directory's group.
const SHARED_MODE: u32 = 0o660;
/// The mode of a file nobody else may open.
const OWN_MODE: u32 = 0o600;

/// `dir` as given, or the first usable default; created when missing if `create`.
pub fn choose(dir: Option<&Path>, create: bool) -> Result<LockDir> {
    let Some(dir) = dir else {
        return LockDir::vet(&default_dir(create)?);
    };
    // One look in the common case, a directory that exists.
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return LockDir::with(dir, &meta),
        Ok(_) => {
            return Err(Error::Unavailable(format!(
                "the lock directory {} is not a directory",
                dir.display()
            )));
        }
        Err(_) if !create => {
            return Err(Error::Missing(format!(
                "there is no lock directory {}",
                dir.display()
            )));
        }
        Err(_) => {}
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|err| {
            Error::unavailable(
                format!("cannot create lock directory {}", dir.display()),
                err,
            )
        })?;
    LockDir::vet(dir)
}

impl LockDir {
    /// [`LockDir::with`] the directory at `path` as it is now.
    fn vet(path: &Path) -> Result<Self> {
        let meta = fs::metadata(path).map_err(|err| {
            Error::unavailable(
                format!("cannot inspect lock directory {}", path.display()),
                err,
            )
        })?;
        Self::with(path, &meta)
    }

    /// Who shares the directory at `path`, from its mode (`meta`); a directory
    /// where anyone could delete a lock file in use is refused.
    fn with(path: &Path, meta: &Metadata) -> Result<Self> {
        let mode = meta.mode();
        let sharing = if mode & 0o002 != 0 {
            if mode & 0o1000 == 0 {
                return Err(Error::Unavailable(format!(
                    "refusing the lock directory {}: anyone may write to it and, without the sticky bit, delete a lock file in use (chmod +t it, or share locks through a directory of a group)",
                    path.display()
                )));
            }
            Sharing::World {
                dir_owner: meta.uid(),
            }
        } else if mode & 0o020 != 0 {
            Sharing::Group { gid: meta.gid() }
        } else {
            Sharing::Private
        };
        Ok(Self {
            path: path.to_owned(),
            sharing,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a lock file, creating it when missing, and refusing symlinks, FIFOs
    /// and hard links so that nothing planted in a shared directory is ever
    /// written through. A file of ours gets the mode its sharing calls for.
    pub fn open_lock_file(&self, path: &Path) -> Result<File> {
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(self.creation_mode())
            .custom_flags(flags())
            .open(path);
        let (file, meta) = vet(opened, path)?;
        self.share(&file, &meta, path)?;
        Ok(file)
    }

    /// Creates a file that must not exist yet (a waiter's), with the mode its sharing calls for.
    pub fn create_new(&self, path: &Path) -> Result<File> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(self.creation_mode())
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(path)
            .and_then(|file| file.metadata().map(|meta| (file, meta)));
        let (file, meta) = file
            .map_err(|err| Error::unavailable(format!("cannot create {}", path.display()), err))?;
        self.share(&file, &meta, path)?;
        Ok(file)
    }

    /// Whether a file in the directory can be written only by users who share
    /// it: what a counter that must never go back (the fence) has to be.
    pub fn trusts(&self, meta: &Metadata) -> Result<(), String> {
        let me = nix::unistd::geteuid().as_raw();
        let mode = meta.mode();
        let (group_writes, others_write) = (mode & 0o020 != 0, mode & 0o002 != 0);
        let writers_ok = match self.sharing {
            Sharing::Private => true,
            Sharing::Group { gid } => !others_write && (!group_writes || meta.gid() == gid),
            Sharing::World { dir_owner } => {
                [me, 0, dir_owner].contains(&meta.uid()) && !group_writes && !others_write
            }
        };
        if writers_ok {
            Ok(())
        } else {
            Err(format!(
                "it belongs to uid {} with mode {:o}, so users who do not share {} may have written it",
                meta.uid(),
                mode & 0o7777,
                self.path.display()
            ))
        }
    }

    /// Files are created open to nobody else, then opened up to the directory's
    /// group: never, even for a moment, to anyone else.
    fn creation_mode(&self) -> u32 {
        match self.sharing {
            Sharing::Private => 0o666,
            Sharing::Group { .. } | Sharing::World { .. } => OWN_MODE,
        }
    }

    /// Gives a file of ours the group and mode the directory's sharing calls for.
    fn share(&self, file: &File, meta: &Metadata, path: &Path) -> Result<()> {
        let group = match self.sharing {
            Sharing::Private => return Ok(()),
            Sharing::World { .. } => None,
            Sharing::Group { gid } => Some(gid),
        };
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Ok(());
        }
        // Only a member of the directory's group (or root) can give the file its group.
        let shared =
            group.is_some_and(|gid| meta.gid() == gid || fchown(file, None, Some(gid)).is_ok());
        let mode = if shared { SHARED_MODE } else { OWN_MODE };
        if meta.mode() & 0o7777 == mode {
            return Ok(());
        }
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(|err| Error::unavailable(format!("cannot share {}", path.display()), err))
    }
}

/// Opens an existing lock file (a waiter's, ahead of us) without creating it; `None` when it is gone.
pub fn open_existing(path: &Path) -> Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(flags())
        .open(path);
    match opened {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        // Removed between our open and our look at it: its waiter just left the line.
        Ok(file) if file.metadata().is_ok_and(|meta| meta.nlink() == 0) => Ok(None),
        opened => vet(opened, path).map(|(file, _)| Some(file)),
    }
}

fn vet(opened: io::Result<File>, path: &Path) -> Result<(File, Metadata)> {
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
    Ok((file, meta))
}

fn flags() -> i32 {
    // O_NONBLOCK keeps a planted FIFO from blocking the open; flock(2) ignores it.
    (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits()
}

/// Where the default directories are made, the first usable one first.
const DEFAULT_PARENTS: [&str; 2] = ["/run/lock", "/var/tmp"];
/// Why a default directory was passed over when it does not exist.
const NOT_THERE: &str = "it does not exist";

/// `/run/lock/lockrun-$UID`, else `/var/tmp/lockrun-$UID`: the first that is
/// (or, if `create`, can be made) a real directory of ours, mode 0700. Nothing
/// of the session (`XDG_RUNTIME_DIR`, `TMPDIR`, `HOME`) goes into the choice,
/// so cron, a login shell, ssh, a systemd unit and `sudo -u` all get the same
/// directory; `/run/user/UID` would also vanish at logout under a cron job's locks.
fn default_dir(create: bool) -> Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let candidates = DEFAULT_PARENTS.map(|parent| Path::new(parent).join(format!("lockrun-{uid}")));
    let mut refusals = Vec::new();
    for dir in &candidates {
        match private_dir(dir, uid, create) {
            Ok(()) => return Ok(dir.clone()),
            Err(why) => refusals.push((dir, why)),
        }
    }
    // None made yet (`status` on a fresh account): nothing can be held.
    if refusals.iter().all(|(_, why)| why == NOT_THERE) {
        return Err(Error::Missing(format!(
            "there is no lock directory {} yet",
            candidates[0].display()
        )));
    }
    let refusals: Vec<String> = refusals
        .iter()
        .map(|(dir, why)| format!("{} ({why})", dir.display()))
        .collect();
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
    let meta = fs::symlink_metadata(dir).map_err(|err| {
        if err.kind() == io::ErrorKind::NotFound {
            NOT_THERE.to_owned()
        } else {
            err.to_string()
        }
    })?;
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
