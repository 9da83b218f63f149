//! Runs the command while the lock is held (docs/guide.md: "What the command gets"): argv as given, the
//! `LOCKRUN_*` environment, signals forwarded exactly once, the command killed
//! if lockrun dies, the whole process group stopped (TERM, then KILL after the
//! grace) on `--max-runtime`, a lost lease or a second SIGTERM/SIGINT.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpid};

use crate::error::{Error, Result, status};
use crate::lease::{Held, LeaseVerdict};
use crate::platform::clock::Moment;
use crate::report::{Event, Reporter};

use crate::platform::interrupt;
pub use crate::platform::signals::{Signals, reset_inherited};
use crate::platform::spawn;
use crate::platform::terminal::Terminal;
use crate::platform::watchdog::{GroupEnd, Watchdog};

mod shebang;

/// How often lockrun looks whether the command's group is gone while a
/// leftover's end may not come with a SIGCHLD (its parent, not lockrun, reaps it).
const LEFTOVERS_LOOK: Duration = Duration::from_millis(100);

/// What to run.
pub enum Program {
    /// COMMAND ARG..., executed directly.
    Argv(Vec<OsString>),
    /// `-c STRING`, through `/bin/sh -c`.
    Shell(OsString),
}

impl Program {
    /// The program and its arguments.
    fn argv(&self) -> Vec<&OsStr> {
        match self {
            Self::Argv(argv) => argv.iter().map(OsString::as_os_str).collect(),
            Self::Shell(script) => vec![OsStr::new("/bin/sh"), OsStr::new("-c"), script],
        }
    }

    /// The command line as `status` shows it, quoted so it could be pasted into a shell.
    pub fn display(&self) -> String {
        match self {
            Self::Argv(argv) => argv
                .iter()
                .map(|arg| shell_quote(&arg.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" "),
            Self::Shell(script) => script.to_string_lossy().into_owned(),
        }
    }

    fn program_name(&self) -> String {
        match self {
            Self::Argv(argv) => argv[0].to_string_lossy().into_owned(),
            Self::Shell(_) => "/bin/sh".into(),
        }
    }

    /// The program's name as `status` shows it without `--record-command`:
    /// no argument, nor a `-c` script.
    pub fn name(&self) -> String {
        shell_quote(&self.program_name())
    }
}

fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./,:=@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How the command's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It exited on its own, or after a forwarded signal: its status, or 128 + signal.
    Exited(u8),
    /// lockrun stopped it because the lease could not be kept.
    LeaseLost(Lost),
    /// The lease could not be kept from the start: the command never ran.
    LostBeforeStart(Lost),
    /// lockrun stopped it at `--max-runtime`.
    MaxRuntime(Duration),
    /// It exited with a status, but a lease was found lost at release.
    FoundLost(FoundLost),
    /// It exited with a status, but only after its lease's end as far as
    /// anyone can tell (lockrun and its watchdog were both held up past it).
    LapsedUnseen(FoundLost),
}

/// Which lease was found lost at release, and the command's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundLost {
    pub name: String,
    pub code: u8,
}

/// Which lease was lost, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub name: String,
    pub reason: &'static str,
}

impl Ending {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Exited(code) => *code,
            Self::LeaseLost(_)
            | Self::LostBeforeStart(_)
            | Self::FoundLost(_)
            | Self::LapsedUnseen(_) => status::LEASE_LOST,
            Self::MaxRuntime(_) => status::MAX_RUNTIME,
        }
    }
}

pub struct Limits {
    pub max_runtime: Option<Duration>,
    pub kill_grace: Duration,
}

/// How the command's run ended, and its watchdog, told that the group ended,
/// which the caller dismisses and reaps once the lock is released (`None` when
/// none was started, or it was killed and reaped already).
pub struct Supervised {
    pub ending: Result<Ending>,
    pub watchdog: Option<Watchdog>,
}

/// When the watchdog must stop the command while lockrun keeps `held`'s
/// lease: SIGTERM a little after lockrun itself would send it, SIGKILL a
/// little before the lease ends (`None`s without a lease).
fn lease_moments(held: &Held) -> (Option<Moment>, Option<Moment>) {
    match (held.stop_at(), held.deadline()) {
        (Some(stop_at), Some(deadline)) => {
            let quarter = (deadline - stop_at) / 4;
            (Some(stop_at + quarter), Some(deadline - quarter))
        }
        _ => (None, None),
    }
}

