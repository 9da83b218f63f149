//! A blocking session with PostgreSQL in which every call has a hard deadline.
//!
//! lockrun's supervisor is single-threaded and must stop its command before
//! a lease it cannot renew runs out, so no call may block past the time it
//! was given. The `postgres` crate's blocking client has no such limit: a
//! server that goes silent mid-call (a network partition, a frozen host)
//! leaves it waiting until TCP gives up. This session drives tokio-postgres
//! on a runtime of its own, on the calling thread, and races every call
//! against a timer; a call that runs out of time ends the connection, since
//! its reply could still arrive and be taken for the next call's.
//!
//! Two things back the timer up. TCP keepalives and `tcp_user_timeout` make
//! the kernel drop a connection whose peer is gone within seconds, even when
//! lockrun is not calling (a waiter that sits on LISTEN). And a transaction
//! sets `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout` for itself (`SET LOCAL`, which works
//! behind a transaction-pooling pgbouncer, unlike startup options), so that the
//! server, too, gives up on a transaction whose client has gone, and releases
//! its row locks.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::RngExt;
use tokio::runtime::Runtime;
use tokio_postgres::config::{SslMode as WireSslMode, TargetSessionAttrs};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{
    AsyncMessage, Client, Config, Connection, Notification, Row, SimpleQueryMessage, Socket,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::failure::{CallError, describe};
use super::resolve::{self, Address};
use super::target::{SslMode, Target};
use super::tls;
use crate::backend::net::probe::{self, Protocol};
use crate::backend::net::{Deadline, Failure, Kind};

/// Idle time before the first keepalive probe, the time between probes, and
/// how many go unanswered before the kernel drops the connection: a dead
/// peer is noticed within about 8 seconds of silence.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may go unacknowledged before the kernel drops the
/// connection; covers a peer that vanished while lockrun was sending.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(8);

type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// A statement for [`Session::transact`]: its SQL and its parameters, each with its type.
pub type Statement<'a> = (&'a str, &'a [(&'a (dyn ToSql + Sync), Type)]);

/// How lockrun reaches a server: the target, and TLS set up for it once
/// (loading the system's root certificates is not free, and a waiter far back
/// in line connects anew for every look).
pub struct Connector {
    target: Target,
    tls: MakeRustlsConnect,
}

