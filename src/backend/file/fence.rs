//! The fence of a name (`LOCKRUN_FENCE`), which only ever increases.
//!
//! `NAME.fence` counts the acquisitions of every slot of the name, changed under
//! its own lock. A counter that went back (rewritten, removed) is caught up by
//! the last fence of the slot being taken, which its slot file keeps and only
//! that slot's holder writes; a counter that users who do not share the
//! directory could have written is refused, and so is one that cannot grow. Its
//! lock is waited for only briefly and never past the wait's deadline: lockrun
//! holds it for microseconds, so a neighbour who holds it is stuck or hostile.
//! Under the same lock a run is let into the name's slots or line (`admit`).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::dir::LockDir;
use super::wait::{LockMode, brief_lock_deadline, lock_until};
use crate::error::{Error, Result, Trouble};
use crate::platform::clock::Moment;

const FENCE_SUFFIX: &str = ".fence";

/// The counter of the name whose files start with `stem`, locked until dropped.
pub struct Counter {
    file: File,
    path: PathBuf,
}

impl Counter {
    /// Locks the counter, waiting for its lock briefly, and not past `deadline`.
    pub fn lock(dir: &LockDir, stem: &str, deadline: Option<Moment>) -> Result<Self> {
        let path = dir.path().join(format!("{stem}{FENCE_SUFFIX}"));
        let shown = path.display();
        let file = dir.open_lock_file(&path)?;
        let meta = file
            .metadata()
            .map_err(|err| Error::unavailable(format!("cannot update fence {shown}"), err))?;
        dir.trusts(&meta).map_err(|why| {
            Error::Unavailable(format!("refusing the fence counter {shown}: {why}"))
        })?;
        if !lock_until(
            &file,
            LockMode::Exclusive,
            brief_lock_deadline(deadline),
            &path,
        )? {
            return Err(Error::trouble(
                Trouble::Transient,
                format!("cannot number the acquisition: another process keeps {shown} locked"),
            ));
        }
        Ok(Self { file, path })
    }

    /// The fence of an acquisition of a slot whose last fence was `last_of_slot`.
    pub fn next(&self, last_of_slot: u64) -> Result<u64> {
        let file = &self.file;
        let shown = self.path.display();
        let failed =
            |err: std::io::Error| Error::unavailable(format!("cannot update fence {shown}"), err);
        let mut text = String::new();
        (file).take(64).read_to_string(&mut text).map_err(failed)?;
        // A fence must never go back: a file that does not hold a number is an error, not a zero.
        let counted = match text.trim() {
            "" => 0,
            number => number
                .parse::<u64>()
                .map_err(|_| Error::Unavailable(format!("{shown} does not hold a fence number")))?,
        };
        let last = counted.max(last_of_slot);
        let fence = last.checked_add(1).ok_or_else(|| {
            Error::Unavailable(format!(
                "cannot number the acquisition: the last fence ({last}, in {shown} or the slot's file) is the largest there is, so no fence can follow it"
            ))
        })?;
        let text = fence.to_string();
        file.write_all_at(text.as_bytes(), 0)
            .and_then(|()| file.set_len(text.len() as u64))
            .map_err(failed)?;
        Ok(fence)
    }
}
