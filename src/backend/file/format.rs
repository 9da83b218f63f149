//! The directory's format (docs/backends/file.md: "File backend"): `format` holds the
//! version of the layout of the files lockrun keeps there, made by the first
//! run in the directory. A directory of a newer format is refused before
//! anything in it is touched. One read per run.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::dir::LockDir;
use crate::backend::newer_format;
use crate::error::{Error, Result};

/// Bumped when the files change in a way an older lockrun would misread.
pub const FORMAT: u32 = 1;

/// Its file's name: every file of a lock has a suffix after a dot, this one none.
const FILE_NAME: &str = "format";

/// Refuses the directory if a newer lockrun wrote it; marks it with our format
/// when it has none yet and `create`.
pub fn check(dir: &LockDir, create: bool) -> Result<()> {
    let path = dir.path().join(FILE_NAME);
    let cannot = |err| Error::unavailable(format!("cannot read {}", path.display()), err);
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(&path);
    let mut file = match opened {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return if create { mark(dir, &path) } else { Ok(()) };
        }
        // Another user's, in a directory where users do not share locks (`/tmp`).
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
        Err(err) => return Err(cannot(err)),
    };
    // One read: the file is only ever written whole (see `mark`).
    let mut text = [0; 32];
    let len = file.read(&mut text).map_err(cannot)?;
    let text = String::from_utf8_lossy(&text[..len]);
    let found = text.trim();
    if found == FORMAT.to_string() {
        return Ok(());
    }
    let meta = file.metadata().map_err(cannot)?;
    // In a world-writable directory a file another user made says nothing of ours.
    if !meta.is_file() || dir.trusts(&meta).is_err() {
        return Ok(());
    }
    match found.parse::<u64>() {
        Ok(found) if found <= u64::from(FORMAT) => Ok(()),
        Ok(found) => Err(Error::Unavailable(newer_format(
            &format!("the lock directory {}", dir.path().display()),
            "file format",
            found,
            FORMAT,
        ))),
        Err(_) => Err(Error::Unavailable(format!(
            "{} does not say a lockrun file format; refusing the lock directory (remove the file if nothing else uses the directory)",
            path.display()
        ))),
    }
}

/// Writes our format into the directory, whole: written aside, then renamed
/// into place, so that no reader sees it half written.
fn mark(dir: &LockDir, path: &Path) -> Result<()> {
    let aside = dir
        .path()
        .join(format!("{FILE_NAME}.{}.new", std::process::id()));
    let mut file = dir.create_new(&aside)?;
    let written = file
        .write_all(format!("{FORMAT}\n").as_bytes())
        .and_then(|()| fs::rename(&aside, path));
    written.map_err(|err| {
        let _ = fs::remove_file(&aside);
        Error::unavailable(format!("cannot write {}", path.display()), err)
    })
}
