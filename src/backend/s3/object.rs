//! GET and conditional PUT of one object, signed by rusty-s3 (`SigV4`, as a
//! presigned URL whose signature also covers the conditional headers) and
//! sent over the shared HTTP/1.1 client, under a deadline. A presigned URL
//! carries a signature: it is never shown. What S3 answers is sorted here:
//! a lost swap (412, 409, and 404 for `If-Match` on a missing key, where
//! SeaweedFS and Ceph answer 412), trouble that may pass (5xx, 503 SlowDown,
//! 429), a verdict (403, a missing bucket, a store that cannot do
//! conditional writes), and a write whose outcome is unknown.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rusty_s3::S3Action;

use super::credentials::{self, Credentials, Vars};
use super::target::Target;
use crate::backend::net::http::{self, Connection};
use crate::backend::net::{Deadline, Failure, Kind};
use crate::platform::clock::Moment;

/// How long a presigned request stays valid: it is sent at once.
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// How often issued credentials are fetched again (they last 15 minutes at the least).
const REFETCH: Duration = Duration::from_secs(5 * 60);
/// How long a call waits for the issuer when fetching them again: the
/// credentials in hand still hold, and the call has its own work to do.
const REFETCH_PATIENCE: Duration = Duration::from_secs(1);
/// When the issuer did not answer, how long until it is asked again.
const REFETCH_RETRY: Duration = Duration::from_secs(30);
/// The longest object read: a state document of many waiters, or a listing page.
const MAX_OBJECT: usize = 8 * 1024 * 1024;

/// What a GET found.
pub enum Got {
    /// The object is as we last saw it (`If-None-Match` answered 304).
    Unchanged,
    Missing,
    Found {
        etag: String,
        body: Vec<u8>,
    },
}

/// The condition of a PUT.
#[derive(Clone, Copy)]
pub enum Condition<'a> {
    /// `If-None-Match: *`: only if the key is free.
    Create,
    /// `If-Match: ETAG`: only if the object is still this one.
    Match(&'a str),
}

/// What a conditional PUT did.
pub enum Put {
    /// Written; the new object's ETag, where the store sent it.
    Written(Option<String>),
    /// The condition failed: someone else wrote first.
    Lost,
    /// The request may or may not have been applied (a timeout, a 5xx, a
    /// connection cut after sending): read the object back to know.
    Unknown(Failure),
}

/// One bucket's client: a connection kept between calls.
pub struct ObjectClient {
    target: Target,
    credentials: Credentials,
    /// The variables the credentials were found with, to find them again.
    vars: Vars,
    /// When issued credentials are next fetched again.
    refetch_at: Moment,
    region: String,
    signing: rusty_s3::Credentials,
    tls: Option<Arc<ClientConfig>>,
    connection: Option<Connection>,
}

/// An answer's status and body.
struct Answer {
    status: u16,
    etag: Option<String>,
    body: Vec<u8>,
}

/// Where a failed exchange broke off.
enum Broke {
    /// Before the request was sent: nothing was done.
    Unsent(Failure),
    /// After it was (maybe partly) sent: a write may have been made.
    Sent(Failure),
}