/// Runs `program` to its end, keeping `held` (renewing its lease, if it has
/// one), guarded by `watchdog` (started here if the wait did not start it).
pub fn supervise(
    program: &Program,
    env: &[(&str, String)],
    signals: &Signals,
    held: &mut Held,
    watchdog: Option<Watchdog>,
    limits: &Limits,
    reporter: &Reporter,
) -> Supervised {
    let watchdog = match watchdog.map_or_else(Watchdog::start, Ok) {
        Ok(watchdog) => watchdog,
        Err(err) => {
            return Supervised {
                ending: Err(Error::system(err)),
                watchdog: None,
            };
        }
    };
    // Signals are read here from now on (`signals` blocked them): the wait's handler goes.
    interrupt::supervising(&watchdog);
    // Before the command ran, or when it could not start.
    let unstarted = |ending, watchdog: Watchdog| {
        watchdog.group_ended();
        Supervised {
            ending,
            watchdog: Some(watchdog),
        }
    };
    if let Err(err) = spawn::adopt_orphans() {
        let err = Error::internal("becoming the command's subreaper", err);
        return unstarted(Err(err), watchdog);
    }
    // Should lockrun die, the slot's file locks stay held until the watchdog has ended the group.
    if let Err(err) = watchdog.keep(&held.lock_files()) {
        return unstarted(Err(Error::system(err)), watchdog);
    }
    let terminal = Terminal::open();
    let foreground = terminal.as_ref().filter(|terminal| terminal.is_ours());
    // Never a command under a lease whose stop has passed: checked the moment
    // before the spawn (forking the watchdog takes time too, and lockrun may
    // be stopped meanwhile).
    if let LeaseVerdict::Stop { name, reason, .. } = held.confirm() {
        reporter.about(&name).event(&Event::Lost { reason });
        return unstarted(Ok(Ending::LostBeforeStart(Lost { name, reason })), watchdog);
    }
    // Told before the command starts: a lockrun stopped just after (SIGSTOP,
    // starved) must not leave a command the lease does not bound (one held up
    // just before, past them, does not start it: `spawn`).
    let told = lease_moments(held);
    if told != (None, None) {
        watchdog.hold(told.0, told.1);
    }
    let child = match spawn(program, env, foreground, &watchdog, held.stop_at()) {
        Ok(Some(child)) => child,
        Ok(None) => {
            let (name, reason) = (held.ending_first().to_owned(), HELD_UP);
            reporter.about(&name).event(&Event::Lost { reason });
            return unstarted(Ok(Ending::LostBeforeStart(Lost { name, reason })), watchdog);
        }
        Err(err) => {
            if let Some(terminal) = foreground {
                terminal.take_back();
            }
            return unstarted(Err(err), watchdog);
        }
    };
    let mut run = Run {
        child,
        terminal,
        held,
        watchdog: &watchdog,
        told,
        reporter,
        kill_grace: limits.kill_grace,
        max_runtime_at: limits.max_runtime.map(|max| (Moment::now() + max, max)),
        terminations: 0,
        stop: Stop::No,
        ending: None,
        watchdog_gone: false,
    };
    let ending = run.until_exit(signals);
    // One that was killed is reaped already: its pid may be another's by now.
    let reaped = run.watchdog_gone;
    if ending.is_err() {
        abandon(child);
    }
    let watchdog = (!reaped).then_some(watchdog);
    if let Some(watchdog) = &watchdog {
        watchdog.group_ended();
    }
    Supervised { ending, watchdog }
}

/// Kills the command and waits for it: the lock is never released with it running.
fn abandon(child: Pid) {
    signal_all(child, Signal::SIGKILL);
    let _ = waitpid(child, None);
}

/// The command's process group, and the command itself if it left the group.
fn signal_all(child: Pid, signal: Signal) {
    let _ = killpg(child, signal);
    if getpgid(Some(child)).is_ok_and(|group| group != child) {
        let _ = kill(child, signal);
    }
}

/// Why a command was not started although its lease was confirmed.
const HELD_UP: &str = "lockrun was held up past its renewal while it started the command";

/// Starts `program`, unless it would start at `stop_at` or later (`None`).
fn spawn(
    program: &Program,
    env: &[(&str, String)],
    terminal: Option<&Terminal>,
    watchdog: &Watchdog,
    stop_at: Option<Moment>,
) -> Result<Option<Pid>> {
    let exec =
        spawn::Exec::new(&program.argv(), env).map_err(|err| spawn_error(program, None, &err))?;
    let pid = match spawn::spawn(
        &exec,
        terminal.map(Terminal::raw_fd),
        &watchdog.announcer(),
        stop_at,
    ) {
        Ok(pid) => pid,
        Err(err)
            if err.kind() == io::ErrorKind::TimedOut && stop_at.is_some_and(Moment::has_passed) =>
        {
            return Ok(None);
        }
        Err(err) => return Err(spawn_error(program, exec.found(), &err)),
    };
    // The child has exec'd by now, so it is already in its own group and holds the terminal.
    if let Some(terminal) = terminal {
        terminal.give_to(pid);
    }
    Ok(Some(pid))
}

