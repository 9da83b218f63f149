//! Which PostgreSQL server lockrun talks to: `--postgres-url` as a
//! `postgres://` URL or a `key=value` conninfo string, with libpq's defaults
//! (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`, the local socket) for whatever it
//! leaves out, as psql would. The password is kept out of every message: the
//! target shows itself redacted, and [`Target::scrub`] cleans text that came
//! from elsewhere.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::net::{Failure, Kind, Secret};

/// The port when none is given, as libpq's.
const DEFAULT_PORT: u16 = 5432;
/// Where libpq looks for the server's socket when no host is given: Debian's
/// directory first, then upstream's.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];
/// How long connecting (TCP, TLS and authentication together) may take when
/// `connect_timeout` is not given: libpq would wait forever, lockrun never does.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `application_name`, so that lockrun's sessions stand out in `pg_stat_activity`.
const APPLICATION_NAME: &str = "lockrun";

/// Connection options lockrun understands; libpq has more, and a string that
/// uses one of those is refused rather than half obeyed.
const KNOWN_OPTIONS: [&str; 10] = [
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
];

/// One server to try, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A host name or IP address.
    Tcp(String),
    /// The directory that holds the server's Unix socket.
    Socket(PathBuf),
}

/// libpq's `sslmode`, less `allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, its certificate not checked; plain otherwise.
    Prefer,
    /// TLS always, its certificate not checked (unless a root certificate file is there: see [`Tls`]).
    Require,
    /// TLS, with a certificate signed by a trusted root.
    VerifyCa,
    /// TLS, with a certificate signed by a trusted root for the host name connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" => Err("sslmode=allow is not supported; use prefer or disable".into()),
            _ => Err(format!(
                "sslmode={value} is not one of disable, prefer, require, verify-ca, verify-full"
            )),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted root certificates come from (`sslrootcert`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    /// A PEM file of one or more certificates.
    File(PathBuf),
    /// The system's trust store (`sslrootcert=system`).
    System,
}

/// What TLS a connection uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    /// `sslrootcert`, else libpq's `~/.postgresql/root.crt` when that file
    /// exists; `None` leaves verify-ca and verify-full to the system's roots.
    /// As in libpq, `require` with a root file verifies like verify-ca.
    pub roots: Option<Roots>,
}

/// A PostgreSQL server to connect to, every default filled in.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub hosts: Vec<Host>,
    /// One port for every host, or one per host.
    pub ports: Vec<u16>,
    pub user: String,
    password: Option<Secret>,
    pub dbname: String,
    pub tls: Tls,
    /// The limit on connecting to one host: TCP, TLS and authentication.
    pub connect_timeout: Duration,
    pub application_name: String,
    /// `target_session_attrs=read-write`: skip a server that is a standby.
    pub read_write: bool,
}

/// What a malformed target's message calls it, unless it came from `LOCKRUN_POSTGRES_URL`.
const FLAG: &str = "--postgres-url";

impl Target {
    /// The target that `spec` (`--postgres-url`; `None` or empty for libpq's
    /// defaults alone) names, with defaults from the process's environment;
    /// `option` is what its errors call it (the flag, or the variable it came from).
    pub fn parse(spec: Option<&str>, option: &str) -> Result<Self, Failure> {
        Self::parse_with(spec.unwrap_or(""), &|key| std::env::var(key).ok(), &os_user).map_err(
            |failure| match failure.to_string().strip_prefix(FLAG) {
                Some(rest) => Failure::new(failure.kind(), format!("{option}{rest}")),
                None => failure,
            },
        )
    }

