//! One admission rule, one table (docs/guide.md: "Shared locks", "Slots", "The
//! waiting line"). The rule is `Request::admitted`; each backend applies it in
//! its own code: the file backend, SQLite, etcd and S3's look in Rust, PostgreSQL's
//! take and wake in SQL, Redis's acquire, front and release in Lua. Every row
//! is checked against the rule itself and then run against the real store of
//! every backend (Redis Cluster too), the 1,024-sharer boundary included.
//!
//! A row's holders and the waiters ahead are put in place through the
//! library's `Store`, as a lockrun on another host would (so no liveness
//! check of this host reclaims them); of 1,024 sharers, one is, and the rest
//! are copies of its record written into the store. The run a row asks
//! about is the real binary: `-n` says admitted (0, with its
//! `LOCKRUN_SLOT`), busy (75) or another `-p` (64). In a release row the
//! waiters are real lockruns, waiting on the store's own wake-ups (their
//! retries are slower than the test's patience), and a holder lets go: the
//! waiters the rule lets in next must start, and no other.

use std::ffi::OsString;
use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use Mode::{Exclusive as X, Shared as S};
use lockrun::backend::{self, Attempt, Mode, Owner, Request, Slot};
use lockrun::identity::{Process, new_token};
use lockrun::name::Name;
use lockrun::platform::clock::Moment;
use lockrun::timing::Plan;

use crate::support::*;

/// The planted holders' and waiters' leases: longer than any row takes, so none lapses.
const TTL: Duration = Duration::from_secs(60);
/// How long the waiters the rule lets in may take to start after a release.
const PROMPTLY: Duration = Duration::from_secs(5);
/// The `-w` of a waiter that leaves the line: long enough to join it first.
const LEAVES_AFTER: &str = "2s";
/// A window to see a waiter let in that the rule keeps out, not a wait for anything.
const WINDOW: Duration = Duration::from_millis(200);

/// Above this many holders, one holder is planted by a look and the rest are
/// copies of its record: looks read every holder (on most backends), so
/// 1,024 looks would take minutes in a debug build, and on etcd outlast the
/// first leases.
const COPIED_FROM: usize = 16;

/// What a run with `-n` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Exit 0, in the lowest free slot.
    Admitted,
    /// Exit 75.
    Busy,
    /// Exit 64: the name is held or waited for with another `-p`.
    OtherParallelism,
}
use Outcome::{Admitted, Busy, OtherParallelism};

/// A name's holders (mode and slot) and the waiters ahead (in line order),
/// all with `-p parallelism`, and runs asked about: (mode, `-p`, outcome).
struct Row {
    what: &'static str,
    parallelism: u32,
    holders: Vec<(Mode, u32)>,
    ahead: Vec<Mode>,
    runs: Vec<(Mode, u32, Outcome)>,
}

fn row(
    what: &'static str,
    parallelism: u32,
    holders: &[(Mode, u32)],
    ahead: &[Mode],
    runs: &[(Mode, u32, Outcome)],
) -> Row {
    Row {
        what,
        parallelism,
        holders: holders.to_vec(),
        ahead: ahead.to_vec(),
        runs: runs.to_vec(),
    }
}

/// Sharers in each of the slots from 0 below `count` but `gap`.
fn sharers(count: u32, gap: Option<u32>) -> Vec<(Mode, u32)> {
    (0..count)
        .filter(|&slot| Some(slot) != gap)
        .map(|slot| (S, slot))
        .collect()
}

