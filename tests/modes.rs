//! Shared locks and several names (docs/guide.md: "Shared locks", "Several names"):
//! readers hold together and keep writers out, the line stays first come,
//! first served across modes, and several names are taken all or nothing in
//! one order. Run against each backend through `backend_tests!` (tests/core.rs).

use std::fs;

use serde_json::Value;

use crate::core::{QUICK_WAIT, every_run_exits_zero, hold};
use crate::support::*;

/// `status NAME --json` as its entries.
fn entries(store: &Store, name: &str) -> Vec<Value> {
    let output = run(store.status().args([name, "--json"]));
    assert_status(&output, 0);
    let entries: Value = serde_json::from_slice(&output.stdout).expect("status --json is JSON");
    entries.as_array().expect("an array").clone()
}

/// How many of `name`'s entries `status` shows in `state`.
fn count(store: &Store, name: &str, state: &str) -> usize {
    entries(store, name)
        .iter()
        .filter(|entry| entry["state"] == state)
        .count()
}

fn let_go(scratch: &Scratch, mut holder: Running) {
    fs::write(scratch.path("release"), "").unwrap();
    assert_eq!(wait(&mut holder).code(), Some(0));
}

/// A waiter on `name` with `extra` flags whose command appends `label` to
/// `log` when it runs; returned once `status` shows one more waiter.
fn join(store: &Store, name: &str, extra: &[&str], label: &str, log: &std::path::Path) -> Running {
    let before = count(store, name, "waiting");
    let script = format!("echo {label} >> '{}'", log.display());
    let waiter = store
        .lockrun()
        .args(["--name", name, "-w", "60"])
        .args(extra)
        .args(["-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the waiter to join the line", || {
        count(store, name, "waiting") > before
    });
    waiter
}

/// Two readers hold at once and `status` shows both as shared; a writer
/// cannot join them, a third reader can; the JSON events say the mode.
/// Then readers and writers hammer one name: a writer never holds beside
/// anyone, and every run gets a fence of its own.
pub fn readers_overlap_while_a_writer_is_kept_out(store: &Store) {
    let (first, second) = (Scratch::new(), Scratch::new());
    let reader = hold(store, &first, "shelf", &["-s"]);
    let other = hold(store, &second, "shelf", &["--shared"]);
    let holders = entries(store, "shelf");
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|entry| entry["state"] == "holding" && entry["mode"] == "shared"),
        "{holders:?}"
    );
    let slots: Vec<&Value> = holders.iter().map(|entry| &entry["slot"]).collect();
    assert_ne!(slots[0], slots[1], "each sharer has a slot of its own");
    let text = stdout(&run(store.status().arg("shelf")));
    assert!(text.contains("MODE") && text.contains("shared"), "{text}");

    assert_status(
        &run(store.lockrun().args(["--name", "shelf", "-n", "true"])),
        75,
    );
    let joined = run(store.lockrun().args([
        "--name",
        "shelf",
        "-s",
        "-n",
        "--log-format",
        "json",
        "-c",
        "echo $LOCKRUN_SLOT",
    ]));
    assert_status(&joined, 0);
    let third_slot = stdout(&joined).trim().to_owned();
    assert!(
        slots.iter().all(|slot| slot.to_string() != third_slot),
        "the third sharer took a slot of its own, not {third_slot}"
    );
    let acquired = stderr(&joined)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|event| event["event"] == "acquired")
        .expect("an acquired event");
    assert_eq!(acquired["mode"], "shared", "{acquired}");
    let_go(&first, reader);
    let_go(&second, other);

    mixed_runs(store);
}

/// 3 readers and 3 writers, 8 runs each, on one name: a writer finds
/// nobody beside it and a reader no writer.
fn mixed_runs(store: &Store) {
    let scratch = Scratch::new();
    fs::create_dir(scratch.path("readers")).unwrap();
    let script = r#"d=$1
if [ "$2" = writer ]; then
  mkdir "$d/writer" 2>/dev/null || echo "two writers" >> "$d/violations"
  [ -z "$(ls "$d/readers")" ] || echo "a writer beside readers" >> "$d/violations"
else
  touch "$d/readers/$$"
  [ ! -e "$d/writer" ] || echo "a reader beside a writer" >> "$d/violations"
fi
echo "$LOCKRUN_FENCE" >> "$d/fences"
sleep 0.01
if [ "$2" = writer ]; then rmdir "$d/writer"; else rm "$d/readers/$$"; fi"#;
    let commands = ["reader", "writer"].iter().cycle().take(6).map(|role| {
        let mut command = store.lockrun();
        command.args(["--name", "mixed"]).args(QUICK_WAIT);
        if *role == "reader" {
            command.arg("-s");
        }
        command
            .args(["--", "sh", "-c", script, "sh"])
            .arg(scratch.dir())
            .arg(role);
        command
    });
    every_run_exits_zero(commands, 8);
    assert_eq!(scratch.lines("violations"), Vec::<String>::new());
    let mut fences = scratch.lines("fences");
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 48, "48 runs, each with its own fence");
}