    /// [`Target::parse`] with the environment and the OS user name given.
    pub(super) fn parse_with(
        spec: &str,
        env: &dyn Fn(&str) -> Option<String>,
        os_user: &dyn Fn() -> Option<String>,
    ) -> Result<Self, Failure> {
        let usage = |why: String| {
            Failure::new(
                Kind::Permanent,
                format!(
                    "{FLAG}: {why}; expected postgres://[user[:password]@]host[:port]/db[?sslmode=...] or a key=value conninfo string"
                ),
            )
        };
        let options = ConnOptions::parse(spec).map_err(usage)?;
        let value = |key: &str, var: &str| {
            options
                .get(key)
                .map(str::to_owned)
                .or_else(|| env(var).filter(|value| !value.is_empty()))
        };
        let ports: Vec<u16> = match value("port", "PGPORT") {
            Some(list) => list.split(',').map(parse_port).collect::<Result<_, _>>(),
            None => Ok(vec![DEFAULT_PORT]),
        }
        .map_err(usage)?;
        let hosts: Vec<Host> = match value("host", "PGHOST") {
            Some(list) => list
                .split(',')
                .map(|host| match host {
                    "" => local_socket(ports[0]),
                    _ if host.starts_with('/') => Host::Socket(host.into()),
                    _ => Host::Tcp(host.to_owned()),
                })
                .collect(),
            None => vec![local_socket(ports[0])],
        };
        if ports.len() != 1 && ports.len() != hosts.len() {
            return Err(usage(format!(
                "{} ports for {} hosts (give one port, or one per host)",
                ports.len(),
                hosts.len()
            )));
        }
        let user = value("user", "PGUSER").or_else(os_user).ok_or_else(|| {
            usage("no user given, none in PGUSER, and the OS user has no name".into())
        })?;
        let mode = match value("sslmode", "PGSSLMODE") {
            Some(mode) => SslMode::parse(&mode).map_err(usage)?,
            None => SslMode::Prefer,
        };
        let roots = match value("sslrootcert", "PGSSLROOTCERT") {
            Some(root) if root == "system" => Some(Roots::System),
            Some(root) => Some(Roots::File(root.into())),
            None => env("HOME")
                .map(|home| Path::new(&home).join(".postgresql/root.crt"))
                .filter(|file| file.is_file())
                .map(Roots::File),
        };
        let connect_timeout = match value("connect_timeout", "PGCONNECT_TIMEOUT") {
            Some(seconds) => parse_connect_timeout(&seconds).map_err(usage)?,
            None => DEFAULT_CONNECT_TIMEOUT,
        };
        let read_write = match options.get("target_session_attrs") {
            None | Some("any") => false,
            Some("read-write") => true,
            Some(other) => {
                return Err(usage(format!(
                    "target_session_attrs={other} is not one of any, read-write"
                )));
            }
        };
        Ok(Self {
            dbname: value("dbname", "PGDATABASE").unwrap_or_else(|| user.clone()),
            password: value("password", "PGPASSWORD").map(Secret::new),
            user,
            hosts,
            ports,
            tls: Tls { mode, roots },
            connect_timeout,
            application_name: options
                .get("application_name")
                .unwrap_or(APPLICATION_NAME)
                .to_owned(),
            read_write,
        })
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
    }

    /// `text` with the password, as given and as it would appear in a URL, replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        Secret::scrub_with(self.password.as_ref(), text)
    }

    /// The port of the `index`-th host.
    pub fn port(&self, index: usize) -> u16 {
        self.ports.get(index).copied().unwrap_or(self.ports[0])
    }
}

/// Shows the target as a URL with its password replaced by `***`:
/// `postgres://user:***@host:5432/db`, a socket directory percent-encoded in
/// the host's place as libpq reads it, and `sslmode` when it is not `prefer`.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "postgres://{}", percent_encode(&self.user))?;
        if self.password.is_some() {
            f.write_str(":***")?;
        }
        f.write_str("@")?;
        for (index, host) in self.hosts.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            match host {
                Host::Tcp(name) if name.contains(':') => write!(f, "[{name}]")?,
                Host::Tcp(name) => f.write_str(name)?,
                Host::Socket(dir) => f.write_str(&percent_encode(&dir.to_string_lossy()))?,
            }
            write!(f, ":{}", self.port(index))?;
        }
        write!(f, "/{}", percent_encode(&self.dbname))?;
        if self.tls.mode != SslMode::Prefer {
            write!(f, "?sslmode={}", self.tls.mode.as_str())?;
        }
        Ok(())
    }
}