fn rows() -> Vec<Row> {
    let max = backend::MAX_SHARERS;
    let mut rows = vec![
        row(
            "nothing held",
            1,
            &[],
            &[],
            &[(X, 1, Admitted), (S, 1, Admitted)],
        ),
        row(
            "a writer holds",
            1,
            &[(X, 0)],
            &[],
            &[(X, 1, Busy), (S, 1, Busy)],
        ),
        row(
            "a reader holds: it fills the one slot for a writer",
            1,
            &[(S, 0)],
            &[],
            &[(X, 1, Busy), (S, 1, Admitted)],
        ),
        row(
            "readers hold around a free slot number",
            1,
            &[(S, 0), (S, 2)],
            &[],
            &[(S, 1, Admitted)],
        ),
        row(
            "a reader holds, a writer waits: no reader overtakes it",
            1,
            &[(S, 0)],
            &[X],
            &[(S, 1, Busy), (X, 1, Busy)],
        ),
        row(
            "a reader holds, a writer and a reader wait",
            1,
            &[(S, 0)],
            &[X, S],
            &[(S, 1, Busy)],
        ),
        row(
            "a writer holds, readers wait",
            1,
            &[(X, 0)],
            &[S, S],
            &[(S, 1, Busy), (X, 1, Busy)],
        ),
        row(
            "two of three slots held, the middle one free",
            3,
            &[(X, 0), (X, 2)],
            &[],
            &[(X, 3, Admitted), (X, 2, OtherParallelism)],
        ),
        row(
            "three of three slots held, one waits",
            3,
            &[(X, 0), (X, 1), (X, 2)],
            &[X],
            &[(X, 3, Busy), (X, 1, OtherParallelism)],
        ),
    ];
    rows.push(Row {
        what: "1,023 sharers, slot 700 free: one more fits",
        parallelism: 1,
        holders: sharers(max, Some(700)),
        ahead: Vec::new(),
        runs: vec![(S, 1, Admitted), (X, 1, Busy)],
    });
    rows.push(Row {
        what: "1,024 sharers: a further sharer waits",
        parallelism: 1,
        holders: sharers(max, None),
        ahead: Vec::new(),
        runs: vec![(S, 1, Busy), (X, 1, Busy)],
    });
    rows
}

/// What the rule says a run of `mode` with `-p parallelism` gets.
fn ruled(row: &Row, mode: Mode, parallelism: u32) -> Outcome {
    let occupied = !row.holders.is_empty() || !row.ahead.is_empty();
    if occupied && backend::refuses(Some(row.parallelism), parallelism) {
        return OtherParallelism;
    }
    let holders = row.holders.iter().map(|&(mode, _)| mode);
    if backend::admitted(mode, parallelism, holders, row.ahead.iter().copied()) {
        Admitted
    } else {
        Busy
    }
}

/// The lowest slot number no holder has.
fn lowest_free(holders: &[u32]) -> u32 {
    (0..=backend::MAX_SHARERS)
        .find(|slot| !holders.contains(slot))
        .expect("a free number")
}

/// A release row: holders and waiters (in line order, real lockruns), then
/// steps, each followed by the waiters it lets in (by their place in line).
struct ReleaseRow {
    what: &'static str,
    parallelism: u32,
    holders: Vec<(Mode, u32)>,
    waiters: Vec<Mode>,
    steps: Vec<(Step, Vec<usize>)>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The planted holder of this slot lets go.
    Holder(u32),
    /// Every waiter let in so far lets go.
    LetIn,
    /// The waiter at this place gives up (its `-w`, `LEAVES_AFTER`, runs
    /// out: a step it must come first in) and leaves the line.
    Leave(usize),
    /// The waiter at this place is killed (SIGKILL) in line.
    Kill(usize),
}

fn release_rows() -> Vec<ReleaseRow> {
    let max = backend::MAX_SHARERS;
    vec![
        ReleaseRow {
            what: "a writer lets go: the writer at the head goes alone",
            parallelism: 1,
            holders: vec![(X, 0)],
            waiters: vec![X, X],
            steps: vec![(Step::Holder(0), vec![0]), (Step::LetIn, vec![1])],
        },
        ReleaseRow {
            what: "a writer lets go: the readers at the head go together, up to the next writer",
            parallelism: 1,
            holders: vec![(X, 0)],
            waiters: vec![S, S, X, S],
            steps: vec![
                (Step::Holder(0), vec![0, 1]),
                (Step::LetIn, vec![2]),
                (Step::LetIn, vec![3]),
            ],
        },
        ReleaseRow {
            what: "readers let go one by one: the writer waits for the last",
            parallelism: 1,
            holders: vec![(S, 0), (S, 1)],
            waiters: vec![X, S],
            steps: vec![
                (Step::Holder(1), vec![]),
                (Step::Holder(0), vec![0]),
                (Step::LetIn, vec![1]),
            ],
        },
        ReleaseRow {
            what: "a writer in line leaves: the reader behind waits on for the writer ahead",
            parallelism: 1,
            holders: vec![(X, 0)],
            waiters: vec![X, X, S],
            steps: vec![
                (Step::Leave(1), vec![]),
                (Step::Holder(0), vec![0]),
                (Step::LetIn, vec![2]),
            ],
        },
        ReleaseRow {
            what: "three slots: each freed slot goes to the head of the line",
            parallelism: 3,
            holders: vec![(X, 0), (X, 1), (X, 2)],
            waiters: vec![X, X, X, X],
            steps: vec![
                (Step::Holder(1), vec![0]),
                (Step::Holder(0), vec![1]),
                (Step::LetIn, vec![2, 3]),
            ],
        },
        ReleaseRow {
            what: "1,024 sharers: a freed share slot goes to the sharer waiting, not the writer",
            parallelism: 1,
            holders: sharers(max, None),
            waiters: vec![S, X],
            steps: vec![(Step::Holder(0), vec![0]), (Step::LetIn, vec![])],
        },
    ]
}