impl Connector {
    pub fn new(target: Target) -> Result<Self, Failure> {
        Ok(Self {
            tls: tls::connector(&target)?,
            target,
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Connects to the first place of the target's that answers (each host in
    /// turn, a name's addresses in the order name resolution gives them),
    /// within `within` in all and the target's `connect_timeout` for each place.
    /// When none answers, the last failure says why.
    pub fn connect(&self, within: Duration) -> Result<Session, Failure> {
        let deadline = Deadline::after(within);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|err| Failure::new(Kind::Bug, format!("cannot start a runtime: {err}")))?;
        let target = &self.target;
        let mut failure = None;
        for endpoint in resolve::endpoints(target) {
            let endpoint = match endpoint {
                Ok(endpoint) => endpoint,
                Err(unresolved) => {
                    failure = Some(unresolved);
                    continue;
                }
            };
            let mut crowded = Crowded::default();
            let connect = loop {
                let connect = self.attempt(&runtime, &endpoint, deadline, within);
                match connect {
                    Err(CallError::Postgres(ref err)) if is_full(err) => {
                        let Some(step) = crowded.next_step(deadline) else {
                            break connect;
                        };
                        std::thread::sleep(step);
                    }
                    connect => break connect,
                }
            };
            match connect {
                Ok((client, connection)) => {
                    return Ok(Session {
                        runtime,
                        client,
                        connection,
                        broken: false,
                        notifications: VecDeque::new(),
                        target: target.clone(),
                    });
                }
                Err(trouble) => {
                    let out_of_time = matches!(trouble, CallError::Unanswered(_));
                    failure = Some(describe(target, "connect", &trouble));
                    if out_of_time {
                        break;
                    }
                }
            }
        }
        Err(failure.unwrap_or_else(|| {
            Failure::new(
                Kind::Unreachable,
                format!("PostgreSQL at {target}: connect failed: no address to connect to"),
            )
        }))
    }

    /// One try at a session with `endpoint`, before `deadline` (`within` from the start).
    fn attempt(
        &self,
        runtime: &Runtime,
        endpoint: &Address,
        deadline: Deadline,
        within: Duration,
    ) -> Result<(Client, Connection<Socket, TlsStream>), CallError> {
        let left = deadline.remaining();
        let mut config = config(&self.target, endpoint);
        // The socket gets half the time, so that a connection that was not made fails
        // as unreachable before the deadline: one still starting at the deadline was
        // accepted by a server too busy to answer (a fleet's cron minute).
        config.connect_timeout(self.target.connect_timeout.min(left / 2));
        runtime.block_on(async {
            let mut attempt = pin!(config.connect(self.tls.clone()));
            if let Ok(connected) = tokio::time::timeout(left.min(ASK_AFTER), &mut attempt).await {
                return connected.map_err(CallError::from);
            }
            // Silent so far: perhaps a server of another kind, which waits for more.
            if let Some(other) = speaks_another_protocol(endpoint, deadline) {
                return Err(CallError::Foreign(other));
            }
            tokio::time::timeout(deadline.remaining(), attempt)
                .await
                .map_err(|_| CallError::Unanswered(within))?
                .map_err(CallError::from)
        })
    }
}

/// The first short step after "too many clients" (SQLSTATE 53300), growing
/// by half each time up to the last: jittered, so that a herd that found the
/// server full comes back spread out, and short, since a connection frees as
/// soon as one of the runs ahead of it has its answer.
const CROWDED_FIRST_STEP: Duration = Duration::from_millis(20);
const CROWDED_LAST_STEP: Duration = Duration::from_millis(160);

/// The short steps of one connection's retries on a full server.
struct Crowded {
    step: Duration,
}

impl Default for Crowded {
    fn default() -> Self {
        Self {
            step: CROWDED_FIRST_STEP,
        }
    }
}

impl Crowded {
    /// How long to wait before asking again, jittered: none when the wait and
    /// another try would not fit before `deadline` (the trouble is then the
    /// caller's to ride out).
    fn next_step(&mut self, deadline: Deadline) -> Option<Duration> {
        let step = self.step.mul_f64(rand::rng().random_range(0.5..1.5));
        self.step = self.step.mul_f64(1.5).min(CROWDED_LAST_STEP);
        (deadline.remaining() > step + CROWDED_LAST_STEP).then_some(step)
    }
}

/// Whether the server refused the session for having too many clients.
fn is_full(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::TOO_MANY_CONNECTIONS)
}

/// How long a server may keep silent at a new connection before lockrun asks
/// what it speaks: PostgreSQL answers at once unless too busy, while Redis or
/// etcd keep waiting for more of what they take for a request of theirs.
const ASK_AFTER: Duration = Duration::from_millis(500);

/// The protocol of another kind that the server at `endpoint` speaks, if it
/// does (docs/guide.md: "When the server has trouble").
fn speaks_another_protocol(endpoint: &Address, deadline: Deadline) -> Option<Protocol> {
    let Address::Tcp { address, port, .. } = endpoint else {
        return None;
    };
    let candidates = [Protocol::Redis, Protocol::Http];
    probe::identify(&address.to_string(), *port, &candidates, deadline)
}

/// One connection to PostgreSQL.
pub struct Session {
    runtime: Runtime,
    client: Client,
    connection: Connection<Socket, TlsStream>,
    /// The connection has ended, or a call timed out: the session is of no
    /// further use, and the backend should connect anew.
    broken: bool,
    /// Notifications that arrived during calls, for [`Session::notification`].
    notifications: VecDeque<Notification>,
    target: Target,
}

impl Session {
    /// The server as messages show it: the target, redacted.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The server's major version, as it said when the session started.
    pub fn server_major(&self) -> Option<u32> {
        let version = self.connection.parameter("server_version")?;
        version.split(['.', ' ']).next()?.parse().ok()
    }

    /// Whether the session can take more calls; after a lost connection or a
    /// timed-out call it cannot, and the backend should connect anew.
    pub fn is_usable(&self) -> bool {
        !self.broken
    }

