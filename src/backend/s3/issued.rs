//! Credentials that a service issues for a while, as the AWS CLI fetches them
//! (docs/backends/s3.md: "S3 backend"): STS `AssumeRoleWithWebIdentity` with the token in
//! `AWS_WEB_IDENTITY_TOKEN_FILE` for `AWS_ROLE_ARN` (what EKS and GitHub's
//! OIDC give a job); the ECS/EKS container endpoint
//! (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `_FULL_URI`, with
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`); EC2's instance metadata
//! (IMDSv2: a session token by PUT, then the role's credentials). Each is
//! one or a few plain HTTP calls under a deadline; the replies hold secrets
//! and are never shown.

use std::fs;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use super::credentials::{Credentials, Env, var};
use super::object::{elements, unescape_xml};
use crate::backend::net::http::{self, Address, Connection};
use crate::backend::net::{Deadline, Failure, Kind, Secret};

/// Where containers on ECS find their credentials by a relative URI.
const ECS_HOST: &str = "http://169.254.170.2";
/// EC2's instance metadata service.
const IMDS: &str = "http://169.254.169.254";
/// How long the instance metadata may take, as the AWS CLI waits for it (1 s).
const IMDS_PATIENCE: Duration = Duration::from_secs(1);

/// The longest reply an issuer may send: credentials are a few kilobytes.
const MAX_REPLY: usize = 64 * 1024;

fn failure(source: &str, why: impl std::fmt::Display) -> Failure {
    Failure::new(
        Kind::Permanent,
        format!("AWS credentials from {source}: {why}"),
    )
}

/// One request; the answer's status and body.
fn call(
    url: &Url,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    deadline: Deadline,
) -> std::io::Result<(u16, Vec<u8>)> {
    let default_port = if url.scheme() == "https" { 443 } else { 80 };
    let address = Address::of_url(url, default_port).map_err(std::io::Error::other)?;
    let tls = match address.tls {
        Some(_) => Some(http::tls_config()?),
        None => None,
    };
    let mut connection = Connection::open(&address, tls.as_ref(), deadline)?;
    let status = connection.send(method, &http::target_of(url), headers, body, deadline)?;
    Ok((status, connection.read_up_to(MAX_REPLY, deadline)?))
}

fn parse_url(source: &str, text: &str) -> Result<Url, Failure> {
    Url::parse(text).map_err(|err| failure(source, format!("{text:?} is not a URL ({err})")))
}

/// STS's web identity exchange, when `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` are set.
pub fn web_identity(
    env: Env,
    region: &str,
    deadline: Deadline,
) -> Option<Result<Credentials, Failure>> {
    let token_file = var(env, "AWS_WEB_IDENTITY_TOKEN_FILE")?;
    let role = var(env, "AWS_ROLE_ARN")?;
    let source = "the web identity token file (AWS_WEB_IDENTITY_TOKEN_FILE)";
    Some((|| {
        let token = fs::read_to_string(&token_file)
            .map_err(|err| failure(source, format!("cannot read {token_file}: {err}")))?;
        let session = var(env, "AWS_ROLE_SESSION_NAME")
            .unwrap_or_else(|| format!("lockrun-{}", std::process::id()));
        let endpoint = var(env, "AWS_ENDPOINT_URL_STS")
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com/"));
        let url = parse_url(source, &endpoint)?;
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", "2011-06-15")
            .append_pair("RoleArn", &role)
            .append_pair("RoleSessionName", &session)
            .append_pair("WebIdentityToken", token.trim())
            .finish();
        let headers = [("Content-Type", "application/x-www-form-urlencoded")];
        let (status, body) = call(&url, "POST", &headers, form.as_bytes(), deadline)
            .map_err(|err| issuer_unreachable(source, &err))?;
        let text = String::from_utf8_lossy(&body);
        let field = |name: &str| elements(&text, name).next().map(unescape_xml);
        if status != 200 {
            let code: String = field("Code")
                .unwrap_or_default()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect();
            return Err(failure(source, format!("STS answered {status} {code}")));
        }
        match (
            field("AccessKeyId"),
            field("SecretAccessKey"),
            field("SessionToken"),
        ) {
            (Some(key), Some(secret), token) => Ok(Credentials {
                key,
                secret: Secret::new(secret),
                token: token.map(Secret::new),
                source: format!("STS for role {role}"),
                issued: true,
            }),
            _ => Err(failure(source, "STS's answer holds no credentials")),
        }
    })())
}

/// The reply of the container endpoint and of the instance metadata.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Issued {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
}

impl Issued {
    fn parse(source: &str, status: u16, body: &[u8], from: String) -> Result<Credentials, Failure> {
        if status != 200 {
            return Err(failure(source, format!("answered {status}")));
        }
        let issued: Self = serde_json::from_slice(body)
            .map_err(|_| failure(source, "the answer holds no credentials"))?;
        Ok(Credentials {
            key: issued.access_key_id,
            secret: Secret::new(issued.secret_access_key),
            token: issued
                .token
                .filter(|token| !token.is_empty())
                .map(Secret::new),
            source: from,
            issued: true,
        })
    }
}

/// The ECS/EKS container endpoint, when one is named.
pub fn container(env: Env, deadline: Deadline) -> Option<Result<Credentials, Failure>> {
    let source = "the container endpoint (AWS_CONTAINER_CREDENTIALS_*)";
    let url = match (
        var(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        var(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    ) {
        (Some(relative), _) => format!("{ECS_HOST}{relative}"),
        (None, Some(full)) => full,
        (None, None) => return None,
    };
    Some((|| {
        let url = parse_url(source, &url)?;
        let token = match var(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            Some(path) => Some(
                fs::read_to_string(&path)
                    .map_err(|err| failure(source, format!("cannot read {path}: {err}")))?
                    .trim()
                    .to_owned(),
            ),
            None => var(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        };
        let headers: Vec<(&str, &str)> = token
            .as_deref()
            .map(|token| ("Authorization", token))
            .into_iter()
            .collect();
        let (status, body) = call(&url, "GET", &headers, &[], deadline)
            .map_err(|err| issuer_unreachable(source, &err))?;
        Issued::parse(source, status, &body, "the container endpoint".to_owned())
    })())
}

/// EC2's instance metadata (IMDSv2), unless `AWS_EC2_METADATA_DISABLED=true`;
/// `None` where there is none to ask (not on EC2).
pub fn instance_metadata(env: Env, deadline: Deadline) -> Option<Result<Credentials, Failure>> {
    if var(env, "AWS_EC2_METADATA_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"))
    {
        return None;
    }
    let source = "the instance metadata (IMDSv2)";
    let base = var(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| IMDS.to_owned());
    let base = base.trim_end_matches('/');
    let deadline = deadline.within(IMDS_PATIENCE);
    let url = |path: &str| parse_url(source, &format!("{base}{path}"));
    // Not on EC2: nothing answers, and the chain ends without credentials.
    let token_url = url("/latest/api/token").ok()?;
    let (status, token) = call(
        &token_url,
        "PUT",
        &[("X-aws-ec2-metadata-token-ttl-seconds", "21600")],
        &[],
        deadline,
    )
    .ok()?;
    if status != 200 {
        return None;
    }
    let token = String::from_utf8_lossy(&token).trim().to_owned();
    let headers = [("X-aws-ec2-metadata-token", token.as_str())];
    Some((|| {
        let roles_url = url("/latest/meta-data/iam/security-credentials/")?;
        let (status, roles) = call(&roles_url, "GET", &headers, &[], deadline)
            .map_err(|err| issuer_unreachable(source, &err))?;
        let roles = String::from_utf8_lossy(&roles);
        let Some(role) = roles.lines().next().filter(|_| status == 200) else {
            return Err(failure(source, "the instance has no IAM role"));
        };
        let credentials_url = url(&format!(
            "/latest/meta-data/iam/security-credentials/{role}"
        ))?;
        let (status, body) = call(&credentials_url, "GET", &headers, &[], deadline)
            .map_err(|err| issuer_unreachable(source, &err))?;
        Issued::parse(source, status, &body, format!("the instance role {role}"))
    })())
}

/// An issuer that did not answer: trouble that may pass.
fn issuer_unreachable(source: &str, err: &std::io::Error) -> Failure {
    let sorted = Failure::from_io(err);
    Failure::new(
        sorted.kind(),
        format!("AWS credentials from {source}: {sorted}"),
    )
}

#[cfg(test)]
mod tests {
    //! Each source against a stand-in on a loopback port: a thread that
    //! answers the requests it expects, in order, and records them.

    use std::collections::HashMap;
    use std::io::Write;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use std::thread;

    use super::*;
    use crate::backend::net::http::tests::accept_and_read;

    /// A server that answers each request with the next of `answers`
    /// (status, body); the requests it got (head and body) are kept.
    fn stand_in(answers: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        thread::spawn(move || {
            for (status, body) in answers {
                let (mut socket, request) = accept_and_read(&listener);
                record.lock().unwrap().push(request);
                write!(
                    socket,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        (url, seen)
    }

    fn env_of(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<&str, String> = pairs.into_iter().collect();
        move |name: &str| map.get(name).cloned()
    }

    fn deadline() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    const ISSUED: &str = r#"{"AccessKeyId":"ASIAISSUED","SecretAccessKey":"issued-secret","Token":"issued-token","Expiration":"2030-01-01T00:00:00Z"}"#;

    #[test]
    fn web_identity_is_exchanged_at_sts() {
        let reply = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIASTS</AccessKeyId><SecretAccessKey>sts-secret</SecretAccessKey><SessionToken>sts-token</SessionToken></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
        let (url, seen) = stand_in(vec![(200, reply)]);
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "the-oidc-jwt\n").unwrap();
        let env = env_of(vec![
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token.to_str().unwrap().to_owned(),
            ),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/deploy".to_owned()),
            ("AWS_ENDPOINT_URL_STS", url),
        ]);
        let found = web_identity(&env, "us-east-1", deadline())
            .unwrap()
            .unwrap();
        assert_eq!(
            (found.key.as_str(), found.secret.expose()),
            ("ASIASTS", "sts-secret")
        );
        assert_eq!(found.token.unwrap().expose(), "sts-token");
        let request = &seen.lock().unwrap()[0];
        assert!(request.starts_with("POST / HTTP/1.1"), "{request}");
        assert!(
            request.contains("Action=AssumeRoleWithWebIdentity"),
            "{request}"
        );
        assert!(
            request.contains("WebIdentityToken=the-oidc-jwt"),
            "{request}"
        );
        assert!(
            request.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fdeploy"),
            "{request}"
        );
    }

    #[test]
    fn a_refused_web_identity_is_permanent_and_shows_no_token() {
        let (url, _) = stand_in(vec![(
            403,
            "<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>",
        )]);
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "secret-jwt").unwrap();
        let env = env_of(vec![
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token.to_str().unwrap().to_owned(),
            ),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/deploy".to_owned()),
            ("AWS_ENDPOINT_URL_STS", url),
        ]);
        let err = web_identity(&env, "us-east-1", deadline())
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), Kind::Permanent);
        assert!(err.to_string().contains("403 AccessDenied"), "{err}");
        assert!(!err.to_string().contains("secret-jwt"), "{err}");
    }

    #[test]
    fn the_container_endpoint_is_asked_with_its_token() {
        let (url, seen) = stand_in(vec![(200, ISSUED)]);
        let env = env_of(vec![
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("{url}/creds")),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                "container-auth".to_owned(),
            ),
        ]);
        let found = container(&env, deadline()).unwrap().unwrap();
        assert_eq!(
            (found.key.as_str(), found.secret.expose()),
            ("ASIAISSUED", "issued-secret")
        );
        let request = &seen.lock().unwrap()[0];
        assert!(request.starts_with("GET /creds HTTP/1.1"), "{request}");
        assert!(
            request.contains("Authorization: container-auth"),
            "{request}"
        );
        assert!(container(&env_of(vec![]), deadline()).is_none());
    }

    #[test]
    fn instance_metadata_takes_a_session_token_first() {
        let (url, seen) = stand_in(vec![
            (200, "imds-token"),
            (200, "deploy-role\n"),
            (200, ISSUED),
        ]);
        let env = env_of(vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)]);
        let found = instance_metadata(&env, deadline()).unwrap().unwrap();
        assert_eq!(found.token.unwrap().expose(), "issued-token");
        assert_eq!(found.source, "the instance role deploy-role");
        let seen = seen.lock().unwrap();
        assert!(seen[0].starts_with("PUT /latest/api/token"), "{}", seen[0]);
        assert!(
            seen[0].contains("X-aws-ec2-metadata-token-ttl-seconds: 21600"),
            "{}",
            seen[0]
        );
        assert!(
            seen[2].starts_with("GET /latest/meta-data/iam/security-credentials/deploy-role"),
            "{}",
            seen[2]
        );
        assert!(
            seen[2].contains("X-aws-ec2-metadata-token: imds-token"),
            "{}",
            seen[2]
        );
    }

    #[test]
    fn no_instance_metadata_ends_the_chain_quietly() {
        // A port nothing listens on: refused at once.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let env = env_of(vec![(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )]);
        assert!(instance_metadata(&env, deadline()).is_none());
        let disabled = env_of(vec![("AWS_EC2_METADATA_DISABLED", "true".to_owned())]);
        assert!(instance_metadata(&disabled, deadline()).is_none());
    }
}