/// Debug output is the redacted form too, so that `{:?}` cannot leak the password.
impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({self})")
    }
}

/// The connection options a string gives, later ones winning, as libpq does.
struct ConnOptions(Vec<(String, String)>);

impl ConnOptions {
    fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        let pairs = if let Some(rest) = spec
            .strip_prefix("postgresql://")
            .or_else(|| spec.strip_prefix("postgres://"))
        {
            parse_url(rest)?
        } else if spec.contains("://") {
            return Err("the URL scheme must be postgres:// or postgresql://".into());
        } else {
            parse_conninfo(spec)?
        };
        if let Some((key, _)) = pairs
            .iter()
            .find(|(key, _)| !KNOWN_OPTIONS.contains(&key.as_str()))
        {
            return Err(format!(
                "lockrun does not support the connection option {key:?} (it knows {})",
                KNOWN_OPTIONS.join(", ")
            ));
        }
        Ok(Self(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value.as_str())
    }
}

/// `[user[:password]@][host[:port]][,host[:port]...][/dbname][?key=value&...]`,
/// everything percent-decoded; an empty part is left to the defaults.
fn parse_url(rest: &str) -> Result<Vec<(String, String)>, String> {
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut pairs = Vec::new();
    let (userinfo, hostlist) = match authority.split_once('@') {
        Some((userinfo, hostlist)) => (Some(userinfo), hostlist),
        None => (None, authority),
    };
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            pairs.push(("user".into(), percent_decode(user, "the user name")?));
        }
        if let Some(password) = password {
            pairs.push(("password".into(), percent_decode(password, "the password")?));
        }
    }
    if !hostlist.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for entry in hostlist.split(',') {
            let (host, port) = split_host_port(entry)?;
            hosts.push(percent_decode(host, "a host")?);
            ports.push(port.to_owned());
        }
        pairs.push(("host".into(), hosts.join(",")));
        if ports.iter().any(|port| !port.is_empty()) {
            pairs.push(("port".into(), ports.join(",")));
        }
    }
    if !path.is_empty() {
        pairs.push(("dbname".into(), percent_decode(path, "the database name")?));
    }
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (key, value) = parameter
            .split_once('=')
            .ok_or_else(|| format!("URL parameter {parameter:?} has no '='"))?;
        let key = percent_decode(key, "a URL parameter")?;
        let what = if key == "password" {
            "the password".to_owned()
        } else {
            format!("URL parameter {key}")
        };
        pairs.push((key, percent_decode(value, &what)?));
    }
    Ok(pairs)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(entry: &str) -> Result<(&str, &str), String> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("host {entry:?} lacks its closing ']'"))?;
        return match after {
            "" => Ok((host, "")),
            _ => after
                .strip_prefix(':')
                .map(|port| (host, port))
                .ok_or_else(|| format!("unexpected {after:?} after host [{host}]")),
        };
    }
    Ok(entry.split_once(':').unwrap_or((entry, "")))
}

/// `key = value ...`; a value may be single-quoted, and a backslash escapes
/// the next character, as in libpq.
fn parse_conninfo(spec: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = spec.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|&c| c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(format!("missing '=' after {key:?} in the conninfo string"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let quoted = chars.next_if_eq(&'\'').is_some();
        let mut value = String::new();
        let mut closed = !quoted;
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '\'' if quoted => {
                    closed = true;
                    break;
                }
                _ if !quoted && c.is_whitespace() => break,
                _ => value.push(c),
            }
        }
        if !closed {
            return Err(format!("the quoted value of {key:?} is not closed"));
        }
        pairs.push((key, value));
    }
}

fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    port.parse()
        .ok()
        .filter(|&port| port != 0)
        .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))
}

/// libpq's whole seconds; zero or less means no limit there, which lockrun
/// replaces with its default.
fn parse_connect_timeout(seconds: &str) -> Result<Duration, String> {
    let seconds: i64 = seconds
        .trim()
        .parse()
        .map_err(|_| format!("connect_timeout={seconds} is not a whole number of seconds"))?;
    Ok(u64::try_from(seconds)
        .ok()
        .filter(|&seconds| seconds > 0)
        .map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs))
}

/// The directory of the local server's socket for `port`: the first of
/// libpq's directories where that socket exists, else Debian's.
fn local_socket(port: u16) -> Host {
    let dir = SOCKET_DIRS
        .iter()
        .find(|dir| Path::new(dir).join(format!(".s.PGSQL.{port}")).exists())
        .unwrap_or(&SOCKET_DIRS[0]);
    Host::Socket(PathBuf::from(dir))
}

/// The name of the effective user, as libpq takes it when no user is given.
fn os_user() -> Option<String> {
    crate::identity::name_of(nix::unistd::geteuid())
}

fn percent_decode(text: &str, what: &str) -> Result<String, String> {
    let bad = || format!("{what} has a bad %-escape or is not UTF-8");
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(bad)?;
            decoded.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| bad())
}

