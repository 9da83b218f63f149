//! Groundwork for the PostgreSQL backend: which server (`--postgres-url` and
//! libpq's defaults), a session whose every call has a deadline, TLS, and
//! failures sorted by what lockrun does about them.

pub mod connect;
pub mod failure;
pub mod target;
mod tls;