/// The waiters (by place) that the rule lets in once `holders` hold and
/// `waiting` wait, in line order: each judged by `Request::admitted`
/// behind the ones still waiting ahead of it, beside the ones let in.
fn let_in_by_rule(parallelism: u32, holders: &[Mode], waiting: &[(usize, Mode)]) -> Vec<usize> {
    let mut holders = holders.to_vec();
    let mut still = Vec::new();
    let mut let_in = Vec::new();
    for &(place, mode) in waiting {
        if backend::admitted(
            mode,
            parallelism,
            holders.iter().copied(),
            still.iter().copied(),
        ) {
            holders.push(mode);
            let_in.push(place);
        } else {
            still.push(mode);
        }
    }
    let_in
}

/// The store a lockrun with `store`'s flags opens, opened through the library.
fn open(store: &Store) -> Box<dyn backend::Store> {
    let mut args: Vec<OsString> = vec!["lockrun".into()];
    args.extend(store.args().iter().cloned());
    args.extend(["--name".into(), "x".into(), "true".into()]);
    let cli = lockrun::cli::parse(args).unwrap_or_else(|code| panic!("flags refused: {code}"));
    #[cfg(feature = "s3")]
    if store.kind == "s3" {
        // This process has not the identity a lockrun gets in its environment.
        let common = backend::Common {
            prefix: &cli.run.store.prefix,
            create: true,
            from_variables: &[],
        };
        return cli
            .run
            .store
            .s3
            .open_with(&common, &s3::identity)
            .expect("open the store");
    }
    cli.run.store.open(true).expect("open the store")
}

/// A request for `name` by a run on another host, which this host never judges dead.
fn request(name: &str, mode: Mode, parallelism: u32, queue: bool) -> Request {
    Request {
        name: Name::parse(name).expect("a name"),
        parallelism,
        plan: Plan::new(TTL),
        owner: Owner {
            token: new_token().expect("a token"),
            process: Process {
                pid: 1,
                start_time: 1,
                boot_id: "another-boot".to_owned(),
                host: "elsewhere".to_owned(),
            },
            command: "planted".to_owned(),
            user: String::new(),
            note: None,
            parallelism: Some(parallelism),
            mode,
        },
        queue,
        deadline: Some(Moment::now() + PATIENCE),
    }
}

/// Planted holders and waiters, kept for as long as this lives.
struct Planted {
    holders: Vec<(u32, Box<dyn Slot>)>,
    /// What keeps copied holders in place (on the file backend, their files' locks).
    _copies: Vec<fs::File>,
    _waiters: Vec<Box<dyn backend::Store>>,
}