/// `found` is the file exec found, if any: execve(2) says "not found" also for a
/// script whose `#!` interpreter is missing, and that script cannot be executed
/// (README: exit status 126), while a command that is nowhere was not found (127).
fn spawn_error(program: &Program, found: Option<&Path>, err: &io::Error) -> Error {
    let cannot_execute = |message| Error::Spawn {
        message,
        exit_code: status::CANNOT_EXECUTE,
    };
    let name = program.program_name();
    if err.kind() != io::ErrorKind::NotFound {
        return cannot_execute(format!("cannot execute {name}: {err}"));
    }
    match found {
        None => Error::Spawn {
            message: format!("command not found: {name}"),
            exit_code: status::NOT_FOUND,
        },
        Some(file) => {
            let interpreter =
                shebang::interpreter(file).map_or_else(String::new, |i| format!(" {i}"));
            cannot_execute(format!(
                "cannot execute {}: its interpreter{interpreter} was not found",
                file.display()
            ))
        }
    }
}

/// Whether lockrun is stopping the command's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    No,
    /// SIGTERM was sent; SIGKILL follows at `kill_at`.
    Terminating {
        kill_at: Moment,
    },
    Killed,
}

struct Run<'a> {
    child: Pid,
    terminal: Option<Terminal>,
    held: &'a mut Held,
    watchdog: &'a Watchdog,
    /// The moments the watchdog was last told to stop the command at.
    told: (Option<Moment>, Option<Moment>),
    reporter: &'a Reporter,
    kill_grace: Duration,
    max_runtime_at: Option<(Moment, Duration)>,
    /// SIGTERM/SIGINT received so far: the first is forwarded, the second stops the tree.
    terminations: u32,
    stop: Stop,
    /// Why lockrun is stopping the command, when it is.
    ending: Option<Ending>,
    /// The watchdog ended before it was dismissed (someone killed it), and that was said.
    watchdog_gone: bool,
}

