//! The probe (docs/backends/s3.md: "S3 backend"): some stores accept `If-None-Match` and
//! `If-Match` and ignore them, answering 200, and a lock there would be
//! granted twice. Before a run grants anything, and on `lockrun check`, two
//! PUTs on a probe object of its own (never a name's state) must both be
//! refused with 412: one `If-None-Match: *` over the existing object, one
//! `If-Match` with an ETag it never has. Two requests a run; a third the very
//! first time, to create the probe object.

use super::object::{Condition, Put};
use super::swap::Objects;
use crate::backend::net::{Deadline, Failure, Kind};
use crate::error::Result;

/// The probe object's name under the prefix (not a name's: no `.lock.json`).
const PROBE: &str = ".lockrun-probe";
/// An ETag no object has (an ETag is a quoted hex digest).
const NEVER_AN_ETAG: &str = "\"lockrun-probe-never-an-etag\"";

/// Checks that the store honours both conditional writes; what it found,
/// one line each, or 69 naming the problem.
pub fn refuse_unsafe(objects: &mut Objects, deadline: Deadline) -> Result<Vec<String>> {
    let client = &mut objects.client;
    let key = format!("{}{PROBE}", client.target().prefix);
    let shown = client.target().shown.clone();
    let body = b"lockrun checks here that this store honours conditional writes\n";
    let mut found = vec![format!("reachable: S3 bucket {shown}")];
    // The first run ever creates the object; a store that ignores the condition "creates" it again.
    let mut created = 0;
    loop {
        match client.put(&key, body, Condition::Create, deadline)? {
            Put::Written(_) if created == 0 => created += 1,
            Put::Written(_) => {
                return Err(ignored(&shown, "If-None-Match: * over an existing object").into());
            }
            Put::Lost => break,
            Put::Unknown(failure) => return Err(failure.into()),
        }
    }
    found.push("If-None-Match: * over an existing object: refused (412), as it must be".to_owned());
    match client.put(&key, body, Condition::Match(NEVER_AN_ETAG), deadline)? {
        Put::Lost => {}
        Put::Written(_) => {
            return Err(ignored(&shown, "If-Match with an ETag the object does not have").into());
        }
        Put::Unknown(failure) => return Err(failure.into()),
    }
    found.push("If-Match with a stale ETag: refused (412), as it must be".to_owned());
    found.push("conditional writes: honoured; safe to lock on".to_owned());
    Ok(found)
}

fn ignored(shown: &str, what: &str) -> Failure {
    Failure::new(
        Kind::Permanent,
        format!(
            "object store {shown} ignores conditional writes (a PUT with {what} succeeded): a lock there could be granted twice, so lockrun will not use it"
        ),
    )
}
