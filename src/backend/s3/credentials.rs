//! Credentials and region, found the way the AWS CLI finds them (docs/backends/s3.md: "S3 backend"), in its order: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
//! `AWS_SESSION_TOKEN`; a web identity token exchanged at STS; the profile
//! (`AWS_PROFILE`, else `default`) in the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) and the config
//! file (`AWS_CONFIG_FILE`, else `~/.aws/config`); the container endpoint;
//! the instance metadata ([`issued`]). The secret and the token live in
//! [`Secret`]s: no message or `Debug` shows them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

use super::issued;
use crate::backend::net::{Deadline, Failure, Kind, Secret};

/// An access key, with where it was found (for `-v`).
#[derive(Clone, Debug)]
pub struct Credentials {
    pub key: String,
    pub secret: Secret,
    pub token: Option<Secret>,
    pub source: String,
    /// Issued for a while by a service (STS, a container endpoint, the
    /// instance metadata): fetched again now and then during a long run.
    pub issued: bool,
}

impl Credentials {
    /// What rusty-s3 signs with.
    pub fn signing(&self) -> rusty_s3::Credentials {
        match &self.token {
            Some(token) => rusty_s3::Credentials::new_with_token(
                &self.key,
                self.secret.expose(),
                token.expose(),
            ),
            None => rusty_s3::Credentials::new(&self.key, self.secret.expose()),
        }
    }
}

/// The environment as lockrun reads it: a function, so that tests can give their own.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The variable `name`, unless unset or empty (the AWS CLI's reading).
pub(super) fn var(env: Env, name: &str) -> Option<String> {
    env(name).filter(|value| !value.is_empty())
}

/// The profile the AWS CLI would use.
fn profile_name(env: Env) -> String {
    var(env, "AWS_PROFILE").unwrap_or_else(|| "default".to_owned())
}

fn home_file(env: Env, override_var: &str, name: &str) -> Option<PathBuf> {
    var(env, override_var)
        .map(PathBuf::from)
        .or_else(|| var(env, "HOME").map(|home| PathBuf::from(home).join(".aws").join(name)))
}

/// The keys of section `section` of the INI file at `path`; none when the
/// file or the section is missing.
fn ini_section(path: Option<PathBuf>, section: &str) -> Vec<(String, String)> {
    let Some(text) = path.and_then(|path| fs::read_to_string(path).ok()) else {
        return Vec::new();
    };
    let mut inside = false;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == section;
            continue;
        }
        if inside && let Some((key, value)) = line.split_once('=') {
            found.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    found
}

/// The profile's settings: the credentials file's section, then the config
/// file's (`[default]` or `[profile NAME]`) for keys the first lacks.
fn profile(env: Env) -> Vec<(String, String)> {
    let name = profile_name(env);
    let mut settings = ini_section(
        home_file(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        &name,
    );
    let config_section = if name == "default" {
        name.clone()
    } else {
        format!("profile {name}")
    };
    settings.extend(ini_section(
        home_file(env, "AWS_CONFIG_FILE", "config"),
        &config_section,
    ));
    settings
}

fn setting<'a>(settings: &'a [(String, String)], key: &str) -> Option<&'a str> {
    settings
        .iter()
        .find(|(name, value)| name == key && !value.is_empty())
        .map(|(_, value)| value.as_str())
}

/// The credentials to sign with, in the AWS CLI's order, asking the
/// services by `deadline`; 69 when there are none.
pub fn find(env: Env, region: &str, deadline: Deadline) -> Result<Credentials, Failure> {
    if let (Some(key), Some(secret)) = (
        var(env, "AWS_ACCESS_KEY_ID"),
        var(env, "AWS_SECRET_ACCESS_KEY"),
    ) {
        return Ok(Credentials {
            key,
            secret: Secret::new(secret),
            token: var(env, "AWS_SESSION_TOKEN").map(Secret::new),
            source: "the environment (AWS_ACCESS_KEY_ID)".to_owned(),
            issued: false,
        });
    }
    if let Some(found) = issued::web_identity(env, region, deadline) {
        return found;
    }
    let settings = profile(env);
    if let (Some(key), Some(secret)) = (
        setting(&settings, "aws_access_key_id"),
        setting(&settings, "aws_secret_access_key"),
    ) {
        return Ok(Credentials {
            key: key.to_owned(),
            secret: Secret::new(secret),
            token: setting(&settings, "aws_session_token").map(Secret::new),
            source: format!("profile {}", profile_name(env)),
            issued: false,
        });
    }
    if let Some(found) = issued::container(env, deadline) {
        return found;
    }
    if let Some(found) = issued::instance_metadata(env, deadline) {
        return found;
    }
    Err(Failure::new(
        Kind::Permanent,
        format!(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile {} keys in ~/.aws/credentials (or a web identity token, a container or instance role)",
            profile_name(env)
        ),
    ))
}

