//! Redis Cluster (docs/backends/redis.md: "Redis as deployed"): which primary serves a key,
//! from the slot map (`CLUSTER SLOTS`, asked of the seed nodes) and the hash
//! slot of the key's `{tag}`; a `MOVED` answer corrects the map, an `ASK`
//! sends the next call to the node that is taking the slot; every primary,
//! for what reads all names.

use std::collections::HashMap;

use redis::{ConnectionInfo, RedisError, Value};

use super::node::{Node, sort};
use super::url::Nodes;
use crate::backend::net::{Deadline, Failure, Kind};

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

pub struct Cluster {
    seeds: Vec<(String, Node)>,
    nodes: Nodes,
    /// Connections to the primaries, by `host:port`.
    primaries: HashMap<String, Node>,
    /// Slot ranges (first, last) and the primary that serves each; empty until asked.
    map: Vec<(u16, u16, String)>,
    /// Where the next call goes, after an `ASK`.
    asking: Option<String>,
}

impl Cluster {
    pub fn new(seeds: Vec<ConnectionInfo>, nodes: Nodes) -> Self {
        Self {
            seeds: seeds
                .into_iter()
                .map(|info| (info.addr().to_string(), Node::new(info)))
                .collect(),
            nodes,
            primaries: HashMap::new(),
            map: Vec::new(),
            asking: None,
        }
    }

    /// The node `key` lives on, and whether the call must be preceded by `ASKING`.
    pub fn node_for(
        &mut self,
        key: &str,
        deadline: Deadline,
    ) -> Result<(&mut Node, bool), Failure> {
        if let Some(address) = self.asking.take() {
            return Ok((self.primary(&address), true));
        }
        self.load_map(deadline)?;
        let slot = slot_of(key);
        let address = self
            .map
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, address)| address.clone())
            .ok_or_else(|| {
                Failure::new(
                    Kind::Transient,
                    format!("no node of the Cluster serves hash slot {slot}"),
                )
            })?;
        Ok((self.primary(&address), false))
    }

    /// The address of every primary.
    pub fn primaries(&mut self, deadline: Deadline) -> Result<Vec<String>, Failure> {
        self.load_map(deadline)?;
        let mut addresses: Vec<String> = self.map.iter().map(|(_, _, a)| a.clone()).collect();
        addresses.sort();
        addresses.dedup();
        Ok(addresses)
    }

    /// The connection to the primary at `address` (`host:port`).
    pub fn primary(&mut self, address: &str) -> &mut Node {
        let nodes = &self.nodes;
        self.primaries.entry(address.to_owned()).or_insert_with(|| {
            let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
            Node::new(nodes.at(host, port.parse().unwrap_or(6379)))
        })
    }

    /// Takes what a failed call said about the Cluster: true when the call
    /// should be made again at once (a `MOVED` or `ASK` named the node).
    pub fn learn(&mut self, err: &RedisError) -> bool {
        if let Some((address, slot)) = err.redirect_node() {
            if err.code() == Some("ASK") {
                self.asking = Some(address.to_owned());
            } else {
                // Looked up first: it outranks the range the slot was in.
                self.map.insert(0, (slot, slot, address.to_owned()));
            }
            return true;
        }
        // A failover or a node gone: the map is asked for again on the next call.
        self.map.clear();
        false
    }

    fn load_map(&mut self, deadline: Deadline) -> Result<(), Failure> {
        if !self.map.is_empty() {
            return Ok(());
        }
        let count = self.seeds.len();
        let mut trouble = Vec::new();
        for (asked, (address, seed)) in self.seeds.iter_mut().enumerate() {
            let within = deadline.share((count - asked) as u32);
            match seed.call(within, |c| {
                redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(c)
            }) {
                Ok(slots) => {
                    self.map = parse_slots(&slots);
                    if self.map.is_empty() {
                        trouble.push(format!("{address}: no slots served"));
                        continue;
                    }
                    return Ok(());
                }
                Err(err) => {
                    let (kind, why) = sort(&err);
                    if kind == Kind::Permanent {
                        return Err(Failure::new(kind, format!("{address}: {why}")));
                    }
                    trouble.push(format!("{address}: {why}"));
                }
            }
        }
        Err(Failure::new(
            Kind::Unreachable,
            format!(
                "no node of the Cluster gave its slots: {}",
                trouble.join("; ")
            ),
        ))
    }
}

/// `CLUSTER SLOTS`: `[[first, last, [host, port, ...], replicas...], ...]`.
fn parse_slots(reply: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Value::Int(first), Value::Int(last), Value::Array(primary)) =
                (fields.first()?, fields.get(1)?, fields.get(2)?)
            else {
                return None;
            };
            let (Value::BulkString(host), Value::Int(port)) = (primary.first()?, primary.get(1)?)
            else {
                return None;
            };
            let host = String::from_utf8_lossy(host);
            Some((*first as u16, *last as u16, format!("{host}:{port}")))
        })
        .collect()
}

/// The hash slot of `key`: of its `{tag}` when it has a non-empty one.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    crc16(tagged) % SLOTS
}

/// CRC-16/XMODEM, Redis Cluster's key hash.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_as_redis_cluster_hashes_them() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of("lockrun:{a}:line"), slot_of("lockrun:{a}:wake:t"));
    }
}
