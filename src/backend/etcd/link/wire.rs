//! etcd's v3 messages as its JSON gateway spells them: proto3 JSON with the
//! proto's own field names, 64-bit integers as strings, bytes as base64, and
//! fields left out when they hold their zero value.

use base64::engine::general_purpose::STANDARD;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{AttemptError, not_etcd};

/// A key or value: base64 in JSON.
mod bytes {
    use super::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        STANDARD
            .decode(String::deserialize(deserializer)?)
            .map_err(D::Error::custom)
    }
}

/// An `int64`: a string in JSON (a number is accepted too).
mod int64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
    pub fn serialize<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Int64 {
            Number(i64),
            Text(String),
        }
        match Int64::deserialize(deserializer)? {
            Int64::Number(number) => Ok(number),
            Int64::Text(text) => text.parse().map_err(D::Error::custom),
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// A key, or every key from `key` up to `range_end` (exclusive).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Keys {
    #[serde(with = "bytes")]
    pub key: Vec<u8>,
    #[serde(with = "bytes", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
}

impl Keys {
    pub fn one(key: &[u8]) -> Self {
        Self {
            key: key.to_vec(),
            range_end: Vec::new(),
        }
    }

    /// Every key that starts with `prefix`: up to the prefix with its last
    /// byte below 0xff increased (`"\0"`, every key, when there is none).
    pub fn prefix(prefix: &[u8]) -> Self {
        let mut range_end = prefix.to_vec();
        while range_end.last() == Some(&0xff) {
            range_end.pop();
        }
        match range_end.last_mut() {
            Some(last) => *last += 1,
            None => range_end.push(0),
        }
        Self {
            key: prefix.to_vec(),
            range_end,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Header {
    #[serde(with = "int64", default)]
    pub revision: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct KeyValue {
    #[serde(with = "bytes", default)]
    pub key: Vec<u8>,
    #[serde(with = "bytes", default)]
    pub value: Vec<u8>,
    #[serde(with = "int64", default)]
    pub create_revision: i64,
    #[serde(with = "int64", default)]
    pub mod_revision: i64,
    #[serde(with = "int64", default)]
    pub lease: i64,
}

#[derive(Serialize)]
pub struct AuthenticateRequest<'a> {
    pub name: &'a str,
    pub password: &'a str,
}

#[derive(Deserialize)]
pub struct AuthenticateResponse {
    pub token: String,
}

/// `LeaseGrantRequest` (with `ID` 0: the server picks it), `LeaseRevokeRequest`,
/// `LeaseKeepAliveRequest` and `LeaseTimeToLiveRequest`: all a lease ID and a TTL.
#[derive(Serialize)]
pub struct LeaseRequest {
    #[serde(rename = "ID", with = "int64", skip_serializing_if = "is_zero")]
    pub id: i64,
    #[serde(rename = "TTL", with = "int64", skip_serializing_if = "is_zero")]
    pub ttl: i64,
}

/// The answer to a lease grant, keep-alive or time-to-live.
#[derive(Deserialize)]
pub struct LeaseResponse {
    #[serde(rename = "ID", with = "int64", default)]
    pub id: i64,
    /// Seconds left; 0 (keep-alive) or -1 (time-to-live) when the lease is gone.
    #[serde(rename = "TTL", with = "int64", default)]
    pub ttl: i64,
    /// Why a grant failed, when it did.
    #[serde(default)]
    pub error: String,
}

/// A range read oldest first: the order of etcd's create revisions is the waiting line's.
#[derive(Clone, Debug, Serialize)]
pub struct RangeRequest {
    #[serde(flatten)]
    pub keys: Keys,
    pub sort_order: &'static str,
    pub sort_target: &'static str,
    /// Only the keys created at this revision or before (0: every key).
    #[serde(with = "int64", skip_serializing_if = "is_zero")]
    pub max_create_revision: i64,
}

impl RangeRequest {
    pub fn oldest_first(keys: Keys) -> Self {
        Self {
            keys,
            sort_order: "ASCEND",
            sort_target: "CREATE",
            max_create_revision: 0,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct RangeResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PutRequest {
    #[serde(with = "bytes")]
    pub key: Vec<u8>,
    #[serde(with = "bytes")]
    pub value: Vec<u8>,
    #[serde(with = "int64", skip_serializing_if = "is_zero")]
    pub lease: i64,
}

/// A transaction's condition: `target` of the key, or of every key in the
/// range (a range without keys passes), `EQUAL` to a value.
#[derive(Clone, Debug, Serialize)]
pub struct Compare {
    #[serde(flatten)]
    pub keys: Keys,
    pub target: &'static str,
    pub result: &'static str,
    #[serde(flatten)]
    pub value: CompareValue,
}

/// The value compared with, named after its target.
#[derive(Clone, Debug, Serialize)]
pub enum CompareValue {
    #[serde(rename = "create_revision", with = "int64")]
    CreateRevision(i64),
    #[serde(rename = "lease", with = "int64")]
    GrantedLease(i64),
}

#[derive(Clone, Debug, Serialize)]
pub enum RequestOp {
    #[serde(rename = "request_put")]
    Put(PutRequest),
    #[serde(rename = "request_range")]
    Range(RangeRequest),
    #[serde(rename = "request_txn")]
    Txn(TxnRequest),
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Deserialize)]
pub struct TxnResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

/// One answer in a transaction; only ranges carry what we need.
#[derive(Deserialize)]
pub struct ResponseOp {
    pub response_range: Option<RangeResponse>,
}

#[derive(Serialize)]
pub struct WatchRequest {
    pub create_request: WatchCreateRequest,
}

#[derive(Serialize)]
pub struct WatchCreateRequest {
    #[serde(flatten)]
    pub keys: Keys,
    #[serde(with = "int64", skip_serializing_if = "is_zero")]
    pub start_revision: i64,
    /// Empty answers now and then while nothing happens (every ten minutes by
    /// default), so that an idle watch is not taken for a dead one by a proxy.
    pub progress_notify: bool,
    /// `NOPUT`: only deletes are sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<&'static str>,
}

#[derive(Debug, Default, Deserialize)]
pub struct WatchResponse {
    /// On the message that confirms a watch, the store's revision then.
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub created: bool,
    #[serde(default)]
    pub canceled: bool,
    #[serde(with = "int64", default)]
    pub compact_revision: i64,
    #[serde(default)]
    pub cancel_reason: String,
    #[serde(default)]
    pub events: Vec<WatchEvent>,
}

#[derive(Debug, Deserialize)]
pub struct WatchEvent {
    /// `PUT` is the zero value, so it is left out.
    #[serde(rename = "type", default)]
    pub kind: EventKind,
    #[serde(default)]
    pub kv: KeyValue,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum EventKind {
    #[default]
    #[serde(rename = "PUT")]
    Put,
    #[serde(rename = "DELETE")]
    Delete,
}

/// One message of a streamed answer (keep-alive, watch): a result or an error.
#[derive(Deserialize)]
pub struct StreamMessage<T> {
    pub result: Option<T>,
    pub error: Option<Status>,
}

/// A gRPC status as the gateway reports it: `{"code", "message"}` for a call,
/// `{"grpc_code", "message"}` inside a stream.
#[derive(Debug, Deserialize)]
pub struct Status {
    #[serde(alias = "grpc_code", default)]
    pub code: i32,
    #[serde(default)]
    pub message: String,
}

/// The body of an answer that is not 200 OK.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum ErrorBody {
    Stream { error: Status },
    Call(Status),
}

impl ErrorBody {
    pub fn into_status(self) -> Status {
        match self {
            Self::Stream { error } | Self::Call(error) => error,
        }
    }
}

/// The body of a 200 OK answer.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, AttemptError> {
    serde_json::from_slice(body)
        .map_err(|err| AttemptError::Io(not_etcd(format!("an unexpected answer ({err})"))))
}

/// The first message of a streamed answer; an error in it is the member's answer.
pub fn decode_streamed<T: DeserializeOwned>(body: &[u8]) -> Result<T, AttemptError> {
    let first = body.split(|&byte| byte == b'\n').next().unwrap_or_default();
    let message: StreamMessage<T> = decode(first)?;
    match (message.result, message.error) {
        (_, Some(status)) => Err(AttemptError::Answer {
            code: status.code,
            message: status.message,
        }),
        (Some(result), None) => Ok(result),
        (None, None) => Err(AttemptError::Io(not_etcd("an empty stream message"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_the_last_key_with_it() {
        assert_eq!(Keys::prefix(b"/lockrun/a/").range_end, b"/lockrun/a0");
        assert_eq!(Keys::prefix(b"a\xff\xff").range_end, b"b");
        assert_eq!(Keys::prefix(b"\xff").range_end, b"\0");
    }

    #[test]
    fn int64_fields_are_strings_and_bytes_base64() {
        let request = RangeRequest::oldest_first(Keys::one(b"/k"));
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"key":"L2s=","sort_order":"ASCEND","sort_target":"CREATE"}"#
        );
        let bounded = RangeRequest {
            max_create_revision: 9,
            ..RangeRequest::oldest_first(Keys::one(b"/k"))
        };
        assert_eq!(
            serde_json::to_string(&bounded).unwrap(),
            r#"{"key":"L2s=","sort_order":"ASCEND","sort_target":"CREATE","max_create_revision":"9"}"#
        );
        let compare = Compare {
            keys: Keys::prefix(b"/k/"),
            target: "LEASE",
            result: "EQUAL",
            value: CompareValue::GrantedLease(7),
        };
        assert_eq!(
            serde_json::to_string(&compare).unwrap(),
            r#"{"key":"L2sv","range_end":"L2sw","target":"LEASE","result":"EQUAL","lease":"7"}"#
        );
        let kv: KeyValue =
            serde_json::from_str(r#"{"key":"L2s=","create_revision":"7","lease":12}"#).unwrap();
        assert_eq!(
            (kv.key.as_slice(), kv.create_revision, kv.lease),
            (&b"/k"[..], 7, 12)
        );
    }

    #[test]
    fn both_error_shapes_give_the_status() {
        let call: ErrorBody = serde_json::from_str(
            r#"{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}"#,
        )
        .unwrap();
        assert_eq!(call.into_status().code, 14);
        let stream: ErrorBody = serde_json::from_str(
            r#"{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token"}}"#,
        )
        .unwrap();
        let status = stream.into_status();
        assert_eq!(
            (status.code, status.message.as_str()),
            (16, "etcdserver: invalid auth token")
        );
    }
}
