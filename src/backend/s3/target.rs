//! Where the locks live: the bucket and key prefix of `--s3-url
//! s3://BUCKET[/PREFIX]`, at the endpoint of `--s3-endpoint` (or
//! `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`), else AWS's for the region.
//! A custom endpoint is addressed path-style (`http://host/BUCKET/KEY`), as
//! MinIO, Ceph and SeaweedFS expect; AWS virtual-hosted
//! (`https://BUCKET.s3.REGION.amazonaws.com/KEY`), unless the bucket's name
//! has a dot, which AWS's certificates do not cover.

use rusty_s3::{Bucket, UrlStyle};
use url::Url;

use crate::backend::net::http::Address;
use crate::backend::net::{Failure, Kind};

/// A bucket, a key prefix, and how to reach them.
#[derive(Debug)]
pub struct Target {
    pub bucket: Bucket,
    /// Ends in `/` unless empty.
    pub prefix: String,
    pub address: Address,
    /// `s3://BUCKET/PREFIX at ENDPOINT`, for `-v` and `status`.
    pub shown: String,
}

fn usage(why: impl std::fmt::Display) -> Failure {
    Failure::new(Kind::Permanent, why.to_string())
}

impl Target {
    /// `url` is `s3://BUCKET[/PREFIX]`; `endpoint` a custom endpoint if any.
    pub fn parse(url: &str, endpoint: Option<&str>, region: &str) -> Result<Self, Failure> {
        let expected = "expected s3://BUCKET[/PREFIX]";
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(usage(format!(
                "--s3-url: {url:?} is not an S3 URL ({expected})"
            )));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.len() < 3
            || !bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        {
            return Err(usage(format!(
                "--s3-url: {bucket:?} is not a bucket name ({expected})"
            )));
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        let (endpoint, style) = if let Some(endpoint) = endpoint {
            let parsed = Url::parse(endpoint).map_err(|err| {
                usage(format!("--s3-endpoint: {endpoint:?} is not a URL ({err})"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(usage(format!(
                    "--s3-endpoint: {endpoint:?} must start with http:// or https://"
                )));
            }
            (parsed, UrlStyle::Path)
        } else {
            let aws = Url::parse(&format!("https://s3.{region}.amazonaws.com"))
                .map_err(|err| usage(format!("the region {region:?} is not usable ({err})")))?;
            // AWS's certificates cover one label before s3.REGION.amazonaws.com.
            let style = if bucket.contains('.') {
                UrlStyle::Path
            } else {
                UrlStyle::VirtualHost
            };
            (aws, style)
        };
        let shown_endpoint = format!(
            "{}://{}",
            endpoint.scheme(),
            endpoint.host_str().unwrap_or_default()
        ) + &endpoint
            .port()
            .map(|port| format!(":{port}"))
            .unwrap_or_default();
        let bucket = Bucket::new(endpoint, style, bucket.to_owned(), region.to_owned())
            .map_err(|err| usage(format!("--s3-url: the bucket is not usable ({err:?})")))?;
        let base = bucket.base_url();
        let mut address = Address::of_url(base, if base.scheme() == "https" { 443 } else { 80 })
            .map_err(|why| usage(format!("--s3-endpoint: {why}")))?;
        // The Host header as signed: the port only when it is not the scheme's.
        address.authority = base.host_str().unwrap_or_default().to_owned()
            + &base
                .port()
                .map(|port| format!(":{port}"))
                .unwrap_or_default();
        Ok(Self {
            shown: format!("s3://{}/{prefix} at {shown_endpoint}", bucket.name()),
            bucket,
            prefix,
            address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_is_virtual_hosted_and_a_custom_endpoint_path_style() {
        let aws = Target::parse("s3://ci-locks/deploy/", None, "eu-west-1").unwrap();
        assert_eq!(aws.prefix, "deploy/");
        assert_eq!(aws.address.authority, "ci-locks.s3.eu-west-1.amazonaws.com");
        assert!(aws.address.tls.is_some());
        let local =
            Target::parse("s3://locks", Some("http://127.0.0.1:8333"), "us-east-1").unwrap();
        assert_eq!(local.prefix, "");
        assert_eq!(
            (local.address.authority.as_str(), local.address.port),
            ("127.0.0.1:8333", 8333)
        );
        assert!(local.address.tls.is_none());
        assert_eq!(local.shown, "s3://locks/ at http://127.0.0.1:8333");
        let dotted = Target::parse("s3://a.b.c", None, "us-east-1").unwrap();
        assert_eq!(dotted.address.authority, "s3.us-east-1.amazonaws.com");
    }

    #[test]
    fn bad_urls_are_permanent() {
        for (url, endpoint) in [
            ("locks", None),
            ("s3://", None),
            ("s3://a", None),
            ("s3://bad bucket", None),
            ("s3://locks", Some("ftp://x")),
            ("s3://locks", Some("not a url")),
        ] {
            let err = Target::parse(url, endpoint, "us-east-1").unwrap_err();
            assert_eq!(err.kind(), Kind::Permanent, "{url} {endpoint:?}");
        }
    }
}
