//! The Redis, PostgreSQL, etcd and S3 (SeaweedFS) servers the networked backends are measured on, started
//! through the tests' harness, and the work each one reports.

use std::collections::BTreeMap;
use std::ffi::OsString;

use crate::Bench;
use crate::lockers::{Locker, available};
use crate::support::RedisServer;
#[cfg(feature = "etcd")]
use crate::support::etcd::EtcdServer;
#[cfg(feature = "postgres")]
use crate::support::postgres::PostgresServer;
#[cfg(feature = "s3")]
use crate::support::s3::{BUCKET, SeaweedServer};

/// A server of the benchmark's own, started by the tests' harness (tests/support):
/// free loopback ports, data in temporary directories, cleaned up on drop.
pub(crate) enum Server {
    Redis(RedisServer),
    #[cfg(feature = "postgres")]
    Postgres(PostgresServer),
    #[cfg(feature = "etcd")]
    Etcd(EtcdServer),
    #[cfg(feature = "s3")]
    S3(SeaweedServer),
}

impl Server {
    /// A lockrun on this server, if it answers.
    pub(crate) fn locker(
        self,
        lockrun: impl Fn(&'static str, &str, OsString) -> Locker,
    ) -> Result<Networked, String> {
        let locker = match &self {
            Self::Redis(server) => lockrun("redis", "--redis-url", server.url().into()),
            #[cfg(feature = "postgres")]
            Self::Postgres(server) => lockrun("postgres", "--postgres-url", server.url().into()),
            #[cfg(feature = "etcd")]
            Self::Etcd(server) => lockrun("etcd", "--etcd-endpoints", server.url().into()),
            #[cfg(feature = "s3")]
            Self::S3(server) => {
                let mut locker = lockrun("s3", "--s3-url", format!("s3://{BUCKET}/bench").into());
                if let Locker::Lockrun { flags, .. } = &mut locker {
                    flags.extend(["--s3-endpoint".into(), server.endpoint.clone().into()]);
                }
                locker
            }
        };
        Ok(Networked {
            locker: available(locker)?,
            server: self,
        })
    }

    /// The work the server has done so far, by kind: Redis's commands, etcd's
    /// calls (gRPC, from its metrics), PostgreSQL's transactions (counted when a
    /// session ends: lockrun's have ended when this is read), S3 requests (from
    /// SeaweedFS's metrics); see tests/support.
    pub(crate) fn work(&self) -> BTreeMap<String, u64> {
        match self {
            Self::Redis(server) => server.command_calls(),
            #[cfg(feature = "postgres")]
            Self::Postgres(server) => {
                BTreeMap::from([("transactions".to_owned(), server.transactions())])
            }
            #[cfg(feature = "etcd")]
            Self::Etcd(server) => server.calls(),
            #[cfg(feature = "s3")]
            Self::S3(server) => server.requests(),
        }
    }
}

/// What [`Server::work`] counts on `backend`'s server.
pub(crate) fn work_unit(backend: &str) -> &'static str {
    match backend {
        "redis" => "Redis commands (INFO commandstats, scripts' own included)",
        // Counted when a session reports them: at its end, or at most once a second.
        "postgres" => "PostgreSQL transactions",
        "etcd" => "etcd calls",
        "s3" => "S3 requests",
        _ => "",
    }
}

/// The lockrun of a networked backend, or why there is none.
pub(crate) fn locker(networked: &Result<Networked, String>) -> Result<Locker, String> {
    networked
        .as_ref()
        .map(|networked| networked.locker.clone())
        .map_err(Clone::clone)
}

/// A networked backend's lockrun and the server it runs on.
pub(crate) struct Networked {
    pub(crate) locker: Locker,
    pub(crate) server: Server,
}

impl Bench {
    /// The work the server of `locker`'s backend has done so far (see [`Server::work`]).
    pub(crate) fn server_work(&self, locker: &Locker) -> Option<u64> {
        let Locker::Lockrun { backend, .. } = locker else {
            return None;
        };
        let networked = match *backend {
            "redis" => &self.redis,
            "postgres" => &self.postgres,
            "etcd" => &self.etcd,
            "s3" => &self.s3,
            _ => return None,
        };
        Some(networked.as_ref().ok()?.server.work().values().sum())
    }
}
