//! The recipes run as a user copies them (docs/recipes.md: "Recipes"): cron's
//! line under cron's bare environment, a script that locks itself, and
//! flock(1) and lockrun excluding each other while jobs move from one to the
//! other. Each test takes its code from docs/recipes.md, changing only the
//! paths it names for the test's own, so a recipe that stops working fails here.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::docs::Doc;
use crate::support::*;

fn recipe(title: &str, info: &str) -> String {
    Doc::load("docs/recipes.md").code(title, info)
}

/// `text` with `from`, which it must name, replaced by `to`.
fn with(text: &str, from: &str, to: &Path) -> String {
    assert!(
        text.contains(from),
        "the recipe no longer names {from}:\n{text}"
    );
    text.replace(from, &to.display().to_string())
}

/// A `PATH` that finds the lockrun under test first, then the system's
/// programs, as cron's (`/usr/bin:/bin`) finds the package's `/usr/bin/lockrun`.
fn path_with_lockrun(scratch: &Scratch) -> String {
    let bin = scratch.path("bin");
    fs::create_dir_all(&bin).unwrap();
    let link = bin.join("lockrun");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_lockrun"), &link).unwrap();
    }
    format!("{}:/usr/bin:/bin", bin.display())
}

/// A job at `path` that appends its pid to `runs` in `dir` when it starts and
/// runs until `go` appears there (at most 20 s, so that it never outlives a
/// failed test by long).
fn write_job(path: &Path, dir: &Path) {
    let script = format!(
        "#!/bin/sh\necho $$ >> '{dir}/runs'\ni=0\n\
         while [ ! -e '{dir}/go' ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i + 1)); done\n",
        dir = dir.display()
    );
    fs::write(path, script).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Waits until the job has started `count` times in all.
fn wait_for_runs(scratch: &Scratch, count: usize) {
    wait_until(&format!("{count} runs of the job"), || {
        scratch.lines("runs").len() >= count
    });
}

fn quiet(mut command: Command) -> Command {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

#[test]
fn the_cron_line_skips_a_run_quietly_under_crons_environment() {
    let scratch = Scratch::new();
    let locks = scratch.path("locks");
    let job = scratch.path("sync-mirror");
    write_job(&job, scratch.dir());
    let crontab = recipe("cron", "cron");
    let crontab = with(&crontab, "/var/lock/myjobs", &locks);
    let crontab = with(&crontab, "/usr/local/bin/sync-mirror", &job);
    // What cron gives a job: HOME, LOGNAME, SHELL, its PATH, the crontab's variables.
    let mut environment = vec![
        format!("HOME={}", scratch.dir().display()),
        "LOGNAME=nobody".to_owned(),
        "SHELL=/bin/sh".to_owned(),
        format!("PATH={}", path_with_lockrun(&scratch)),
    ];
    let mut command = None;
    for line in crontab.lines().filter(|line| !line.trim().is_empty()) {
        let is_variable = line
            .split_once('=')
            .is_some_and(|(key, _)| key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if is_variable {
            environment.push(line.to_owned());
        } else {
            // Five time fields, then the command, which cron gives to /bin/sh.
            command = Some(line.splitn(6, ' ').nth(5).expect("a command").to_owned());
        }
    }
    let command = command.expect("the crontab has a job line");
    let cron = || {
        let mut cron = Command::new("env");
        cron.arg("-i")
            .args(&environment)
            .args(["/bin/sh", "-c", &command]);
        quiet(cron)
    };
    let first = cron().start();
    wait_for_runs(&scratch, 1);
    let skipped = run(&mut cron());
    assert_status(&skipped, 75);
    assert!(
        skipped.stdout.is_empty() && skipped.stderr.is_empty(),
        "a skip gives cron nothing to mail: {}",
        stderr(&skipped)
    );
    fs::write(scratch.path("go"), "").unwrap();
    let first = finish(first);
    assert_status(&first, 0);
    assert!(first.stderr.is_empty(), "{}", stderr(&first));
    assert_eq!(
        scratch.lines("runs").len(),
        1,
        "the skipped run ran the job"
    );
    assert!(
        locks.join("sync.0.lock").is_file(),
        "the lock is in the crontab's LOCKRUN_DIR"
    );
}

#[test]
fn a_script_that_locks_itself_runs_once_at_a_time() {
    let scratch = Scratch::new();
    let script = scratch.path("nightly-report");
    // The recipe's head, then a body that says which lock it holds and runs until told.
    let body = format!(
        "echo \"$LOCKRUN_NAME\" > '{dir}/held'\n{job}",
        dir = scratch.dir().display(),
        job = {
            write_job(&scratch.path("job"), scratch.dir());
            fs::read_to_string(scratch.path("job")).unwrap()
        }
        .trim_start_matches("#!/bin/sh\n")
    );
    let head = recipe("Lock the whole script", "sh");
    assert!(head.starts_with("#!/bin/sh\n"), "{head}");
    fs::write(&script, format!("{head}{body}")).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let path = path_with_lockrun(&scratch);
    let start = || {
        let mut command = without_lockrun_variables(Command::new(&script));
        command
            .env("PATH", &path)
            .env("LOCKRUN_DIR", scratch.path("locks"));
        quiet(command)
    };
    let first = start().start();
    wait_for_runs(&scratch, 1);
    assert_eq!(scratch.lines("held"), ["nightly-report"]);
    let second = run(&mut start());
    assert_status(&second, 75);
    fs::write(scratch.path("go"), "").unwrap();
    assert_status(&finish(first), 0);
    assert_eq!(
        scratch.lines("runs").len(),
        1,
        "the second run ran the body"
    );
}

#[test]
fn flock_and_lockrun_exclude_each_other_on_the_slot_file() {
    let scratch = Scratch::new();
    write_job(&scratch.path("backup.sh"), scratch.dir());
    let block = recipe("Moving from flock(1)", "sh");
    let block = with(&block, "/var/lock/myjobs", &scratch.path("locks"));
    let (setup, jobs): (Vec<&str>, Vec<&str>) = block
        .lines()
        .partition(|line| !line.starts_with("flock ") && !line.starts_with("lockrun "));
    let [flock, lockrun] = jobs[..] else {
        panic!("the recipe has one flock line and one lockrun line: {jobs:?}")
    };
    let path = path_with_lockrun(&scratch);
    let shell = |job: &str| {
        let mut command = without_lockrun_variables(Command::new("/bin/sh"));
        command
            .arg("-c")
            .arg(format!("{}\n{job}", setup.join("\n")))
            .current_dir(scratch.dir())
            .env("PATH", &path);
        quiet(command)
    };
    // A job not moved yet holds the file: the moved one is refused, and the other way round.
    for (holder, refused, busy) in [(flock, lockrun, 75), (lockrun, flock, 1)] {
        let _ = fs::remove_file(scratch.path("go"));
        let ran = scratch.lines("runs").len();
        let holding = shell(holder).start();
        wait_for_runs(&scratch, ran + 1);
        let other = run(&mut shell(refused));
        assert_status(&other, busy);
        fs::write(scratch.path("go"), "").unwrap();
        assert_status(&finish(holding), 0);
        assert_eq!(
            scratch.lines("runs").len(),
            ran + 1,
            "{refused:?} ran while {holder:?} held"
        );
    }
}