impl ObjectClient {
    pub fn new(target: Target, credentials: Credentials, vars: Vars, region: String) -> Self {
        Self {
            signing: credentials.signing(),
            target,
            credentials,
            vars,
            refetch_at: Moment::now() + REFETCH,
            region,
            tls: None,
            connection: None,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Issued credentials last for a while (an hour, often): fetched again
    /// well before, the old ones kept should the issuer not answer, within a
    /// small part of the call's time, and asked again a little later.
    fn refetch_credentials(&mut self, deadline: Deadline) {
        if !self.credentials.issued || !self.refetch_at.has_passed() {
            return;
        }
        let env = |name: &str| self.vars.get(name);
        let patience = deadline.within(REFETCH_PATIENCE);
        match credentials::find(&env, &self.region, patience) {
            Ok(credentials) => {
                self.signing = credentials.signing();
                self.credentials = credentials;
                self.refetch_at = Moment::now() + REFETCH;
            }
            Err(_) => self.refetch_at = Moment::now() + REFETCH_RETRY,
        }
    }

    /// GETs `key`; with `known` (an ETag) answers `Unchanged` when it still is.
    pub fn get(
        &mut self,
        key: &str,
        known: Option<&str>,
        deadline: Deadline,
    ) -> Result<Got, Failure> {
        self.refetch_credentials(deadline);
        let mut action = self.target.bucket.get_object(Some(&self.signing), key);
        if let Some(etag) = known {
            action
                .headers_mut()
                .insert("if-none-match", etag.to_owned());
        }
        let headers: Vec<(String, String)> = header_list(action.headers_mut());
        let url = action.sign(SIGNED_FOR);
        let answer = self
            .exchange("GET", &url, &headers, &[], deadline)
            .map_err(|broke| match broke {
                Broke::Unsent(failure) | Broke::Sent(failure) => failure,
            })?;
        match answer.status {
            200 => Ok(Got::Found {
                etag: answer.etag.ok_or_else(|| {
                    Failure::new(
                        Kind::Permanent,
                        "the object store sent an object without an ETag",
                    )
                })?,
                body: answer.body,
            }),
            304 => Ok(Got::Unchanged),
            404 if error_code(&answer.body) != "NoSuchBucket" => Ok(Got::Missing),
            _ => Err(self.refused(&answer)),
        }
    }

    /// PUTs `body` at `key` if `condition` holds.
    pub fn put(
        &mut self,
        key: &str,
        body: &[u8],
        condition: Condition,
        deadline: Deadline,
    ) -> Result<Put, Failure> {
        self.refetch_credentials(deadline);
        let mut action = self.target.bucket.put_object(Some(&self.signing), key);
        // Buckets with Object Lock refuse a write without it; any store checks the body by it.
        action
            .headers_mut()
            .insert("content-md5", content_md5(body));
        match condition {
            Condition::Create => action.headers_mut().insert("if-none-match", "*"),
            Condition::Match(etag) => action.headers_mut().insert("if-match", etag.to_owned()),
        }
        let headers = header_list(action.headers_mut());
        let url = action.sign(SIGNED_FOR);
        let answer = match self.exchange("PUT", &url, &headers, body, deadline) {
            Ok(answer) => answer,
            Err(Broke::Unsent(failure)) => return Err(failure),
            Err(Broke::Sent(failure)) => return Ok(Put::Unknown(failure)),
        };
        match answer.status {
            200..=299 => Ok(Put::Written(answer.etag)),
            // 404: AWS's answer to If-Match on a missing key (NoSuchKey).
            412 | 409 => Ok(Put::Lost),
            404 if error_code(&answer.body) != "NoSuchBucket" => Ok(Put::Lost),
            500..=599 if answer.status != 501 => Ok(Put::Unknown(self.refused(&answer))),
            _ => Err(self.refused(&answer)),
        }
    }

    /// The keys under `prefix` (ListObjectsV2, one page, from the
    /// continuation token `from` of the page before): a signed GET of the
    /// bucket with the listing's query.
    pub fn list(
        &mut self,
        prefix: &str,
        from: Option<&str>,
        deadline: Deadline,
    ) -> Result<Page, Failure> {
        let mut action = self.target.bucket.get_object(Some(&self.signing), "");
        action.query_mut().insert("list-type", "2");
        action.query_mut().insert("prefix", prefix.to_owned());
        if let Some(from) = from {
            action
                .query_mut()
                .insert("continuation-token", from.to_owned());
        }
        let url = action.sign(SIGNED_FOR);
        let answer =
            self.exchange("GET", &url, &[], &[], deadline)
                .map_err(|broke| match broke {
                    Broke::Unsent(failure) | Broke::Sent(failure) => failure,
                })?;
        if answer.status != 200 {
            return Err(self.refused(&answer));
        }
        page(&String::from_utf8_lossy(&answer.body)).ok_or_else(|| {
            Failure::new(
                Kind::Permanent,
                format!(
                    "{}: a listing page said more follow but not where (no NextContinuationToken)",
                    self.target.shown
                ),
            )
        })
    }

    /// Sends one request, on the kept connection when there is one (once more
    /// on a new one if a kept connection turns out closed before any answer).
    fn exchange(
        &mut self,
        method: &str,
        url: &url::Url,
        headers: &[(String, String)],
        body: &[u8],
        deadline: Deadline,
    ) -> Result<Answer, Broke> {
        let target = http::target_of(url);
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let reused = self.connection.is_some();
        match self.exchange_once(method, &target, &headers, body, deadline) {
            // A kept connection the server closed meanwhile: a GET changes
            // nothing, so it goes again on a new one (a PUT is read back instead).
            Err(Broke::Sent(_)) if reused && method == "GET" => {
                self.exchange_once(method, &target, &headers, body, deadline)
            }
            other => other,
        }
    }

    fn exchange_once(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        deadline: Deadline,
    ) -> Result<Answer, Broke> {
        let mut connection = match self.connection.take() {
            Some(connection) => connection,
            None => self
                .open(deadline)
                .map_err(|err| Broke::Unsent(self.io_failure(&err)))?,
        };
        let sent = connection
            .send(method, target, headers, body, deadline)
            .and_then(|status| {
                let etag = connection.etag().map(str::to_owned);
                let body = connection.read_up_to(MAX_OBJECT, deadline)?;
                Ok(Answer { status, etag, body })
            });
        match sent {
            Ok(answer) => {
                if connection.reusable() {
                    self.connection = Some(connection);
                }
                Ok(answer)
            }
            Err(err) => Err(Broke::Sent(self.io_failure(&err))),
        }
    }

    fn open(&mut self, deadline: Deadline) -> io::Result<Connection> {
        let tls = match (&self.target.address.tls, &self.tls) {
            (None, _) => None,
            (Some(_), Some(config)) => Some(Arc::clone(config)),
            (Some(_), None) => {
                let config = http::tls_config()?;
                self.tls = Some(Arc::clone(&config));
                Some(config)
            }
        };
        Connection::open(&self.target.address, tls.as_ref(), deadline)
    }

    fn io_failure(&self, err: &io::Error) -> Failure {
        let failure = Failure::from_io(err);
        Failure::new(
            failure.kind(),
            format!("object store {}: {failure}", self.target.shown),
        )
    }

    /// An answer that is not what the request wanted, sorted.
    fn refused(&self, answer: &Answer) -> Failure {
        let code = error_code(&answer.body);
        let status = answer.status;
        let kind = match (status, code.as_str()) {
            (501, _) | (_, "NotImplemented") => Kind::Permanent,
            (409 | 429 | 500..=599, _) | (_, "SlowDown") => Kind::Transient,
            _ => Kind::Permanent,
        };
        let hint = match (status, code.as_str()) {
            (403, _) => {
                ": check the credentials (from ".to_owned()
                    + &self.credentials.source
                    + ") and the bucket's permissions"
            }
            (404, "NoSuchBucket") => ": the bucket does not exist".to_owned(),
            (301 | 307, _) | (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                ": the bucket is in another region (set AWS_REGION)".to_owned()
            }
            (501, _) | (_, "NotImplemented") => {
                ": it does not implement conditional writes, which lockrun needs".to_owned()
            }
            _ => String::new(),
        };
        let code = if code.is_empty() {
            String::new()
        } else {
            format!(" {code}")
        };
        Failure::new(
            kind,
            format!(
                "object store {} answered {status}{code}{hint}",
                self.target.shown
            ),
        )
    }
}

/// The `Content-MD5` of `body`: its MD5 digest in base64.
fn content_md5(body: &[u8]) -> String {
    use base64::Engine as _;
    use md5::Digest as _;

    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
}

/// The signed headers of an action, to be sent as they were signed.
fn header_list(map: &mut rusty_s3::Map<'_>) -> Vec<(String, String)> {
    map.iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The `<Code>` of an S3 error document, letters and digits only (it reaches messages).
fn error_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    elements(&text, "Code")
        .next()
        .map(|code| {
            code.chars()
                .filter(char::is_ascii_alphanumeric)
                .take(64)
                .collect()
        })
        .unwrap_or_default()
}

/// The texts of the elements `<tag>...</tag>` of an XML document, in order.
pub(super) fn elements<'a>(text: &'a str, tag: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let end = start + rest[start..].find(&close)?;
        let found = &rest[start..end];
        rest = &rest[end + close.len()..];
        Some(found)
    })
}

