//! What the networked backends (Redis, PostgreSQL, etcd, S3) share about talking
//! to a lock server: how a failure is sorted (trouble to ride out, or a
//! verdict waiting cannot change), the deadline every call runs against, and
//! the secret that no message may show (docs/guide.md: "When the server has trouble").

mod deadline;
mod failure;
#[cfg(any(feature = "etcd", feature = "s3"))]
pub mod http;
pub mod probe;
mod secret;

pub use deadline::Deadline;
pub use failure::{Failure, Kind};
pub use secret::Secret;
