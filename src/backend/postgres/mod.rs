//! Groundwork for the PostgreSQL backend: which server (`--postgres-url` and
//! libpq's defaults), a session whose every call has a deadline, TLS, failures
//! sorted by what lockrun does about them, and lockrun's schema.

pub mod connect;
pub mod failure;
mod resolve;
pub mod schema;
pub mod target;
mod tls;