impl Run<'_> {
    fn until_exit(&mut self, signals: &Signals) -> Result<Ending> {
        loop {
            if let Some(code) = self.check_child()? {
                self.judge_late_exit(code);
                self.stop_leftovers(signals)?;
                if let Some(terminal) = &self.terminal {
                    terminal.take_back_from(self.child);
                }
                return Ok(self.ending.take().unwrap_or(Ending::Exited(code)));
            }
            self.check_timers();
            let timeout = self
                .next_wakeup()
                .map_or(Duration::from_secs(60), Moment::remaining);
            if let Some(signal) = signals.next(timeout).map_err(Error::system)? {
                self.on_signal(signal);
            }
        }
    }

    fn next_wakeup(&self) -> Option<Moment> {
        let lease_due = self.held.due().filter(|_| !self.lease_lost());
        let kill_at = match self.stop {
            Stop::Terminating { kill_at } => Some(kill_at),
            Stop::No | Stop::Killed => None,
        };
        [kill_at, self.max_runtime_at.map(|(at, _)| at), lease_due]
            .into_iter()
            .flatten()
            .min()
    }

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::SIGCHLD => {}
            Signal::SIGTERM | Signal::SIGINT => {
                self.terminations += 1;
                match self.terminations {
                    1 => self.forward(signal),
                    2 => self.begin_stop(self.kill_grace),
                    _ => self.kill_group(),
                }
            }
            other => self.forward(other),
        }
    }

    fn forward(&self, signal: Signal) {
        let _ = kill(self.child, signal);
        if matches!(
            signal,
            Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP | Signal::SIGQUIT
        ) {
            // A stopped command would keep it pending forever; continue it, as a shell's kill does.
            let _ = kill(self.child, Signal::SIGCONT);
        }
    }

    /// The child's exit status once it has ended; handles job-control stops on
    /// the way, and reaps every other child that ended ([`Run::reaped`]).
    fn check_child(&mut self) -> Result<Option<u8>> {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::StillAlive) => return Ok(None),
                Ok(status) if status.pid() == Some(self.child) => match status {
                    WaitStatus::Exited(_, code) => return Ok(Some(code as u8)),
                    WaitStatus::Signaled(_, signal, _) => return Ok(Some(128 + signal as u8)),
                    WaitStatus::Stopped(_, signal) => self.follow_stop(signal),
                    _ => {}
                },
                Ok(status) => self.reaped(status),
                Err(Errno::EINTR) => {}
                Err(err) => return Err(Error::internal("waiting for the command", err)),
            }
        }
    }

    /// Reaps every child that ended, other than the command, without waiting.
    fn reap_others(&mut self) {
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
            self.reaped(status);
        }
    }

    /// A child other than the command ended: an orphan the command left (lockrun
    /// is its subreaper: nothing more to do), or the watchdog, which nothing but
    /// a kill ends before lockrun dismisses it. That is said even without -v:
    /// lockrun's guard against its own death is gone.
    fn reaped(&mut self, status: WaitStatus) {
        let pid = self.watchdog.pid();
        if status.pid() != Some(pid) || self.watchdog_gone {
            return;
        }
        let how = match status {
            WaitStatus::Signaled(_, signal, _) => format!("was killed by {signal}"),
            WaitStatus::Exited(_, code) => format!("exited with status {code}"),
            _ => return,
        };
        self.watchdog_gone = true;
        self.reporter.error(&format!(
            "the watchdog (lr-watchdog, pid {pid}) {how}: should lockrun die now, its command would run on without the lock"
        ));
    }

    /// The command was stopped by job control (Ctrl-Z, or a terminal read from the
    /// background): stop lockrun too, so its shell sees the job stopped; once
    /// continued, hand the terminal back if lockrun has it and continue the command.
    /// A plain SIGSTOP is someone else's to undo.
    fn follow_stop(&mut self, signal: Signal) {
        if !matches!(signal, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) {
            return;
        }
        if let Some(terminal) = &self.terminal {
            terminal.take_back_from(self.child);
        }
        let _ = kill(getpid(), Signal::SIGSTOP);
        if self.lose_lapsed_lease("its deadline passed while the job was stopped") {
            return;
        }
        if let Some(terminal) = self.terminal.as_ref().filter(|terminal| terminal.is_ours()) {
            terminal.give_to(self.child);
        }
        let _ = killpg(self.child, Signal::SIGCONT);
    }

    fn check_timers(&mut self) {
        if let Stop::Terminating { kill_at } = self.stop
            && kill_at.has_passed()
        {
            self.kill_group();
        }
        if let Some((at, max)) = self.max_runtime_at
            && at.has_passed()
        {
            self.max_runtime_at = None;
            self.ending.get_or_insert(Ending::MaxRuntime(max));
            self.begin_stop(self.kill_grace);
        }
        // Renewals go on while the command is being stopped: it holds the slot until it is gone.
        if !self.lease_lost() {
            self.keep_lease();
        }
    }

    /// A command that ended after its stop moment passed without lockrun
    /// acting (lockrun was paused or starved): its watchdog, which was not,
    /// says whether it had to stop the command for the lease, or found it
    /// ended on its own in time. Only the second lets the command's status
    /// stand once the deadline has passed: a watchdog that cannot tell (it was
    /// held up too, or does not answer) stands for the worst, `LapsedUnseen`.
    fn judge_late_exit(&mut self, code: u8) {
        if self.ending.is_some() || !self.held.stop_at().is_some_and(Moment::has_passed) {
            return;
        }
        let deadline_passed = self.held.deadline().is_some_and(Moment::has_passed);
        let name = self.held.ending_first().to_owned();
        match self.watchdog.outcome() {
            Some(GroupEnd::Stopped) => {
                let reason =
                    "lockrun was paused past its renewal, and its watchdog stopped the command";
                self.reporter.about(&name).event(&Event::Lost { reason });
                self.ending = Some(Ending::LeaseLost(Lost { name, reason }));
            }
            // Not known to have ended in time: the worst is taken.
            Some(GroupEnd::NotYet | GroupEnd::EndedUnseen) | None if deadline_passed => {
                let reason = "it ran out while lockrun and its watchdog were held up";
                self.reporter.about(&name).event(&Event::Lost { reason });
                self.ending = Some(Ending::LapsedUnseen(FoundLost { name, code }));
            }
            Some(GroupEnd::EndedInTime | GroupEnd::NotYet | GroupEnd::EndedUnseen) | None => {}
        }
    }

    /// Stops the command at once if the lease's deadline has passed without
    /// lockrun noticing (it was stopped); true when it had.
    fn lose_lapsed_lease(&mut self, reason: &'static str) -> bool {
        let lapsed = !self.lease_lost() && self.held.deadline().is_some_and(Moment::has_passed);
        if lapsed {
            let name = self.held.ending_first().to_owned();
            self.lose_lease(name, reason, Duration::ZERO);
        }
        lapsed
    }

    fn lease_lost(&self) -> bool {
        matches!(self.ending, Some(Ending::LeaseLost(_)))
    }

    fn keep_lease(&mut self) {
        if let LeaseVerdict::Stop {
            name,
            reason,
            grace,
        } = self.held.check()
        {
            self.lose_lease(name, reason, grace);
        }
        self.tell_watchdog();
    }

    /// Tells the watchdog when the command must be gone: while lockrun keeps the
    /// lease, within the kill grace before its deadline (SIGTERM a little after
    /// lockrun itself would send it, SIGKILL a little before the lease ends);
    /// once lockrun stops the command, its SIGKILL.
    fn tell_watchdog(&mut self) {
        let moments = match self.stop {
            Stop::No => lease_moments(self.held),
            Stop::Terminating { kill_at } => (None, Some(kill_at)),
            Stop::Killed => (None, None),
        };
        if self.told != moments {
            self.watchdog.hold(moments.0, moments.1);
            self.told = moments;
        }
    }

    fn lose_lease(&mut self, name: String, reason: &'static str, grace: Duration) {
        self.reporter.about(&name).event(&Event::Lost { reason });
        self.ending = Some(Ending::LeaseLost(Lost { name, reason }));
        self.begin_stop(grace);
    }

    /// SIGTERM to the command's process group now, SIGKILL after `grace`; a stop
    /// already under way keeps its SIGTERM but gets the earlier of the two SIGKILLs.
    fn begin_stop(&mut self, grace: Duration) {
        let kill_at = Moment::now() + grace;
        match self.stop {
            Stop::Killed => return,
            Stop::Terminating { kill_at: earlier } if earlier <= kill_at => return,
            Stop::Terminating { .. } => {}
            Stop::No => {
                self.signal_all(Signal::SIGTERM);
                // A stopped process cannot act on SIGTERM until continued.
                self.signal_all(Signal::SIGCONT);
            }
        }
        self.stop = Stop::Terminating { kill_at };
        self.tell_watchdog();
        if grace.is_zero() {
            self.kill_group();
        }
    }

    fn kill_group(&mut self) {
        self.signal_all(Signal::SIGKILL);
        self.stop = Stop::Killed;
    }

    fn signal_all(&self, signal: Signal) {
        signal_all(self.child, signal);
    }

    /// Processes the command left behind in its group (`cmd &`) would run on
    /// without the lock: stop them before it is released.
    fn stop_leftovers(&mut self, signals: &Signals) -> Result<()> {
        let child = self.child;
        let group_alive = || killpg(child, None).is_ok();
        if !group_alive() {
            return Ok(());
        }
        let mut kill_at = match self.stop {
            Stop::Terminating { kill_at } => kill_at,
            Stop::No => Moment::now() + self.kill_grace,
            Stop::Killed => Moment::now(),
        };
        if let Some(deadline) = self.held.deadline() {
            // No renewals now: whatever is left must be gone before the lease could pass on.
            kill_at = kill_at.min(deadline);
        }
        let _ = killpg(self.child, Signal::SIGTERM);
        let _ = killpg(self.child, Signal::SIGCONT);
        // A process stuck in the kernel may outlive SIGKILL for a while; do not wait forever.
        let give_up_at = kill_at + Duration::from_secs(5);
        loop {
            // As their subreaper lockrun inherits the leftovers: reap them, or their
            // zombies would keep the group alive.
            self.reap_others();
            if !group_alive() || give_up_at.has_passed() {
                return Ok(());
            }
            if kill_at.has_passed() {
                let _ = killpg(self.child, Signal::SIGKILL);
            }
            let next = if kill_at.has_passed() {
                give_up_at
            } else {
                kill_at
            };
            // Each leftover that ends is our child by then, or its parent's, which reaps it:
            // SIGCHLD wakes us for the former, a look now and then catches the latter.
            signals
                .next(next.remaining().min(LEFTOVERS_LOOK))
                .map_err(Error::system)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_shown_quoted() {
        let argv = ["sh", "-c", "echo 'hi' $X", ""]
            .map(OsString::from)
            .to_vec();
        assert_eq!(
            Program::Argv(argv).display(),
            r"sh -c 'echo '\''hi'\'' $X' ''"
        );
    }
}
