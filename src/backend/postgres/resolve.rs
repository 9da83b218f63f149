//! Host names turned into addresses by lockrun itself, on the calling thread,
//! with the C library's getaddrinfo (std's `ToSocketAddrs`). tokio-postgres
//! would look a name up in tokio's blocking pool, a thread that lingers, and
//! lockrun must stay one thread (ARCHITECTURE.md: "Design"): it is handed addresses,
//! and the name only for TLS to check the certificate against.
//!
//! getaddrinfo has no deadline of lockrun's: the resolver's own timeouts
//! (`options timeout:` in resolv.conf) bound it. A name is looked up at every
//! connection, so that a reconnect follows a failover that moved the name.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;

use super::target::{Host, Target};
use crate::backend::net::Failure;

/// One place to try to connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// An address of the host `name` (the name as given, for TLS).
    Tcp {
        name: String,
        address: IpAddr,
        port: u16,
    },
    /// The server's socket in this directory.
    Socket { dir: PathBuf, port: u16 },
}

/// Where to try to connect, in order: each of the target's hosts in turn,
/// a host name's addresses in the order getaddrinfo gives them. A name that
/// cannot be resolved stands as its failure, so that the others are still tried.
pub fn endpoints(target: &Target) -> Vec<Result<Address, Failure>> {
    let mut endpoints = Vec::new();
    for (index, host) in target.hosts.iter().enumerate() {
        let port = target.port(index);
        match host {
            Host::Socket(dir) => endpoints.push(Ok(Address::Socket {
                dir: dir.clone(),
                port,
            })),
            Host::Tcp(name) => match (name.as_str(), port).to_socket_addrs() {
                Ok(addresses) => endpoints.extend(addresses.map(|address| {
                    Ok(Address::Tcp {
                        name: name.clone(),
                        address: address.ip(),
                        port,
                    })
                })),
                Err(err) => endpoints.push(Err(Failure::new(
                    // A name that does not exist is permanent, a resolver's hiccup not.
                    Failure::from_io(&err).kind(),
                    target.scrub(&format!(
                        "PostgreSQL at {target}: connect failed: cannot resolve {name}: {err}"
                    )),
                ))),
            },
        }
    }
    endpoints
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::net::Kind;

    fn target(spec: &str) -> Target {
        Target::parse_with(spec, &|_| None, &|| Some("u".into())).unwrap()
    }

    #[test]
    fn names_become_addresses_that_keep_the_name() {
        let endpoints = endpoints(&target("host=localhost,127.0.0.2,/run/pg port=7,8,9"));
        let endpoints: Vec<Address> = endpoints.into_iter().map(Result::unwrap).collect();
        let (sockets, tcp): (Vec<_>, Vec<_>) = endpoints
            .iter()
            .partition(|endpoint| matches!(endpoint, Address::Socket { .. }));
        assert!(
            tcp.iter().any(
                |endpoint| matches!(endpoint, Address::Tcp { name, address, port: 7 }
                if name == "localhost" && address.is_loopback())
            ),
            "{endpoints:?}"
        );
        assert_eq!(
            endpoints[endpoints.len() - 2..],
            [
                Address::Tcp {
                    name: "127.0.0.2".into(),
                    address: "127.0.0.2".parse().unwrap(),
                    port: 8
                },
                Address::Socket {
                    dir: "/run/pg".into(),
                    port: 9
                }
            ]
        );
        assert_eq!(sockets.len(), 1);
    }

    #[test]
    fn a_name_that_does_not_exist_is_permanent() {
        let endpoints = endpoints(&target(
            "host=no-such-host.invalid,127.0.0.1 password=s3cret",
        ));
        let failure = endpoints[0].clone().unwrap_err();
        assert_eq!(failure.kind(), Kind::Permanent);
        assert!(
            failure
                .to_string()
                .contains("cannot resolve no-such-host.invalid"),
            "{failure}"
        );
        assert!(!failure.to_string().contains("s3cret"), "{failure}");
        assert!(endpoints[1].is_ok());
    }
}