impl Planted {
    /// `holders` in their slots (the slots from 0 taken in order, then the
    /// ones no holder has let go), then `ahead` in line order, each let in
    /// or kept waiting by the store's own code.
    fn plant(
        store: &Store,
        name: &str,
        parallelism: u32,
        holders: &[(Mode, u32)],
        ahead: &[Mode],
    ) -> Self {
        let mut looker = open(store);
        let by_copies = holders.len() > COPIED_FROM;
        let top = if by_copies {
            1
        } else {
            holders.iter().map(|&(_, slot)| slot + 1).max().unwrap_or(0)
        };
        let mut taken = Vec::new();
        for slot in 0..top {
            let mode = holders
                .iter()
                .find(|h| h.1 == slot)
                .unwrap_or(&holders[0])
                .0;
            match looker.attempt(&request(name, mode, parallelism, false)) {
                Ok(Attempt::Taken(held)) => {
                    assert_eq!(held.number(), slot, "{name}: slots are taken lowest first");
                    taken.push((slot, held));
                }
                Ok(Attempt::Waiting(_)) => panic!("{name}: holder {slot} was kept out"),
                Err(err) => panic!("{name}: holder {slot}: {err}"),
            }
        }
        let mut kept = Vec::new();
        for (slot, held) in taken {
            if holders.iter().any(|h| h.1 == slot) {
                kept.push((slot, held));
            } else {
                held.release(None).expect("let a gap go");
            }
        }
        let mut copies = Vec::new();
        if by_copies {
            assert_eq!(holders[0], (S, 0), "{name}: copies are of slot 0's sharer");
            let slots: Vec<u32> = holders[1..].iter().map(|&(_, slot)| slot).collect();
            copies = copy_holder(store, name, &slots);
        }
        let waiters = ahead
            .iter()
            .enumerate()
            .map(|(place, &mode)| {
                let mut waiter = open(store);
                let request = request(name, mode, parallelism, true);
                // A run may wait a moment before it stands in line, where
                // `status` shows it (docs/guide.md: "The waiting line").
                while {
                    match waiter.attempt(&request) {
                        Ok(Attempt::Waiting(line)) => assert_eq!(line.position, place as u32 + 1),
                        Ok(Attempt::Taken(_)) => panic!("{name}: waiter {place} was let in"),
                        Err(err) => panic!("{name}: waiter {place}: {err}"),
                    }
                    in_line(&mut *waiter, name) <= place
                } {
                    // Not by `wait`: a run not yet in line waits in the kernel, and
                    // the timer that ends it may wake another of this process's threads.
                    std::thread::sleep(Duration::from_millis(10));
                }
                waiter
            })
            .collect();
        Self {
            holders: kept,
            _copies: copies,
            _waiters: waiters,
        }
    }

    /// The planted holder of `slot` lets go.
    fn release(&mut self, slot: u32) {
        let at = self.holders.iter().position(|h| h.0 == slot).expect("held");
        let (_, held) = self.holders.remove(at);
        held.release(None).expect("release");
    }
}

/// The value of `flag` in the store's flags.
fn flag(store: &Store, flag: &str) -> String {
    let args = store.args();
    let at = args.iter().position(|arg| arg == flag).expect("the flag");
    args[at + 1].to_string_lossy().into_owned()
}

/// Sharers in `slots` of `name` beside the one of slot 0: copies of its
/// record, written into the store as its own look wrote it, each with a token
/// of its own. Only the slot number and the token change, so they stay true
/// to whatever else the record holds. Returns what keeps them (file locks).
fn copy_holder(store: &Store, name: &str, slots: &[u32]) -> Vec<fs::File> {
    match store.kind {
        "file" => return copy_file_holder(&store.dir(), name, slots),
        "redis" => copy_redis_holder(&flag(store, "--redis-url"), name, slots),
        "sqlite" => {
            let mut db =
                rusqlite::Connection::open(flag(store, "--db")).expect("open the database");
            db.busy_timeout(PATIENCE).unwrap();
            let tx = db.transaction().unwrap();
            tx.execute(
                "CREATE TEMP TABLE copies AS SELECT * FROM holders WHERE name = ?1 AND slot = 0",
                [name],
            )
            .unwrap();
            let token: String = tx
                .query_row("SELECT token FROM copies", [], |row| row.get(0))
                .unwrap();
            for &slot in slots {
                tx.execute(
                    "UPDATE copies SET slot = ?1, token = ?2",
                    rusqlite::params![slot, format!("{token}-{slot}")],
                )
                .unwrap();
                tx.execute("INSERT INTO holders SELECT * FROM copies", [])
                    .unwrap();
            }
            tx.execute("DROP TABLE copies", []).unwrap();
            tx.commit().unwrap();
        }
        "postgres" => {
            let url = flag(store, "--postgres-url");
            let mut db = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connect");
            let slots: Vec<i32> = slots.iter().map(|&slot| slot.cast_signed()).collect();
            db.execute(
                "INSERT INTO lockrun.holders
                 SELECT (jsonb_populate_record(h, jsonb_build_object(
                           'slot', s, 'token', h.token || '-' || s))).*
                 FROM lockrun.holders AS h, unnest($2::integer[]) AS s
                 WHERE h.name = $1 AND h.slot = 0",
                &[&name.to_owned(), &slots],
            )
            .expect("copy the holder");
        }
        #[cfg(feature = "etcd")]
        "etcd" => copy_etcd_holder(&flag(store, "--etcd-endpoints"), name, slots),
        #[cfg(feature = "s3")]
        "s3" => copy_s3_holder(store, name, slots),
        kind => panic!("no copies on {kind}"),
    }
    Vec::new()
}