/// One page of a listing: its keys, and the continuation token of the next
/// (none: this is the last).
pub struct Page {
    pub keys: Vec<String>,
    pub next: Option<String>,
}

/// The page a ListObjectsV2 answer holds; `None` when it is truncated with
/// no token to go on from. A page may hold fewer than 1000 keys and still
/// not be the last: `IsTruncated` says.
fn page(text: &str) -> Option<Page> {
    let keys = elements(text, "Key").map(unescape_xml).collect();
    let truncated = elements(text, "IsTruncated").next() == Some("true");
    let next = if truncated {
        Some(
            elements(text, "NextContinuationToken")
                .next()
                .map(unescape_xml)?,
        )
    } else {
        None
    };
    Some(Page { keys, next })
}

/// XML's five entities and numeric character references, decoded.
pub(super) fn unescape_xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|dec| dec.parse().ok()))
                .and_then(char::from_u32),
        };
        if let Some(c) = decoded {
            out.push(c);
            rest = &rest[end + 1..];
        } else {
            out.push('&');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_issuer_costs_a_call_a_second_and_the_credentials_in_hand_stay() {
        // Accepted by the kernel, never answered.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let vars = [
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                format!("http://{}/credentials", silent.local_addr().unwrap()),
            ),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ];
        let vars = vars
            .into_iter()
            .map(|(name, value)| (name.to_owned(), Some(value)))
            .collect();
        let held = Credentials {
            key: "held".to_owned(),
            secret: crate::backend::net::Secret::new("s"),
            token: None,
            source: "the container endpoint".to_owned(),
            issued: true,
        };
        let target = Target::parse("s3://bucket", Some("http://127.0.0.1:1"), "us-east-1").unwrap();
        let mut client = ObjectClient::new(target, held, Vars(vars), "us-east-1".to_owned());
        client.refetch_at = Moment::now();
        let started = Moment::now();
        client.refetch_credentials(Deadline::after(Duration::from_secs(20)));
        assert!(Moment::now() - started < Duration::from_secs(5));
        assert_eq!(client.credentials.key, "held");
        assert!(!client.refetch_at.has_passed(), "asked again at once");
    }

    #[test]
    fn content_md5_is_the_bodys_digest_in_base64() {
        // d41d8cd98f00b204e9800998ecf8427e, the MD5 of nothing.
        assert_eq!(content_md5(b""), "1B2M2Y8AsgTpgAmY7PhCfg==");
    }

    #[test]
    fn error_codes_and_listed_keys_are_read_from_xml() {
        let error =
            b"<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>x</Message></Error>";
        assert_eq!(error_code(error), "NoSuchBucket");
        assert_eq!(
            error_code(b"<Error><Code>\x1b[31mEvil</Code></Error>"),
            "31mEvil"
        );
        let listing = "<ListBucketResult><Contents><Key>a/x&amp;y.lock.json</Key></Contents><Contents><Key>a/&#233;.lock.json</Key></Contents></ListBucketResult>";
        let last = page(listing).unwrap();
        assert_eq!(last.keys, ["a/x&y.lock.json", "a/\u{e9}.lock.json"]);
        assert!(last.next.is_none());
    }

    #[test]
    fn a_short_page_that_is_truncated_tells_where_the_next_begins() {
        let short = "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a/x.lock.json</Key></Contents><NextContinuationToken>1/a&amp;b</NextContinuationToken></ListBucketResult>";
        let first = page(short).unwrap();
        assert_eq!(first.keys, ["a/x.lock.json"]);
        assert_eq!(first.next.as_deref(), Some("1/a&b"));
        assert!(page("<IsTruncated>true</IsTruncated>").is_none());
    }
}
