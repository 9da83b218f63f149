//! All integration tests in one binary, so a 2-core machine links once.

mod support;

mod admission;
mod bounded;
mod cli;
mod clocks;
mod core;
mod docs;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_client;
mod faults;
mod file;
mod fleet;
mod formats;
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
mod recipes;
mod redis;
mod redis_deployed;
#[cfg(feature = "s3")]
mod s3;
mod sessions;
mod source;
mod sqlite;
mod stress;
mod supervision;
mod terminal;
mod trouble;