/// On the file backend, a sharer holds slot 0's file shared (the gate) and
/// its share file (`STEM.SLOT.shared`, its record in it) exclusively.
fn copy_file_holder(dir: &std::path::Path, name: &str, slots: &[u32]) -> Vec<fs::File> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    let stem = Name::parse(name).unwrap().stem();
    let gate = fs::File::open(dir.join(format!("{stem}.0.lock"))).expect("the gate");
    gate.lock_shared().expect("hold the gate shared");
    let record = fs::read_to_string(dir.join(format!("{stem}.0.shared"))).expect("the record");
    // The record is the file's first JSON value.
    let token = serde_json::Deserializer::from_str(&record)
        .into_iter::<serde_json::Value>()
        .next()
        .and_then(Result::ok)
        .and_then(|record| record["token"].as_str().map(str::to_owned))
        .expect("its token");
    let mut files = vec![gate];
    for &slot in slots {
        let path = dir.join(format!("{stem}.{slot}.shared"));
        let copy = record.replacen(&token, &format!("{token}-{slot}"), 1);
        fs::write(&path, copy).expect("write a copy");
        let file = fs::File::open(&path).expect("open a copy");
        file.lock().expect("lock a copy");
        files.push(file);
    }
    files
}

/// On Redis, a holder is its record at `PREFIX:{STEM}:slot:N`, with the
/// lease's TTL, below `PREFIX:{STEM}:widest`; copied by a script on the
/// name's node (`redis-cli -c` follows a cluster's redirection).
fn copy_redis_holder(url: &str, name: &str, slots: &[u32]) {
    const COPY: &str = "
        local value, ttl = redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])
        local token = cjson.decode(value).token
        local widest = tonumber(redis.call('GET', KEYS[2]) or '0')
        for _, slot in ipairs(ARGV) do
          local copy = string.gsub(value, token, token .. '-' .. slot, 1)
          redis.call('SET', string.gsub(KEYS[1], '0$', slot), copy, 'PX', ttl)
          widest = math.max(widest, tonumber(slot) + 1)
        end
        redis.call('SET', KEYS[2], widest)
        return 1";
    let port = url.rsplit(':').next().expect("a port");
    let base = format!("lockrun:{{{}}}:", Name::parse(name).unwrap().stem());
    let output = run(std::process::Command::new("redis-cli")
        .args(["-c", "-p", port, "EVAL", COPY, "2"])
        .arg(format!("{base}slot:0"))
        .arg(format!("{base}widest"))
        .args(slots.iter().map(u32::to_string)));
    assert_eq!(stdout(&output).trim(), "1", "{}", stderr(&output));
}

/// On etcd, a holder is its place in line (`line/LEASE`, its record) and its
/// slot's key (`slot/N`), both on its lease; the copies' places share one lease
/// of their own and are named after made-up ones.
#[cfg(feature = "etcd")]
fn copy_etcd_holder(endpoints: &str, name: &str, slots: &[u32]) {
    use lockrun::backend::etcd::link::{Client, Endpoints, Keys, Op, Txn};
    let within = PATIENCE;
    let mut etcd = Client::new(Endpoints::parse(endpoints).expect("endpoints"));
    let base = format!("/lockrun/{}/", Name::parse(name).unwrap().stem());
    let listing = etcd
        .range(&Keys::prefix(base.as_bytes()), within)
        .expect("read the holder");
    let place = listing
        .kvs
        .iter()
        .find(|kv| kv.key.starts_with(format!("{base}line/").as_bytes()))
        .expect("its place");
    let slot_key = format!("{base}slot/0");
    let slot_value = &listing
        .kvs
        .iter()
        .find(|kv| kv.key == slot_key.as_bytes())
        .expect("its slot")
        .value;
    let record: serde_json::Value = serde_json::from_slice(&place.value).expect("its record");
    let lease = etcd.lease_grant(TTL, within).expect("a lease").id;
    // etcd takes at most 128 operations in a transaction by default.
    for chunk in slots.chunks(64) {
        let mut txn = Txn::new();
        for &slot in chunk {
            let mut copy = record.clone();
            copy["slot"] = slot.into();
            copy["token"] = format!("{}-{slot}", record["token"].as_str().unwrap()).into();
            let key = format!("{base}line/{:016x}", 0x00c0_b1e5_0000_u64 + u64::from(slot));
            let value = serde_json::to_vec(&copy).unwrap();
            txn = txn
                .then(Op::put(key.as_bytes(), &value, lease))
                .then(Op::put(
                    format!("{base}slot/{slot}").as_bytes(),
                    slot_value,
                    lease,
                ));
        }
        etcd.txn(&txn, within).expect("put the copies");
    }
}