/// `text` with every byte but URL-safe letters, digits and `-._~` as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str, env: &[(&str, &str)]) -> Result<Target, Failure> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        Target::parse_with(
            spec,
            &|key| {
                env.iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, value)| value.clone())
            },
            &|| Some("osuser".into()),
        )
    }

    fn target(spec: &str) -> Target {
        parse(spec, &[]).expect("a valid target")
    }

    #[test]
    fn a_url_gives_every_part() {
        let target = target(
            "postgres://alice:p%40ss@db.example:6543/locks?sslmode=verify-full&connect_timeout=3",
        );
        assert_eq!(target.hosts, [Host::Tcp("db.example".into())]);
        assert_eq!(target.ports, [6543]);
        assert_eq!(target.user, "alice");
        assert_eq!(target.password(), Some("p@ss"));
        assert_eq!(target.dbname, "locks");
        assert_eq!(target.tls.mode, SslMode::VerifyFull);
        assert_eq!(target.connect_timeout, Duration::from_secs(3));
        assert_eq!(target.application_name, "lockrun");
    }

    #[test]
    fn a_url_may_list_hosts_ipv6_and_a_socket_directory() {
        let target =
            target("postgresql://[::1]:5433,h2,%2Frun%2Fpg/db?target_session_attrs=read-write");
        assert_eq!(
            target.hosts,
            [
                Host::Tcp("::1".into()),
                Host::Tcp("h2".into()),
                Host::Socket("/run/pg".into())
            ]
        );
        assert_eq!(target.ports, [5433, 5432, 5432]);
        assert!(target.read_write);
        assert_eq!(
            target.to_string(),
            "postgres://osuser@[::1]:5433,h2:5432,%2Frun%2Fpg:5432/db"
        );
    }

    #[test]
    fn a_conninfo_string_gives_every_part_with_quotes_and_escapes() {
        let target = target(
            r"host=h port = 5434 user=bob password='it\'s quoted' dbname=d\ b sslmode=disable",
        );
        assert_eq!(target.hosts, [Host::Tcp("h".into())]);
        assert_eq!(target.ports, [5434]);
        assert_eq!(target.user, "bob");
        assert_eq!(target.password(), Some("it's quoted"));
        assert_eq!(target.dbname, "d b");
        assert_eq!(target.tls.mode, SslMode::Disable);
        assert_eq!(self::target(r"password=a\\b").password(), Some(r"a\b"));
    }

    #[test]
    fn libpq_environment_fills_what_the_string_leaves_out() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "6000"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpass"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "require"),
            ("PGCONNECT_TIMEOUT", "7"),
            ("PGSSLROOTCERT", "system"),
        ];
        let target = parse("", &env).unwrap();
        assert_eq!(target.hosts, [Host::Tcp("envhost".into())]);
        assert_eq!(target.ports, [6000]);
        assert_eq!(target.user, "envuser");
        assert_eq!(target.password(), Some("envpass"));
        assert_eq!(target.dbname, "envdb");
        assert_eq!(target.tls.mode, SslMode::Require);
        assert_eq!(target.tls.roots, Some(Roots::System));
        assert_eq!(target.connect_timeout, Duration::from_secs(7));
        let target = parse("postgres://u@h:1/d?sslmode=disable", &env).unwrap();
        assert_eq!(
            (
                target.user.as_str(),
                target.ports[0],
                target.dbname.as_str()
            ),
            ("u", 1, "d")
        );
        assert_eq!(target.tls.mode, SslMode::Disable);
        assert_eq!(target.password(), Some("envpass"));
    }

    #[test]
    fn without_anything_it_is_the_os_user_on_the_local_socket() {
        let target = target("");
        assert!(
            matches!(&target.hosts[..], [Host::Socket(dir)] if SOCKET_DIRS.iter().any(|d| dir == Path::new(d)))
        );
        assert_eq!(target.ports, [5432]);
        assert_eq!(
            (target.user.as_str(), target.dbname.as_str()),
            ("osuser", "osuser")
        );
        assert_eq!(target.tls.mode, SslMode::Prefer);
        assert_eq!(target.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(target.password(), None);
        assert_eq!(
            target.connect_timeout,
            parse("connect_timeout=0", &[]).unwrap().connect_timeout
        );
    }

    #[test]
    fn the_password_never_shows() {
        for spec in [
            "postgres://alice:s3cr%2Ft@h/db",
            "postgres://alice@h/db?password=s3cr%2Ft",
            "host=h user=alice dbname=db password='s3cr/t'",
        ] {
            let target = target(spec);
            assert_eq!(
                target.to_string(),
                "postgres://alice:***@h:5432/db",
                "{spec}"
            );
            assert_eq!(
                format!("{target:?}"),
                "Target(postgres://alice:***@h:5432/db)"
            );
            assert_eq!(
                target.scrub("FATAL: s3cr/t rejected in postgres://alice:s3cr%2Ft@h"),
                "FATAL: *** rejected in postgres://alice:***@h"
            );
        }
        assert_eq!(
            target("postgres://a@%2Ftmp/d?sslmode=verify-ca").to_string(),
            "postgres://a@%2Ftmp:5432/d?sslmode=verify-ca"
        );
    }

    #[test]
    fn bad_strings_are_usage_errors_that_do_not_repeat_the_password() {
        for spec in [
            "postgres://u:s3cret@h:notaport/d",
            "postgres://u:s3cret@h:0/d",
            "postgres://u:s3cret%zz@h/d",
            "postgres://u:s3cret@[::1/d",
            "postgres://u:s3cret@h/d?sslmode=allow",
            "postgres://u:s3cret@h/d?sslmode=maybe",
            "postgres://u:s3cret@h/d?sslcert=/x",
            "postgres://u:s3cret@h/d?nonsense",
            "postgres://u:s3cret@h1,h2:1,h3:2/d?port=1,2",
            "mysql://u:s3cret@h/d",
            "host=h password='s3cret",
            "host=h password s3cret",
            "password=s3cret connect_timeout=soon",
            "password=s3cret target_session_attrs=standby",
        ] {
            let Err(failure) = parse(spec, &[]) else {
                panic!("accepted {spec}");
            };
            assert_eq!(failure.kind(), Kind::Permanent, "{spec}");
            assert!(!failure.to_string().contains("s3cret"), "{spec}: {failure}");
            assert!(
                failure.to_string().starts_with("--postgres-url: "),
                "{failure}"
            );
        }
    }
}