    /// Runs `work` (statements outside a transaction: each commits by itself)
    /// and waits for it `within` this long at most; `what` names it in messages.
    pub fn call<T>(
        &mut self,
        what: &str,
        within: Duration,
        work: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, Failure> {
        self.drive(within, work)
            .map_err(|trouble| describe(&self.target, what, &trouble))
    }

    /// Runs `work` in one transaction, committed when it succeeds and rolled
    /// back otherwise, all within `within`. The server's own timeouts are set
    /// for the transaction to `within` too, so it never outlives its client.
    /// Work whose statements do not depend on each other's answers takes one
    /// round trip less with [`Session::transact`].
    pub fn transaction<T>(
        &mut self,
        what: &str,
        within: Duration,
        work: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, Failure> {
        let deadline = Deadline::after(within);
        let begin_with_limits = begin_with_limits(within);
        let result = self.drive(within, async |client: &Client| {
            // BEGIN goes out in the same write as the work's first statement,
            // saving a round trip. Should that batch fail, the transaction is
            // aborted, so the work's statements fail too: none runs outside it.
            let (begun, done) = both(client.batch_execute(&begin_with_limits), work(client)).await;
            begun?;
            let value = done?;
            client.batch_execute("COMMIT").await?;
            Ok(value)
        });
        self.end_failed(&result, &deadline);
        result.map_err(|trouble| describe(&self.target, what, &trouble))
    }

    /// Runs `statements`, their values written into their text, in one
    /// transaction sent as one message (with BEGIN and COMMIT), within
    /// `within`: the server answers them all at once, where [`Session::transact`]
    /// has it answer each statement on its own. Returns how many rows each
    /// returned or changed; a failing statement rolls the transaction back
    /// and is the failure returned.
    pub fn transact_written(
        &mut self,
        what: &str,
        within: Duration,
        statements: &[String],
    ) -> Result<Vec<u64>, Failure> {
        let deadline = Deadline::after(within);
        let text = format!(
            "{}; {}; COMMIT",
            begin_with_limits(within),
            statements.join("; ")
        );
        let result = self.drive(within, async |client: &Client| {
            client.simple_query(&text).await
        });
        self.end_failed(&result, &deadline);
        let messages = result.map_err(|trouble| describe(&self.target, what, &trouble))?;
        let counts: Vec<u64> = messages
            .iter()
            .filter_map(|message| match message {
                SimpleQueryMessage::CommandComplete(count) => Some(*count),
                _ => None,
            })
            .collect();
        // BEGIN and its limits come first, COMMIT last.
        let ours = counts.len().saturating_sub(statements.len() + 1);
        Ok(counts[ours..counts.len().saturating_sub(1)].to_vec())
    }

    /// A server error leaves a transaction aborted: ends it, in the time
    /// left, so that the session stays usable. Failing that, the session is broken.
    fn end_failed<T>(&mut self, result: &Result<T, CallError>, deadline: &Deadline) {
        if result.is_err() && !self.broken {
            let left = deadline.remaining();
            let _ = self.drive(left, async |client: &Client| {
                client.batch_execute("ROLLBACK").await
            });
        }
    }

    /// Runs `statements` in order in one transaction, in one round trip:
    /// BEGIN (with the server's timeouts, as in [`Session::transaction`]),
    /// the statements and COMMIT go out in one write. Each statement sees
    /// what the ones before it did. Returns the rows of each; a failing
    /// statement aborts the transaction (the ones after it fail too, and
    /// COMMIT rolls it back) and is the failure returned. With `listen_on`,
    /// the session LISTENs on that channel in a transaction of its own,
    /// committed just before in the same write: what a notification sent
    /// before that commit said, the statements see, and every one sent after
    /// it reaches us.
    pub fn transact(
        &mut self,
        listen_on: Option<&str>,
        what: &str,
        within: Duration,
        statements: &[Statement],
    ) -> Result<Vec<Vec<Row>>, Failure> {
        let begin = match listen_on {
            Some(channel) => {
                let limits = begin_with_limits(within);
                format!("{limits}; LISTEN \"{channel}\"; COMMIT; {limits}")
            }
            None => begin_with_limits(within),
        };
        self.drive(within, async |client: &Client| {
            let mut steps: Vec<Step> = Vec::with_capacity(statements.len() + 2);
            steps.push(Box::pin(async {
                client.batch_execute(&begin).await.map(|()| Vec::new())
            }));
            for (sql, params) in statements {
                steps.push(Box::pin(client.query_typed(sql, params)));
            }
            steps.push(Box::pin(async {
                client.batch_execute("COMMIT").await.map(|()| Vec::new())
            }));
            let mut results = all(steps).await.into_iter();
            results.next().expect("BEGIN's result")?;
            let rows = results
                .by_ref()
                .take(statements.len())
                .collect::<Result<Vec<_>, _>>()?;
            results.next().expect("COMMIT's result")?;
            Ok(rows)
        })
        .map_err(|trouble| describe(&self.target, what, &trouble))
    }

    /// How many notifications arrived so far, unread.
    pub fn queued_notifications(&self) -> usize {
        self.notifications.len()
    }

    /// Waits up to `within` for a notification on a channel this session
    /// LISTENs to (`None`: none came); notifications that arrived during
    /// earlier calls come first.
    pub fn notification(&mut self, within: Duration) -> Result<Option<Notification>, Failure> {
        if let Some(notification) = self.notifications.pop_front() {
            return Ok(Some(notification));
        }
        match self.drive_until_notified(within) {
            Ok(notification) => Ok(Some(notification)),
            Err(CallError::TimedOut(_)) if !self.broken => Ok(None),
            Err(trouble) => Err(describe(&self.target, "wait for a notification", &trouble)),
        }
    }

    /// Polls `work` and the connection together until `work` is done, the
    /// connection ends, or `within` passes. Anything but a server error from
    /// `work` breaks the session: its connection is gone, or a reply to a
    /// call that ran out of time may still arrive.
    fn drive<T>(
        &mut self,
        within: Duration,
        work: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, CallError> {
        let Self {
            runtime,
            client,
            connection,
            broken,
            notifications,
            ..
        } = self;
        let mut work = pin!(work(client));
        let mut done = None;
        let pumped = pump(
            runtime,
            connection,
            notifications,
            broken,
            within,
            &mut |cx, _| work.as_mut().poll(cx).map(|result| done = Some(result)),
        );
        match (pumped, done) {
            (_, Some(Ok(value))) => Ok(value),
            (_, Some(Err(err))) => {
                if err.as_db_error().is_none() {
                    self.broken = true;
                }
                Err(CallError::Postgres(err))
            }
            (Err(trouble), None) => {
                self.broken = true;
                Err(trouble)
            }
            (Ok(()), None) => unreachable!("the work was done without a result"),
        }
    }

    /// Waits up to `within` for a notification, reading what the server sends.
    fn drive_until_notified(&mut self, within: Duration) -> Result<Notification, CallError> {
        let Self {
            runtime,
            connection,
            broken,
            notifications,
            ..
        } = self;
        let mut found = None;
        pump(
            runtime,
            connection,
            notifications,
            broken,
            within,
            &mut |_, notifications| match notifications.pop_front() {
                Some(notification) => {
                    found = Some(notification);
                    Poll::Ready(())
                }
                None => Poll::Pending,
            },
        )?;
        Ok(found.expect("a notification was found"))
    }
}

/// The one loop on the session's runtime: reads what the server sends
/// (keeping notifications), writes what calls queued, and polls `step` after
/// every wake-up, until `step` is ready, the connection ends or fails (which
/// marks the session `broken`), or `within` passes.
fn pump(
    runtime: &Runtime,
    connection: &mut Connection<Socket, TlsStream>,
    notifications: &mut VecDeque<Notification>,
    broken: &mut bool,
    within: Duration,
    step: &mut dyn FnMut(&mut Context<'_>, &mut VecDeque<Notification>) -> Poll<()>,
) -> Result<(), CallError> {
    if *broken {
        return Err(CallError::Lost);
    }
    runtime.block_on(async {
        let mut timer = pin!(tokio::time::sleep(within));
        poll_fn(|cx| {
            loop {
                match connection.poll_message(cx) {
                    Poll::Ready(Some(Ok(AsyncMessage::Notification(notification)))) => {
                        notifications.push_back(notification);
                    }
                    Poll::Ready(Some(Ok(_))) => {} // a notice
                    Poll::Ready(Some(Err(err))) => {
                        *broken = true;
                        return Poll::Ready(Err(CallError::Postgres(err)));
                    }
                    Poll::Ready(None) => {
                        *broken = true;
                        return Poll::Ready(Err(CallError::Lost));
                    }
                    Poll::Pending => break,
                }
            }
            if step(cx, notifications).is_ready() {
                return Poll::Ready(Ok(()));
            }
            timer
                .as_mut()
                .poll(cx)
                .map(|()| Err(CallError::TimedOut(within)))
        })
        .await
    })
}

/// `BEGIN`, and the server's timeouts for the transaction: statements, lock
/// waits and the client's silence are limited to `within`, so that a
/// transaction never outlives its client (nor holds its row locks longer).
fn begin_with_limits(within: Duration) -> String {
    // Whole milliseconds, at least one: zero would mean no limit at all.
    let limit = within.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "BEGIN; SET LOCAL statement_timeout = {limit}; SET LOCAL lock_timeout = {limit}; \
         SET LOCAL idle_in_transaction_session_timeout = {limit}"
    )
}

/// One step of [`Session::transact`], boxed so that steps of different kinds line up.
type Step<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + 'a>>;

/// The futures, polled together and in order, so that the requests they send
/// go out in order and in one write; their outputs in the same order.
async fn all<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + '_>>>) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none()
                && let Poll::Ready(value) = future.as_mut().poll(cx)
            {
                *output = Some(value);
            }
        }
        if outputs.iter().all(Option::is_some) {
            Poll::Ready(
                outputs
                    .iter_mut()
                    .map(|output| output.take().unwrap())
                    .collect(),
            )
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Both futures, polled together, so that requests they send go out in one write.
async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut a_done, mut b_done) = (None, None);
    poll_fn(|cx| {
        if a_done.is_none()
            && let Poll::Ready(output) = a.as_mut().poll(cx)
        {
            a_done = Some(output);
        }
        if b_done.is_none()
            && let Poll::Ready(output) = b.as_mut().poll(cx)
        {
            b_done = Some(output);
        }
        if a_done.is_some() && b_done.is_some() {
            Poll::Ready((a_done.take().unwrap(), b_done.take().unwrap()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// tokio-postgres's configuration for one place of `target`'s, with lockrun's keepalives.
fn config(target: &Target, endpoint: &Address) -> Config {
    let mut config = Config::new();
    let (port, ssl_mode) = match endpoint {
        Address::Tcp {
            name,
            address,
            port,
        } => {
            config.host(name).hostaddr(*address);
            (*port, wire_ssl_mode(target.tls.mode))
        }
        // No TLS on a Unix socket, as in libpq.
        Address::Socket { dir, port } => {
            config.host_path(dir);
            (*port, WireSslMode::Disable)
        }
    };
    config
        .port(port)
        .user(&target.user)
        .dbname(&target.dbname)
        .application_name(&target.application_name)
        .connect_timeout(target.connect_timeout)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT)
        .ssl_mode(ssl_mode);
    if let Some(password) = target.password() {
        config.password(password);
    }
    if target.read_write {
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    config
}

/// The protocol's side of `sslmode` (the certificate checks are in the TLS connector).
fn wire_ssl_mode(mode: SslMode) -> WireSslMode {
    match mode {
        SslMode::Disable => WireSslMode::Disable,
        SslMode::Prefer => WireSslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireSslMode::Require,
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    fn target(port: u16) -> Target {
        let spec = format!("host=127.0.0.1 port={port} user=u password=s3cret sslmode=disable");
        Target::parse_with(&spec, &|_| None, &|| None).unwrap()
    }

    fn connect_failure(target: &Target, within: Duration) -> Failure {
        match Connector::new(target.clone()).unwrap().connect(within) {
            Ok(_) => panic!("connected to {target}"),
            Err(failure) => failure,
        }
    }

    #[test]
    fn a_server_too_busy_to_answer_is_transient_and_one_not_there_unreachable() {
        // Connections queue in the listener's backlog, as a busy server's do; nothing answers them.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = target(silent.local_addr().unwrap().port());
        let started = Instant::now();
        let failure = connect_failure(&target, Duration::from_millis(200));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(failure.kind(), Kind::Transient);
        assert_eq!(
            failure.to_string(),
            format!(
                "PostgreSQL at {target}: connect failed: connected, but the server did not answer within 200ms"
            )
        );
        drop(silent);
        let failure = connect_failure(&target, Duration::from_secs(5));
        assert_eq!(failure.kind(), Kind::Unreachable);
        assert!(failure.to_string().contains("refused"), "{failure}");
        assert!(!failure.to_string().contains("s3cret"), "{failure}");
    }
}