/// On S3, a holder is an entry of its name's state object
/// (`PREFIX/STEM.lock.json`); the copies go in by one compare-and-swap, a
/// write as lockrun makes one: the sequence number one up and a fresh nonce.
#[cfg(feature = "s3")]
fn copy_s3_holder(store: &Store, name: &str, slots: &[u32]) {
    let endpoint = flag(store, "--s3-endpoint");
    let url = flag(store, "--s3-url");
    let prefix = url
        .strip_prefix(&format!("s3://{}/", s3::BUCKET))
        .expect("a prefix");
    let stem = Name::parse(name).unwrap().stem();
    let key = format!("{prefix}/{stem}.lock.json");
    let object = s3::get_object(&endpoint, &key);
    let mut state: serde_json::Value = serde_json::from_slice(&object.body).expect("its state");
    let holders = state["holders"].as_array_mut().expect("its holders");
    let holder = holders
        .iter()
        .find(|holder| holder["slot"] == 0)
        .expect("slot 0's holder")
        .clone();
    let token = holder["token"].as_str().expect("its token");
    for &slot in slots {
        let mut copy = holder.clone();
        copy["slot"] = slot.into();
        copy["token"] = format!("{token}-{slot}").into();
        holders.push(copy);
    }
    state["seq"] = (state["seq"].as_u64().expect("its sequence number") + 1).into();
    state["nonce"] = format!("{:032x}", rand::random::<u128>()).into();
    let body = serde_json::to_vec(&state).unwrap();
    assert!(
        s3::put_object_if_match(&endpoint, &key, &object.etag, body),
        "{name}: the state object changed while the copies were made"
    );
}

/// How many waiters `status` shows in `name`'s line.
fn in_line(store: &mut dyn backend::Store, name: &str) -> usize {
    let name = Name::parse(name).expect("a name");
    let entries = store.list(Some(&name)).expect("the line");
    entries.iter().filter(|entry| entry.position > 0).count()
}

/// What `lockrun -n` in `mode` with `-p parallelism` gets for `name`.
fn ask(store: &Store, name: &str, mode: Mode, parallelism: u32) -> (Outcome, Option<u32>) {
    let mut command = store.lockrun();
    command.args(["--name", name, "-n", "-p", &parallelism.to_string()]);
    if mode == S {
        command.arg("-s");
    }
    let output = run(command.args(["-c", "echo $LOCKRUN_SLOT"]));
    match output.status.code() {
        Some(0) => (Admitted, stdout(&output).trim().parse().ok()),
        Some(75) => (Busy, None),
        Some(64) => (OtherParallelism, None),
        _ => panic!("{name}: {:?}: {}", output.status, stderr(&output)),
    }
}

/// Every row of the table against `store`.
pub fn every_row_agrees_with_the_rule(store: &Store) {
    let started = Instant::now();
    for (number, row) in rows().iter().enumerate() {
        let name = format!("row{number}");
        let planted = Planted::plant(store, &name, row.parallelism, &row.holders, &row.ahead);
        for &(mode, parallelism, expected) in &row.runs {
            let case = format!("{} ({name}), {mode:?} -p {parallelism}", row.what);
            assert_eq!(ruled(row, mode, parallelism), expected, "the rule: {case}");
            let (outcome, slot) = ask(store, &name, mode, parallelism);
            assert_eq!(outcome, expected, "{}: {case}", store.kind);
            if outcome == Admitted {
                let free = lowest_free(
                    &row.holders
                        .iter()
                        .map(|&(_, slot)| slot)
                        .collect::<Vec<_>>(),
                );
                assert_eq!(slot, Some(free), "{}: {case}: its slot", store.kind);
            }
        }
        drop(planted);
    }
    eprintln!("{}: admission rows in {:?}", store.kind, started.elapsed());
}