/// A writer waiting behind a reader goes before every reader that comes
/// after it: a `--no-wait` reader is turned away, waiting readers queue
/// behind the writer, and once the holder leaves the writer runs first,
/// then the readers, all of them together.
pub fn a_stream_of_readers_does_not_starve_a_writer(store: &Store) {
    let scratch = Scratch::new();
    let log = scratch.path("served");
    let holder_scratch = Scratch::new();
    let reader = hold(store, &holder_scratch, "journal", &["-s"]);
    let writer = join(store, "journal", &[], "writer", &log);
    assert_status(
        &run(store
            .lockrun()
            .args(["--name", "journal", "-s", "-n", "true"])),
        75,
    );
    let together = scratch.path("together");
    fs::create_dir(&together).unwrap();
    // Each later reader waits in its command until all three run at once.
    let readers: Vec<Running> = (0..3)
        .map(|id| {
            let before = count(store, "journal", "waiting");
            let script = format!(
                "echo reader >> '{log}'; touch '{dir}/{id}'; while [ $(ls '{dir}' | wc -l) -lt 3 ]; do sleep 0.01; done",
                log = log.display(),
                dir = together.display()
            );
            let waiter = store
                .lockrun()
                .args(["--name", "journal", "-s", "-w", "60", "-c", &script])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .start();
            wait_until("the reader to join the line", || {
                count(store, "journal", "waiting") > before
            });
            waiter
        })
        .collect();
    let modes: Vec<Value> = entries(store, "journal")
        .iter()
        .filter(|entry| entry["state"] == "waiting")
        .map(|entry| entry["mode"].clone())
        .collect();
    assert_eq!(
        modes,
        ["exclusive", "shared", "shared", "shared"],
        "the line in order"
    );
    let_go(&holder_scratch, reader);
    assert_status(&finish(writer), 0);
    for reader in readers {
        assert_status(&finish(reader), 0);
    }
    assert_eq!(
        scratch.lines("served"),
        ["writer", "reader", "reader", "reader"]
    );
}

/// Two runs that name the same two locks in opposite orders, started
/// together 20 times each, all finish with 0 and never hold a name twice.
/// The command's environment lists every lock, one line each.
pub fn several_names_in_any_order_never_deadlock(store: &Store) {
    let scratch = Scratch::new();
    let script = r#"d=$1
for name in $LOCKRUN_NAME; do
  mkdir "$d/$name" 2>/dev/null || echo "$name held twice" >> "$d/violations"
done
sleep 0.01
for name in $LOCKRUN_NAME; do rmdir "$d/$name"; done"#;
    let orders = [
        ["--name", "db", "--name", "cache"],
        ["--name", "cache", "--name", "db"],
    ];
    let commands = orders.into_iter().map(|names| {
        let mut command = store.lockrun();
        command
            .args(names)
            .args(QUICK_WAIT)
            .args(["--", "sh", "-c", script, "sh"])
            .arg(scratch.dir());
        command
    });
    every_run_exits_zero(commands, 20);
    assert_eq!(scratch.lines("violations"), Vec::<String>::new());

    let output = run(store.lockrun().args([
        "--name",
        "db",
        "--name",
        "cache",
        "--name",
        "db",
        "-c",
        "printf '%s|' \"$LOCKRUN_NAME\" \"$LOCKRUN_SLOT\"; echo \"$LOCKRUN_FENCE\" | wc -l",
    ]));
    assert_status(&output, 0);
    assert_eq!(
        stdout(&output),
        "cache\ndb|0\n0|2\n",
        "in the names' order, once each"
    );
}

/// A run that gets the first of its names but not the second within
/// `--timeout` exits 75 and holds neither: it took them in order (the first
/// was held by it while it waited), and gave the first back.
pub fn several_names_are_all_or_nothing(store: &Store) {
    let scratch = Scratch::new();
    let holder = hold(store, &scratch, "second", &[]);
    let ran = scratch.path("ran");
    let waiter = store
        .lockrun()
        .args(["--name", "second", "--name", "first", "-w", "3"])
        .args(["-c", &format!("touch '{}'", ran.display())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the run to wait for its second name", || {
        count(store, "second", "waiting") == 1
    });
    assert_status(
        &run(store.lockrun().args(["--name", "first", "-n", "true"])),
        75,
    );
    let output = finish(waiter);
    assert_status(&output, 75);
    assert!(stderr(&output).contains("second"), "{}", stderr(&output));
    assert!(!ran.exists(), "the command ran without every lock");
    assert_eq!(count(store, "first", "holding"), 0);
    assert_status(
        &run(store.lockrun().args(["--name", "first", "-n", "true"])),
        0,
    );
    let_go(&scratch, holder);
}

