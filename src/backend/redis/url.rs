//! `--redis-url` read into how Redis is deployed (docs/backends/redis.md: "Redis as
//! deployed"): one server, the Sentinels that name a primary, or a Cluster's
//! seed nodes; with the URL as messages may show it and the password that no
//! message may repeat.

use percent_encoding::percent_decode_str;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::backend::net::{Failure, Kind, Secret};

/// Where the primary for a key is found.
pub enum Deployment {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Single(ConnectionInfo),
    /// The Sentinels that know the primary named `primary` (`redis+sentinel://`).
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        primary: String,
        nodes: Nodes,
    },
    /// A Redis Cluster, found from its seed nodes (`redis+cluster://`).
    Cluster {
        seeds: Vec<ConnectionInfo>,
        nodes: Nodes,
    },
}

/// How lockrun connects to a data node that Sentinel or the Cluster names by address.
#[derive(Clone)]
pub struct Nodes {
    tls: bool,
    settings: RedisConnectionInfo,
}

impl Nodes {
    pub fn at(&self, host: &str, port: u16) -> ConnectionInfo {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        info(addr, self.settings.clone())
    }
}

/// `--redis-url` read.
pub struct RedisTarget {
    pub deployment: Deployment,
    /// The URL with its password replaced, for messages.
    pub shown: String,
    /// The password, so that no message built from a server or library error can repeat it.
    pub secret: Option<Secret>,
}

const FORMS: &str = "expected redis://[user:pass@]host:port[/db], rediss://..., redis+unix:///path, \
                     redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or \
                     redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]";

impl RedisTarget {
    pub fn parse(url: &str) -> Result<Self, Failure> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let tls = match scheme {
            "redis+sentinel" | "redis+cluster" => false,
            "rediss+sentinel" | "rediss+cluster" => true,
            _ => return Self::single(url),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, hosts) = authority.rsplit_once('@').unwrap_or(("", authority));
        let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
        let password = decode(password);
        let secret = (!password.is_empty()).then(|| Secret::new(password.clone()));
        let shown = if secret.is_some() {
            format!("{scheme}://{user}:***@{hosts}/{path}")
        } else {
            url.to_owned()
        };
        let invalid = |why: &str| {
            Failure::new(
                Kind::Permanent,
                format!("--redis-url {shown} is not a usable Redis URL ({why}); {FORMS}"),
            )
        };
        let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
        if !user.is_empty() {
            settings = settings.set_username(decode(user));
        }
        if !password.is_empty() {
            settings = settings.set_password(&password);
        }
        let addresses = hosts
            .split(',')
            .map(|host| {
                let (host, port) = host.rsplit_once(':').ok_or("a host without a port")?;
                let port = port
                    .parse::<u16>()
                    .map_err(|_| "a port that is not a number")?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err("an empty host");
                }
                Ok((host.to_owned(), port))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let nodes = Nodes { tls, settings };
        let seeds = addresses
            .iter()
            .map(|(host, port)| nodes.at(host, *port))
            .collect();
        let deployment = if scheme.ends_with("sentinel") {
            let mut parts = path.split('/');
            let primary = decode(parts.next().unwrap_or_default());
            if primary.is_empty() {
                return Err(invalid("no primary name after the Sentinels"));
            }
            let db = match parts.next().filter(|db| !db.is_empty()) {
                Some(db) => db
                    .parse()
                    .map_err(|_| invalid("a database that is not a number"))?,
                None => 0,
            };
            if parts.next().is_some() {
                return Err(invalid("more than PRIMARY/db after the Sentinels"));
            }
            let nodes = Nodes {
                tls,
                settings: nodes.settings.set_db(db),
            };
            Deployment::Sentinel {
                sentinels: seeds,
                primary,
                nodes,
            }
        } else {
            if !path.is_empty() {
                return Err(invalid("a Cluster has no database or name after its nodes"));
            }
            Deployment::Cluster { seeds, nodes }
        };
        Ok(Self {
            deployment,
            shown,
            secret,
        })
    }

    fn single(url: &str) -> Result<Self, Failure> {
        let shown = redact(url);
        let invalid = |why: String| {
            Failure::new(
                Kind::Permanent,
                format!("--redis-url {shown} is not a usable Redis URL ({why}); {FORMS}"),
            )
        };
        let parsed =
            redis::parse_redis_url(url).ok_or_else(|| invalid("cannot parse it".into()))?;
        let secret = parsed
            .password()
            .map(str::to_owned)
            .or_else(|| {
                parsed
                    .query_pairs()
                    .find(|(key, _)| key == "pass")
                    .map(|(_, value)| value.into_owned())
            })
            .filter(|secret| !secret.is_empty())
            .map(Secret::new);
        let info = parsed
            .into_connection_info()
            .map_err(|err| invalid(Secret::scrub_with(secret.as_ref(), &err.to_string())))?;
        // CLIENT SETINFO would cost a round trip on every connect.
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        Ok(Self {
            deployment: Deployment::Single(info.set_redis_settings(settings)),
            shown,
            secret,
        })
    }
}

fn info(addr: ConnectionAddr, settings: RedisConnectionInfo) -> ConnectionInfo {
    addr.into_connection_info()
        .expect("an address is always connection info")
        .set_redis_settings(settings)
}

fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// `url` with any password (`user:pass@` or `?pass=`) replaced by `***`.
fn redact(url: &str) -> String {
    let Some(mut parsed) = redis::parse_redis_url(url) else {
        // Unparsable: show only the scheme, since the rest may hold a password.
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        return format!("{scheme}://...");
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query_pairs().any(|(key, _)| key == "pass") {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let value = if key == "pass" {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string().replace("%2A%2A%2A", "***")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_in_every_url_form() {
        assert_eq!(
            redact("redis://user:s3cret@example.com:6380/2"),
            "redis://user:***@example.com:6380/2"
        );
        assert_eq!(redact("rediss://:s3cret@h"), "rediss://:***@h");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("http://user:s3cret@x"), "http://...");
        assert!(!redact("not a url s3cret").contains("s3cret"));
        let target = RedisTarget::parse("redis+sentinel://u:s3cret@a:1,b:2/main").unwrap();
        assert_eq!(target.shown, "redis+sentinel://u:***@a:1,b:2/main");
    }

    #[test]
    fn a_bad_url_is_unavailable_at_once_without_the_secret() {
        for url in [
            "redis://:s3cret@host:notaport",
            "redis+sentinel://:s3cret@a:1",
            "redis+sentinel://:s3cret@a/main",
            "redis+cluster://:s3cret@a:1/2",
            "redis+sentinel://u:s3cret@a:1/main/x",
        ] {
            let Err(err) = RedisTarget::parse(url) else {
                panic!("accepted {url}");
            };
            assert_eq!(err.kind(), Kind::Permanent);
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn sentinels_name_a_primary_and_a_database() {
        let target = RedisTarget::parse("rediss+sentinel://u:p%40ss@a:1,[::1]:2/main/3").unwrap();
        let Deployment::Sentinel {
            sentinels,
            primary,
            nodes,
        } = target.deployment
        else {
            panic!("not Sentinel");
        };
        assert_eq!(primary, "main");
        assert_eq!(sentinels.len(), 2);
        assert_eq!(sentinels[1].redis_settings().password(), Some("p@ss"));
        let primary = nodes.at("10.0.0.1", 7);
        assert_eq!(primary.redis_settings().db(), 3);
        assert!(matches!(primary.addr(), ConnectionAddr::TcpTls { .. }));
    }
}