/// The variables a search read, with their values: what a later search
/// (issued credentials fetched again during a run) reads, as the `Env`
/// given when the store was opened is gone by then. No `Debug`: a value
/// may be a secret.
pub struct Vars(pub(super) HashMap<String, Option<String>>);

impl Vars {
    pub fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned().flatten()
    }
}

/// [`find`], with the variables it read.
pub fn find_noting(
    env: Env,
    region: &str,
    deadline: Deadline,
) -> Result<(Credentials, Vars), Failure> {
    let read = RefCell::new(HashMap::new());
    let noting = |name: &str| {
        let value = env(name);
        read.borrow_mut().insert(name.to_owned(), value.clone());
        value
    };
    let credentials = find(&noting, region, deadline)?;
    Ok((credentials, Vars(read.into_inner())))
}

/// The region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`,
/// else `us-east-1`, as the AWS CLI chooses it.
pub fn region(env: Env) -> String {
    var(env, "AWS_REGION")
        .or_else(|| var(env, "AWS_DEFAULT_REGION"))
        .or_else(|| setting(&profile(env), "region").map(str::to_owned))
        .unwrap_or_else(|| "us-east-1".to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name: &str| map.get(name).cloned()
    }

    fn soon() -> Deadline {
        Deadline::after(std::time::Duration::from_secs(2))
    }

    #[test]
    fn the_environment_comes_before_the_profile() {
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "AKIDENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_SESSION_TOKEN", "envtoken"),
            ("HOME", "/nonexistent"),
        ]);
        let found = find(&env, "us-east-1", soon()).unwrap();
        assert_eq!(found.key, "AKIDENV");
        assert_eq!(found.token.unwrap().expose(), "envtoken");
        assert!(!format!("{:?}", find(&env, "us-east-1", soon()).unwrap()).contains("envsecret"));
    }

    #[test]
    fn a_named_profile_is_read_from_both_files_with_its_region() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("credentials");
        let config = dir.path().join("config");
        fs::write(
            &credentials,
            "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = d\n\n[ci]\n# a comment\naws_access_key_id = AKIDCI\naws_secret_access_key = cisecret\n",
        )
        .unwrap();
        fs::write(
            &config,
            "[profile ci]\nregion = eu-west-3\naws_session_token = citoken\n",
        )
        .unwrap();
        let (credentials, config) = (credentials.to_str().unwrap(), config.to_str().unwrap());
        let env = env_of(&[
            ("AWS_PROFILE", "ci"),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials),
            ("AWS_CONFIG_FILE", config),
        ]);
        let found = find(&env, "us-east-1", soon()).unwrap();
        assert_eq!(
            (found.key.as_str(), found.secret.expose()),
            ("AKIDCI", "cisecret")
        );
        assert_eq!(found.token.unwrap().expose(), "citoken");
        assert_eq!(found.source, "profile ci");
        assert_eq!(region(&env), "eu-west-3");
        let env = env_of(&[
            ("AWS_SHARED_CREDENTIALS_FILE", credentials),
            ("AWS_REGION", "ap-south-1"),
        ]);
        assert_eq!(find(&env, "us-east-1", soon()).unwrap().key, "AKIDDEFAULT");
        assert_eq!(region(&env), "ap-south-1");
    }

    #[test]
    fn none_found_is_permanent_and_says_what_to_set() {
        let env = env_of(&[
            ("HOME", "/nonexistent"),
            ("AWS_ACCESS_KEY_ID", "only-half"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        let err = find(&env, "us-east-1", soon()).unwrap_err();
        assert_eq!(err.kind(), Kind::Permanent);
        assert!(err.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{err}");
        assert_eq!(region(&env), "us-east-1");
    }
}
