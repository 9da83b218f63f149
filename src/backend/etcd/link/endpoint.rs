//! The endpoint list (`http://[user:pass@]host:port,...`, `https://` for TLS):
//! where each member is, the credentials the list carries, and the redacted
//! form that every message shows. Nothing here prints the password.

use std::fmt;

use percent_encoding::percent_decode_str;
use url::Url;

use super::error::{Error, Result};
use crate::backend::net::http::Address;
use crate::backend::net::{Kind, Secret};

/// etcd's client port, when an endpoint names none.
const DEFAULT_PORT: u16 = 2379;

/// One member's client URL.
#[derive(Clone, Debug)]
pub struct Member {
    pub(super) address: Address,
    /// The URL with its password replaced, for messages.
    shown: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The etcd user the endpoints name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub(super) user: String,
    pub(super) password: Secret,
}

/// The members to try, in order, and who to authenticate as.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub(super) members: Vec<Member>,
    pub(super) credentials: Option<Credentials>,
}

impl Endpoints {
    /// Parses a comma-separated list. Credentials may be given on any of the
    /// endpoints and apply to all; endpoints that name different users are refused.
    pub fn parse(list: &str) -> Result<Self> {
        let mut members = Vec::new();
        let mut credentials: Option<Credentials> = None;
        for text in list.split(',').map(str::trim) {
            let (endpoint, named) = parse_one(text)?;
            if let Some(named) = named {
                if credentials.as_ref().is_some_and(|known| *known != named) {
                    return Err(usage(
                        &endpoint.shown,
                        "it names other credentials than an endpoint before it",
                    ));
                }
                credentials = Some(named);
            }
            members.push(endpoint);
        }
        Ok(Self {
            members,
            credentials,
        })
    }
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, member) in self.members.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&member.shown)?;
        }
        Ok(())
    }
}

fn parse_one(text: &str) -> Result<(Member, Option<Credentials>)> {
    let shown = redact(text);
    let url = Url::parse(text).map_err(|err| usage(&shown, &err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(usage(&shown, "the scheme must be http:// or https://"));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(usage(&shown, "an endpoint has no path, query or fragment"));
    }
    let address = Address::of_url(&url, DEFAULT_PORT).map_err(|why| usage(&shown, why))?;
    let credentials = (!url.username().is_empty()).then(|| Credentials {
        user: decode(url.username()),
        password: Secret::new(url.password().map(decode).unwrap_or_default()),
    });
    let endpoint = Member {
        shown: format!(
            "{}://{}{}",
            url.scheme(),
            shown_user(&url),
            address.authority
        ),
        address,
    };
    Ok((endpoint, credentials))
}

/// `user:***@`, `user@` or nothing.
fn shown_user(url: &Url) -> String {
    match (url.username(), url.password()) {
        ("", _) => String::new(),
        (user, Some(_)) => format!("{user}:***@"),
        (user, None) => format!("{user}@"),
    }
}

fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// `text` as messages may show it before it is known to parse: the password of
/// `user:pass@` replaced; when even that cannot be found, only the scheme.
fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return "(not a URL)".to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let password = if userinfo.contains(':') { ":***" } else { "" };
            format!(
                "{scheme}://{user}{password}@{host}{}",
                &rest[authority_end..]
            )
        }
        None => text.to_owned(),
    }
}

fn usage(shown: &str, why: &str) -> Error {
    Error::new(
        Kind::Permanent,
        format!(
            "--etcd-endpoints: {shown} is not a usable etcd endpoint ({why}); expected http://[user:pass@]host:port or https://..., separated by commas"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_default_port_credentials_and_tls() {
        let endpoints =
            Endpoints::parse("http://lock:s%40cret@127.0.0.1, https://[::1]:2479/").unwrap();
        assert_eq!(endpoints.members.len(), 2);
        let (plain, tls) = (&endpoints.members[0].address, &endpoints.members[1].address);
        assert_eq!((plain.host.as_str(), plain.port), ("127.0.0.1", 2379));
        assert!(plain.tls.is_none());
        assert_eq!((tls.host.as_str(), tls.port), ("::1", 2479));
        assert_eq!(tls.authority, "[::1]:2479");
        assert!(tls.tls.is_some());
        let credentials = endpoints.credentials.unwrap();
        assert_eq!(credentials.user, "lock");
        assert_eq!(credentials.password.expose(), "s@cret");
    }

    #[test]
    fn passwords_never_show() {
        let endpoints = Endpoints::parse("http://lock:s3cret@a:1,https://b").unwrap();
        assert_eq!(endpoints.to_string(), "http://lock:***@a:1,https://b:2379");
        assert!(!format!("{endpoints:?}").contains("s3cret"));
        for bad in [
            "http://lock:s3cret@a:notaport",
            "ftp://lock:s3cret@a",
            "http://lock:s3cret@a/v3",
            "lock:s3cret@a",
        ] {
            let err = Endpoints::parse(bad).unwrap_err();
            assert_eq!(err.kind(), Kind::Permanent, "{bad}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn endpoints_must_agree_on_the_user() {
        assert!(Endpoints::parse("http://a:x@h1,http://h2,http://a:x@h3").is_ok());
        let err = Endpoints::parse("http://a:x@h1,http://b:y@h2").unwrap_err();
        assert_eq!(err.kind(), Kind::Permanent);
        assert!(Endpoints::parse("http://h1,").is_err(), "an empty entry");
    }
}
