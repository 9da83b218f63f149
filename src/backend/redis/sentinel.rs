//! The primary as Redis Sentinel names it (docs/backends/redis.md: "Redis as deployed"): the
//! Sentinels are asked in turn (`SENTINEL get-master-addr-by-name`), the one
//! that answered last first, and a node they name counts only once it says
//! itself that it is the primary (`ROLE`), as Sentinel's client guidelines
//! ask. A Sentinel that does not answer, or names a node that is not the
//! primary (yet), is trouble that passes with the failover; only Sentinels
//! that all answer that they know no such primary are a mistake.

use redis::{ConnectionInfo, Value};

use super::node::{Node, sort};
use super::url::Nodes;
use crate::backend::net::{Deadline, Failure, Kind};

/// The primary a Sentinel named and that confirmed it.
pub struct Primary {
    /// `HOST:PORT` as the Sentinel named it.
    pub address: String,
    pub node: Node,
    /// How many replicas it had when it confirmed (`ROLE`).
    pub replicas: u32,
}

pub struct Sentinels {
    /// Each Sentinel's address and connection.
    asked: Vec<(String, Node)>,
    primary: String,
    nodes: Nodes,
    /// The Sentinel that answered last: asked first next time.
    first: usize,
}

impl Sentinels {
    pub fn new(sentinels: Vec<ConnectionInfo>, primary: String, nodes: Nodes) -> Self {
        Self {
            asked: sentinels
                .into_iter()
                .map(|info| (info.addr().to_string(), Node::new(info)))
                .collect(),
            primary,
            nodes,
            first: 0,
        }
    }

    /// The primary, connected, as a Sentinel names it and it confirms, before `deadline`.
    pub fn primary(&mut self, deadline: Deadline) -> Result<Primary, Failure> {
        let count = self.asked.len();
        let mut unknown = 0;
        let mut trouble = Vec::new();
        for asked in 0..count {
            let at = (self.first + asked) % count;
            let within = deadline.share((count - asked) as u32);
            let (address, sentinel) = &mut self.asked[at];
            let named: Option<(String, u16)> = match sentinel.call(within, |c| {
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.primary)
                    .query(c)
            }) {
                Ok(named) => named,
                Err(err) => {
                    let (kind, why) = sort(&err);
                    // A refused password will not pass; a Sentinel that is down may.
                    if kind == Kind::Permanent {
                        return Err(Failure::new(kind, format!("Sentinel {address}: {why}")));
                    }
                    trouble.push(format!("Sentinel {address}: {why}"));
                    continue;
                }
            };
            let Some((host, port)) = named else {
                unknown += 1;
                continue;
            };
            let mut node = Node::new(self.nodes.at(&host, port));
            let role = node.call(within, |c| redis::cmd("ROLE").query::<Value>(c));
            match role.as_ref().map(primary_replicas) {
                Ok(Some(replicas)) => {
                    self.first = at;
                    return Ok(Primary {
                        address: format!("{host}:{port}"),
                        node,
                        replicas,
                    });
                }
                Ok(None) => trouble.push(format!(
                    "Sentinel {address} names {host}:{port}, which is not the primary (yet)"
                )),
                Err(err) => {
                    let (kind, why) = sort(err);
                    if kind == Kind::Permanent {
                        return Err(Failure::new(kind, format!("{host}:{port}: {why}")));
                    }
                    trouble.push(format!(
                        "Sentinel {address} names {host}:{port}, which gave no answer: {why}"
                    ));
                }
            }
        }
        if unknown == count {
            return Err(Failure::new(
                Kind::Permanent,
                format!("no Sentinel knows a primary named {}", self.primary),
            ));
        }
        Err(Failure::new(
            Kind::Unreachable,
            format!("no primary found: {}", trouble.join("; ")),
        ))
    }
}

/// How many replicas a `ROLE` reply that says "master" lists; `None` for another role.
fn primary_replicas(role: &Value) -> Option<u32> {
    let Value::Array(fields) = role else {
        return None;
    };
    if !matches!(fields.first(), Some(Value::BulkString(role)) if role == b"master") {
        return None;
    }
    match fields.get(2) {
        Some(Value::Array(replicas)) => Some(u32::try_from(replicas.len()).unwrap_or(u32::MAX)),
        _ => Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(word: &str) -> Value {
        Value::BulkString(word.as_bytes().to_vec())
    }

    #[test]
    fn a_primary_counts_the_replicas_its_role_lists() {
        let replica = || Value::Array(vec![text("127.0.0.1"), text("6380"), text("42")]);
        let primary = Value::Array(vec![
            text("master"),
            Value::Int(42),
            Value::Array(vec![replica(), replica()]),
        ]);
        assert_eq!(primary_replicas(&primary), Some(2));
        let alone = Value::Array(vec![text("master"), Value::Int(0), Value::Array(vec![])]);
        assert_eq!(primary_replicas(&alone), Some(0));
        let demoted = Value::Array(vec![text("slave"), text("127.0.0.1"), Value::Int(6379)]);
        assert_eq!(primary_replicas(&demoted), None);
    }
}