/// Every release row against `store`.
pub fn every_release_lets_in_whom_the_rule_does(store: &Store) {
    let started = Instant::now();
    for (number, row) in release_rows().iter().enumerate() {
        release_row(store, &format!("release{number}"), row);
    }
    eprintln!("{}: release rows in {:?}", store.kind, started.elapsed());
}

/// Starts the waiter at `place` of `row` once those ahead are in line, and
/// returns once it is: a real lockrun whose command appends "PLACE STEP
/// SLOT" to `served` and holds until `release.PLACE` appears.
fn join_line(
    store: &Store,
    scratch: &Scratch,
    name: &str,
    row: &ReleaseRow,
    place: usize,
) -> Running {
    let events = scratch.path(&format!("events.{place}"));
    let script = format!(
        "echo {place} $(cat '{step}') $LOCKRUN_SLOT >> '{served}'; \
         while [ ! -e '{release}' ]; do sleep 0.02; done",
        step = scratch.path("step").display(),
        served = scratch.path("served").display(),
        release = scratch.path(&format!("release.{place}")).display(),
    );
    let mut command = store.lockrun();
    command.args(["--name", name, "-p", &row.parallelism.to_string()]);
    if row.waiters[place] == S {
        command.arg("-s");
    }
    // Retries, and the looks that keep its place (every TTL/3), later
    // than PROMPTLY: only the store's wake-ups let a waiter in in time.
    let leaves = row
        .steps
        .iter()
        .any(|step| matches!(step.0, Step::Leave(at) if at == place));
    let timeout = if leaves { LEAVES_AFTER } else { "60s" };
    command.args(["--log-format", "json", "--ttl", "60s", "-w", timeout]);
    command.args(["--initial-delay", "60s", "--max-delay", "60s"]);
    let waiter = command
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&events).unwrap())
        .start();
    wait_until(&format!("{name}: waiter {place} to join the line"), || {
        waiting_pids(store, name).last() == Some(&u64::from(waiter.id()))
    });
    waiter
}