/// A run that holds its first name while it waits for the second keeps the
/// first one's lease alive meanwhile, however long the wait: for many TTLs
/// nobody else gets the first name, and the run then goes on with both.
pub fn the_first_name_is_kept_while_waiting_for_the_second(store: &Store) {
    let scratch = Scratch::new();
    let holder = hold(store, &scratch, "later", &[]);
    let waiter = store
        .lockrun()
        .args([
            "--name", "later", "--name", "early", "--ttl", "0.3", "-w", "60",
        ])
        .args(["-c", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the run to wait for its second name", || {
        count(store, "later", "waiting") == 1
    });
    // Five TTLs of asking: a lapsed lease would let one of these in.
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        let output = run(store
            .lockrun()
            .args(["--name", "early", "-n", "--ttl", "0.3", "true"]));
        assert_status(&output, 75);
    }
    let_go(&scratch, holder);
    assert_status(&finish(waiter), 0);

    // Where a lease can be broken, breaking the first one ends the wait: 76, and the command never runs.
    let scratch = Scratch::new();
    let holder = hold(store, &scratch, "later", &[]);
    let ran = scratch.path("ran");
    let waiter = store
        .lockrun()
        .args([
            "--name", "later", "--name", "early", "--ttl", "0.3", "-w", "60",
        ])
        .args(["-c", &format!("touch '{}'", ran.display())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .start();
    wait_until("the run to wait for its second name", || {
        count(store, "later", "waiting") == 1
    });
    if run(store.release().args(["early", "--force"]))
        .status
        .code()
        == Some(0)
    {
        let output = finish(waiter);
        assert_status(&output, 76);
        let err = stderr(&output);
        assert!(
            err.contains("early") && err.contains("did not start"),
            "{err}"
        );
        assert!(!ran.exists(), "the command ran without its first lock");
    }
    let_go(&scratch, holder);
}

/// `release --force --slot N` breaks one sharer's lease and leaves the
/// others holding (where leases can be broken): the broken one's command is
/// stopped, 76, and the other runs on to its end.
pub fn release_force_breaks_one_sharer(store: &Store) {
    let (first, second) = (Scratch::new(), Scratch::new());
    let kept = hold(store, &first, "pair", &["-s", "--ttl", "1"]);
    let broken = hold(store, &second, "pair", &["-s", "--ttl", "1"]);
    let slot_of = |scratch: &Scratch| {
        let pid = fs::read_to_string(scratch.path("ready")).unwrap();
        let lockrun = fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .unwrap()
            .rsplit(") ")
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap();
        entries(store, "pair")
            .into_iter()
            .find(|entry| entry["pid"] == lockrun)
            .expect("the sharer in status")["slot"]
            .to_string()
    };
    let slot = slot_of(&second);
    let output = run(store.release().args(["pair", "--force", "--slot", &slot]));
    if output.status.code() == Some(64) {
        // The file backend: no lease to break.
        let_go(&first, kept);
        let_go(&second, broken);
        return;
    }
    assert_status(&output, 0);
    assert_eq!(stdout(&output).lines().count(), 1, "{}", stdout(&output));
    assert_status(&finish(broken), 76);
    assert_eq!(count(store, "pair", "holding"), 1);
    let_go(&first, kept);
}

/// Where leases can be broken, breaking the lease of either name a run
/// holds stops its command: 76, saying which name's lease was lost.
pub fn losing_any_names_lease_stops_the_command(store: &Store) {
    for lost in ["left", "right"] {
        let scratch = Scratch::new();
        let holder = hold(
            store,
            &scratch,
            "left",
            &["--name", "right", "--ttl", "1", "--kill-grace", "0.1"],
        );
        let output = run(store.release().args([lost, "--force"]));
        if output.status.code() == Some(64) {
            // The file backend: no lease to break.
            let_go(&scratch, holder);
            return;
        }
        assert_status(&output, 0);
        let output = finish(holder);
        assert_status(&output, 76);
        let err = stderr(&output);
        assert!(
            err.contains(&format!("the lease on {lost} was lost")),
            "{err}"
        );
    }
}
