//! All integration tests in one binary, so a 2-core machine links once.

mod support;

mod bounded;
mod cli;
mod core;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_client;
mod faults;
mod file;
mod fleet;
mod generated;
mod line;
mod modes;
mod neighbours;
mod operator;
mod partition;
#[cfg(feature = "postgres")]
mod pgbouncer;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod postgres_runs;
mod redis;
mod redis_deployed;
mod sessions;
mod source;
mod sqlite;
mod stress;
mod supervision;
mod terminal;
mod trouble;