fn release_row(store: &Store, name: &str, row: &ReleaseRow) {
    let scratch = Scratch::new();
    let mut planted = Planted::plant(store, name, row.parallelism, &row.holders, &[]);
    let step_file = scratch.path("step");
    fs::write(&step_file, "0").unwrap();
    let mut waiters: Vec<Running> = (0..row.waiters.len())
        .map(|place| join_line(store, &scratch, name, row, place))
        .collect();
    // The rule's view: who holds (by mode and slot), who waits.
    let mut holding: Vec<(Option<usize>, Mode, u32)> = row
        .holders
        .iter()
        .map(|&(mode, slot)| (None, mode, slot))
        .collect();
    let mut waiting: Vec<(usize, Mode)> = row.waiters.iter().copied().enumerate().collect();
    let mut started_so_far = Vec::new();
    for (number, (step, stated)) in row.steps.iter().enumerate() {
        let number = number + 1;
        let case = format!("{} ({name}), step {number}: {step:?}", row.what);
        fs::write(&step_file, number.to_string()).unwrap();
        match *step {
            Step::Holder(slot) => {
                planted.release(slot);
                holding.retain(|&(waiter, _, held)| waiter.is_some() || held != slot);
            }
            Step::LetIn => {
                for (waiter, _, _) in holding.iter().filter(|h| h.0.is_some()) {
                    let place = waiter.expect("a waiter");
                    fs::write(scratch.path(&format!("release.{place}")), "").unwrap();
                    assert_eq!(wait(&mut waiters[place]).code(), Some(0), "{case}");
                }
                holding.retain(|h| h.0.is_none());
            }
            Step::Kill(place) => {
                signal(waiters[place].id(), nix::sys::signal::Signal::SIGKILL);
                wait(&mut waiters[place]);
                waiting.retain(|&(waiter, _)| waiter != place);
            }
            Step::Leave(place) => {
                assert_eq!(wait(&mut waiters[place]).code(), Some(75), "{case}");
                waiting.retain(|&(waiter, _)| waiter != place);
            }
        }
        let modes: Vec<Mode> = holding.iter().map(|h| h.1).collect();
        let let_in = let_in_by_rule(row.parallelism, &modes, &waiting);
        assert_eq!(&let_in, stated, "the rule: {case}");
        // They take the lowest free slots, one each (in no set order when several go at once).
        let mut slots = Vec::new();
        for &place in &let_in {
            let slot = lowest_free(&holding.iter().map(|h| h.2).collect::<Vec<_>>());
            holding.push((Some(place), row.waiters[place], slot));
            slots.push(slot);
        }
        waiting.retain(|(place, _)| !let_in.contains(place));
        started_so_far.extend(let_in.iter().map(|place| format!("{place} {number}")));
        let since = Instant::now();
        while served(&scratch).len() < started_so_far.len() && since.elapsed() < PROMPTLY {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(WINDOW);
        let served = served(&scratch);
        let started: Vec<String> = served.iter().map(|(who, _, _)| who.clone()).collect();
        let mut wanted = started_so_far.clone();
        wanted.sort();
        assert_eq!(
            started, wanted,
            "{}: {case}: who started (place, step)",
            store.kind
        );
        let mut taken: Vec<u32> = served
            .iter()
            .filter(|(_, step, _)| *step == number)
            .map(|&(_, _, slot)| slot)
            .collect();
        taken.sort_unstable();
        assert_eq!(taken, slots, "{}: {case}: the slots they took", store.kind);
    }
    for (place, waiter) in waiters.iter_mut().enumerate() {
        fs::write(scratch.path(&format!("release.{place}")), "").unwrap();
        let _ = waiter.kill();
    }
}

/// Who started so far, sorted: ("PLACE STEP", step, slot).
fn served(scratch: &Scratch) -> Vec<(String, usize, u32)> {
    let mut served: Vec<(String, usize, u32)> = scratch
        .lines("served")
        .iter()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            let number = |at: usize| words[at].parse().expect("a number");
            (
                format!("{} {}", words[0], words[1]),
                number(1),
                number(2) as u32,
            )
        })
        .collect();
    served.sort();
    served
}

/// A waiter killed in line that becomes the head when the one ahead of it
/// is granted a slot holds nobody up (docs/guide.md: "The waiting line"):
/// the waiter behind sees it dead and takes the next slot at once.
/// PostgreSQL told nobody behind a grant that the line had moved, so the
/// next waiter slept until its place's refresh (TTL/3).
pub fn a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up(store: &Store) {
    let row = ReleaseRow {
        what: "a dead waiter becomes the head when the writer ahead is let in",
        parallelism: 1,
        holders: vec![(X, 0)],
        waiters: vec![X, X, X],
        steps: vec![
            (Step::Kill(1), vec![]),
            (Step::Holder(0), vec![0]),
            (Step::LetIn, vec![2]),
        ],
    };
    release_row(store, "dead-head", &row);
}

/// Both tables, and the rows that follow them, against one store.
pub fn admission_follows_the_rule(store: &Store) {
    every_row_agrees_with_the_rule(store);
    every_release_lets_in_whom_the_rule_does(store);
}

/// Instantiates `tests` for one backend's store: `None` (its server is missing) skips.
macro_rules! on_backend {
    ($module:ident, $store:expr, $($test:ident),+) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    use crate::support::{MaybeStore, Store};
                    if let Some(store) = MaybeStore::into_store($store) {
                        super::$test(&store);
                    }
                }
            )+
        }
    };
}

on_backend!(
    file_backend,
    Store::file(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
on_backend!(
    sqlite_backend,
    Store::sqlite(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
on_backend!(
    redis_backend,
    Store::redis(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
on_backend!(
    redis_cluster_backend,
    Store::redis_cluster(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
#[cfg(feature = "postgres")]
on_backend!(
    postgres_backend,
    Store::postgres(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
#[cfg(feature = "etcd")]
on_backend!(
    etcd_backend,
    Store::etcd(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
#[cfg(feature = "s3")]
on_backend!(
    s3_backend,
    Store::s3(),
    admission_follows_the_rule,
    a_dead_waiter_made_the_head_by_a_grant_holds_nobody_up
);
