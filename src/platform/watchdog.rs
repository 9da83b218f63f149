//! A guard for what lockrun cannot handle itself: its own death and its own
//! stalls.
//!
//! `PR_SET_PDEATHSIG` reaches only the command's first process (and not one
//! that executed a set-uid program), so a forked watchdog waits on a socket
//! that only lockrun writes to; when it closes without a word, lockrun died
//! and the watchdog kills the command's whole process group. It wakes only
//! for what it must act on (lockrun's death, the lease's deadlines, a
//! question, its dismissal): what it needs only when it acts (the group, the
//! files to keep, the group's end) goes over a second, quiet socket that it
//! reads then, so that telling it costs lockrun no switch to it on the way to
//! the command or to the release. It is started
//! before the command, whose process names its group to it before executing,
//! so the command never runs a moment unguarded; a run that has to wait
//! starts it while it waits, so that the fork is not on the way from the
//! release before it to its command's start. Of lockrun's open files it keeps
//! only those lockrun hands it, the ones whose locks hold the slot
//! ([`Watchdog::keep`]): so a file lock stays held until the group has been
//! killed, and no other lock (a place in the file backend's line) outlives
//! lockrun in it. It blocks every signal it can: only SIGKILL ends it.
//! lockrun also tells it the lease's deadlines, before the command
//! starts: should lockrun be stopped (SIGSTOP, a debugger) or starved past
//! them, the watchdog stops the group itself, so the command never outlives
//! its lease (a command that would start past them does not start:
//! `spawn`). When its moment to stop the group comes and nothing in the group
//! is left running, the command ended in time on its own; lockrun asks which
//! it was once it runs again, so that a command that finished before its
//! lease's end keeps its exit status (README: "Exit status").
//!
//! It is a fork, not a clone sharing lockrun's memory: the kernel's OOM killer
//! kills every process that shares its victim's memory, and a watchdog must
//! outlive lockrun whatever killed it. It is named `lr-watchdog`, in its
//! command name and command line, so that killing "lockrun" by name
//! (`killall -9 lockrun`, `pkill -f lockrun`) leaves it to do its work.

#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, sigprocmask};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, recvmsg, sendmsg, socketpair,
};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{
    ForkResult, Pid, dup2_stderr, dup2_stdin, dup2_stdout, fork, read, setpgid, setsid, write,
};

use super::clock::Moment;
use super::proc;

/// The watchdog's name, which contains nothing a search for "lockrun" matches.
const NAME: &std::ffi::CStr = c"lr-watchdog";

/// What lockrun tells the watchdog on the socket it wakes for: exit.
const DISMISS: u8 = b'x';
/// ... or: stop the group at these moments, unless told otherwise before. Two
/// `u64`s follow, nanoseconds since boot (`u64::MAX`: never): SIGTERM, SIGKILL.
const HOLD: u8 = b'h';
const HOLD_LEN: usize = 1 + 2 * 8;
/// ... or: answer on this socket whether you had to stop the group.
const ASK: u8 = b'q';
/// What goes on the quiet socket, from the command's own process before it
/// executes: the group to guard is this one. An `i32` follows, its id.
const GROUP: u8 = b'g';
const GROUP_LEN: usize = 1 + 4;
/// ... or from lockrun: keep these files open until you exit; they come with
/// the byte, at most [`KEEP_AT_ONCE`] of them.
const KEEP: u8 = b'k';
const KEEP_AT_ONCE: usize = 16;
/// ... or: the command's group is gone; there is nothing left to stop.
const ENDED: u8 = b'e';

/// The watchdog that a signal ending lockrun must end and reap first
/// (`interrupt`), as raw numbers a signal handler can use: its socket and its
/// pid; -1 when there is none.
static ENDED_ON_A_SIGNAL: [AtomicI32; 2] = [const { AtomicI32::new(-1) }; 2];

/// How long lockrun waits for the watchdog's answer: it is not paused with
/// lockrun, so it answers at once unless it is gone.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// What the watchdog did about the group at the moments lockrun gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupEnd {
    /// Its moment to stop the group has not come.
    NotYet,
    /// When its moment came, before the lease's end, nothing in the group was
    /// running any more: the command ended on its own, in time.
    EndedInTime,
    /// It looked only after its SIGKILL moment, shortly before the lease's
    /// end (it was held up too), and the group had ended by then: when, it
    /// cannot tell.
    EndedUnseen,
    /// It stopped the group.
    Stopped,
}

impl GroupEnd {
    fn byte(self) -> u8 {
        match self {
            Self::NotYet => b'n',
            Self::EndedInTime => b'e',
            Self::EndedUnseen => b'u',
            Self::Stopped => b's',
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        [
            Self::NotYet,
            Self::EndedInTime,
            Self::EndedUnseen,
            Self::Stopped,
        ]
        .into_iter()
        .find(|outcome| outcome.byte() == byte)
    }
}

pub struct Watchdog {
    /// What the watchdog wakes for, and where it answers. Closing it without
    /// a word is what tells the watchdog lockrun is gone; its other end
    /// closes when the watchdog exits.
    talk: OwnedFd,
    /// What the watchdog reads only when it acts. A socket, not a pipe, so
    /// that it can carry open files.
    tell: OwnedFd,
    /// Its pid: lockrun's child, whose end before it was dismissed is worth saying.
    pid: Pid,
}

impl Watchdog {
    /// Starts a watchdog, before the command: the command names its group
    /// itself ([`Announcer::announce`]) before it executes, so there is no moment
    /// when it runs unguarded. lockrun must be single-threaded here.
    pub fn start() -> io::Result<Self> {
        let failed = super::failed("starting the watchdog");
        let pair = || {
            socketpair(
                AddressFamily::Unix,
                SockType::Stream,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .map_err(failed)
        };
        let (listen, talk) = pair()?;
        let (quiet, tell) = pair()?;
        // SAFETY: lockrun has one thread at this point, so the child may run any code.
        match unsafe { fork() }.map_err(failed)? {
            ForkResult::Child => {
                drop((talk, tell));
                guard(&listen, &quiet)
            }
            ForkResult::Parent { child } => {
                // Out of lockrun's process group before lockrun goes on: a signal to that
                // group (a SIGSTOP, a SIGKILL) must not reach the guard, even before it ran.
                // The guard leaves the session too, when it gets to run first.
                let _ = setpgid(child, child);
                Ok(Self {
                    talk,
                    tell,
                    pid: child,
                })
            }
        }
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// What the command's process uses to name its group to the watchdog.
    pub fn announcer(&self) -> Announcer<'_> {
        Announcer { tell: &self.tell }
    }

    /// Keeps `files` open until the watchdog exits, which is after the
    /// command's group is gone should lockrun die: the files whose locks hold
    /// the slot. Sent over the socket, they stay open while they are under
    /// way too.
    pub fn keep(&self, files: &[BorrowedFd<'_>]) -> io::Result<()> {
        for some in files.chunks(KEEP_AT_ONCE) {
            let raw: Vec<RawFd> = some.iter().map(AsRawFd::as_raw_fd).collect();
            sendmsg::<()>(
                self.tell.as_raw_fd(),
                &[IoSlice::new(&[KEEP])],
                &[ControlMessage::ScmRights(&raw)],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(super::failed("handing the watchdog the lock's files"))?;
        }
        Ok(())
    }

    /// From now on the group must be gone by `kill_at`: unless told otherwise
    /// before, the watchdog sends it SIGTERM at `terminate_at` and SIGKILL at
    /// `kill_at` (`None`: never).
    pub fn hold(&self, terminate_at: Option<Moment>, kill_at: Option<Moment>) {
        let nanos = |at: Option<Moment>| {
            at.map_or(u64::MAX, |at| at.since_boot().as_nanos() as u64)
                .to_le_bytes()
        };
        let mut message = [0u8; HOLD_LEN];
        message[0] = HOLD;
        message[1..9].copy_from_slice(&nanos(terminate_at));
        message[9..].copy_from_slice(&nanos(kill_at));
        // A write this short fits the socket's buffer whole. If the watchdog
        // was killed, there is nobody left to tell.
        let _ = write(&self.talk, &message);
    }

    /// The command's group is gone: should lockrun die or a deadline pass
    /// before the watchdog is dismissed (after the release), it stops
    /// nothing. Said on the quiet socket: the watchdog does not wake for it.
    pub fn group_ended(&self) {
        let _ = write(&self.tell, &[ENDED]);
    }

    /// What the watchdog did about the group; `None` when it does not answer
    /// (it was killed). Asked only after lockrun was late to act itself.
    pub fn outcome(&self) -> Option<GroupEnd> {
        write(&self.talk, &[ASK]).ok()?;
        let mut fds = [PollFd::new(self.talk.as_fd(), PollFlags::POLLIN)];
        let within = PollTimeout::try_from(ANSWER_WITHIN).unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, within).ok()? == 0 {
            return None;
        }
        let mut byte = [0u8; 1];
        match read(&self.talk, &mut byte) {
            Ok(1) => GroupEnd::from_byte(byte[0]),
            _ => None,
        }
    }

    /// Whether a signal that ends lockrun must end and reap this watchdog
    /// first ([`end_on_a_signal`]): while lockrun waits, not once it reads its
    /// signals itself.
    pub fn end_on_signal(&self, on: bool) {
        let [talk, pid] = &ENDED_ON_A_SIGNAL;
        // The pid last: the handler goes by it.
        pid.store(-1, Ordering::SeqCst);
        talk.store(
            if on { self.talk.as_raw_fd() } else { -1 },
            Ordering::SeqCst,
        );
        pid.store(if on { self.pid.as_raw() } else { -1 }, Ordering::SeqCst);
    }

    /// The watchdog exits without stopping anything (the group is gone, or
    /// never ran), to be reaped ([`Dismissed::reap`]). Told once the lock is
    /// released: the switch to it is then not on the way to the next holder.
    pub fn dismiss(self) -> Dismissed {
        self.end_on_signal(false);
        let _ = write(&self.talk, &[DISMISS]);
        Dismissed {
            talk: self.talk,
            pid: self.pid,
        }
    }
}

/// A watchdog told to go, still to be reaped.
pub struct Dismissed {
    /// Its other end closes when the watchdog exits.
    talk: OwnedFd,
    pid: Pid,
}

impl Dismissed {
    /// Waits (a second at most) for the dismissed watchdog to exit, and reaps
    /// it: where PID 1 never reaps (a container), a watchdog left to it would
    /// stay a zombie for every run (docs/guide.md: "What the command gets"). Only
    /// for a watchdog not reaped yet.
    pub fn reap(self) {
        // Its end of the socket closes when it exits: then waiting cannot block for long.
        let mut fds = [PollFd::new(self.talk.as_fd(), PollFlags::POLLHUP)];
        let within = PollTimeout::try_from(ANSWER_WITHIN).unwrap_or(PollTimeout::MAX);
        let gone = matches!(poll(&mut fds, within), Ok(1));
        let flags = (!gone).then_some(WaitPidFlag::WNOHANG);
        while waitpid(self.pid, flags) == Err(Errno::EINTR) {}
    }
}

/// Ends and reaps the watchdog marked by [`Watchdog::end_on_signal`], if any:
/// for a signal handler, so only async-signal-safe calls (a write, a poll of a
/// second at most, waitpid).
pub fn end_on_a_signal() {
    let [talk, pid] = ENDED_ON_A_SIGNAL
        .each_ref()
        .map(|n| n.load(Ordering::SeqCst));
    if pid < 0 {
        return;
    }
    // SAFETY: the numbers are the marked watchdog's open socket and its pid
    // (unmarked before it is closed or reaped); write, poll and waitpid are
    // async-signal-safe.
    unsafe {
        nix::libc::write(talk, [DISMISS].as_ptr().cast(), 1);
        let mut gone = nix::libc::pollfd {
            fd: talk,
            events: nix::libc::POLLHUP,
            revents: 0,
        };
        let within = ANSWER_WITHIN.as_millis() as i32;
        let flags = if nix::libc::poll(&raw mut gone, 1, within) == 1 {
            0
        } else {
            nix::libc::WNOHANG
        };
        nix::libc::waitpid(pid, std::ptr::null_mut(), flags);
    }
}

/// lockrun's end of the watchdog's socket, as the command's process holds it
/// between clone and exec (it closes on exec).
pub struct Announcer<'a> {
    tell: &'a OwnedFd,
}

impl Announcer<'_> {
    /// Names the calling process's group as the one to guard; async-signal-safe
    /// (one write of a few bytes, prepared on the stack).
    pub fn announce(&self, group: Pid) -> nix::Result<()> {
        let mut message = [0u8; GROUP_LEN];
        message[0] = GROUP;
        message[1..].copy_from_slice(&group.as_raw().to_le_bytes());
        write(self.tell, &message).map(drop)
    }
}

fn guard(listen: &OwnedFd, quiet: &OwnedFd) -> ! {
    // Whatever lockrun blocked or not when it forked (it may be waiting still).
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), None);
    close_all_but([listen.as_raw_fd(), quiet.as_raw_fd()]);
    // Out of lockrun's session too (unless lockrun made this a group leader first, which is enough).
    let _ = setsid();
    rename();
    // Let go of lockrun's stdio, so nobody reading its output waits for the watchdog.
    if let Ok(null) = open(c"/dev/null", OFlag::O_RDWR, Mode::empty()) {
        let _ = (dup2_stdin(&null), dup2_stdout(&null), dup2_stderr(&null));
    }
    let mut heard = Heard::default();
    let mut terminate_at = None;
    let mut kill_at = None;
    let mut outcome = GroupEnd::NotYet;
    let mut pending = Vec::new();
    loop {
        let now = Moment::now().since_boot();
        let next = [terminate_at, kill_at].into_iter().flatten().min();
        let due = next.is_some_and(|at: Duration| at <= now);
        // What lockrun said comes first: a moment may have passed while the
        // watchdog itself was held up, and lockrun, going on, told it newer
        // moments or the group meanwhile.
        let timeout = if due {
            PollTimeout::ZERO
        } else {
            next.map_or(PollTimeout::NONE, |at| {
                let left = at.saturating_sub(now);
                // Rounded up, so that the deadline has passed when the poll ends; a minute at most.
                PollTimeout::try_from(left.min(Duration::from_secs(60)) + Duration::from_millis(1))
                    .unwrap_or(PollTimeout::MAX)
            })
        };
        let mut fds = [PollFd::new(listen.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) if due => {
                // A deadline lockrun did not act on: it is stopped or starved.
                let group = heard.group(quiet);
                if terminate_at.take().is_some() {
                    // Seen before the kill moment, itself before the lease's end,
                    // a group with nothing running ended in time on its own.
                    if group.is_some_and(|group| !proc::group_has_live_process(group)) {
                        // Nothing was running when the search ended, which may be later than `now`.
                        let looked = Moment::now().since_boot();
                        let in_time = kill_at.is_some_and(|kill_at| looked <= kill_at);
                        outcome = if in_time {
                            GroupEnd::EndedInTime
                        } else {
                            GroupEnd::EndedUnseen
                        };
                        kill_at = None;
                        continue;
                    }
                    outcome = GroupEnd::Stopped;
                    signal(group, Signal::SIGTERM);
                    signal(group, Signal::SIGCONT);
                } else if kill_at.take().is_some() {
                    outcome = GroupEnd::Stopped;
                    signal(group, Signal::SIGKILL);
                }
                continue;
            }
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => lockrun_is_gone(heard.group(quiet)),
        }
        let mut buffer = [0u8; 64];
        match read(listen, &mut buffer) {
            Ok(0) => lockrun_is_gone(heard.group(quiet)),
            Ok(got) => pending.extend_from_slice(&buffer[..got]),
            Err(Errno::EINTR) => continue,
            Err(_) => lockrun_is_gone(heard.group(quiet)),
        }
        while let Some(&tag) = pending.first() {
            match tag {
                DISMISS => exit(),
                ASK => {
                    // If lockrun is gone, nobody is left to tell.
                    let _ = write(listen, &[outcome.byte()]);
                    pending.drain(..1);
                }
                HOLD if pending.len() >= HOLD_LEN => {
                    let at =
                        |bytes: &[u8]| match u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
                        {
                            u64::MAX => None,
                            nanos => Some(Duration::from_nanos(nanos)),
                        };
                    terminate_at = at(&pending[1..9]);
                    kill_at = at(&pending[9..HOLD_LEN]);
                    pending.drain(..HOLD_LEN);
                }
                // A message not whole yet: the rest comes with the next read.
                HOLD => break,
                _ => lockrun_is_gone(heard.group(quiet)),
            }
        }
    }
}

/// What the quiet socket said so far.
#[derive(Default)]
struct Heard {
    group: Option<Pid>,
    ended: bool,
    pending: Vec<u8>,
}

impl Heard {
    /// The group to stop, once what came on the quiet socket is read: none
    /// before the command named it, nor once lockrun said it ended.
    fn group(&mut self, quiet: &OwnedFd) -> Option<Pid> {
        while matches!(receive(quiet, &mut self.pending), Ok(1..)) {}
        while let Some(&tag) = self.pending.first() {
            match tag {
                // Its files came with it, and stay open as they are.
                KEEP => drop(self.pending.drain(..1)),
                ENDED => {
                    self.ended = true;
                    self.pending.drain(..1);
                }
                GROUP if self.pending.len() >= GROUP_LEN => {
                    let id = self.pending[1..GROUP_LEN].try_into().expect("4 bytes");
                    self.group = Some(Pid::from_raw(i32::from_le_bytes(id)));
                    self.pending.drain(..GROUP_LEN);
                }
                // Not whole yet: the rest is read at the next look.
                GROUP => break,
                // Nothing lockrun says: whatever it is, the group is not known to be over.
                _ => lockrun_is_gone(self.group),
            }
        }
        self.group.filter(|_| !self.ended)
    }
}

/// Reads, without waiting, what came on the quiet socket into `pending`; the
/// files that came with it are open in this process from now on, and stay so
/// until it exits. Returns how many bytes came (0: nothing more will).
fn receive(quiet: &OwnedFd, pending: &mut Vec<u8>) -> nix::Result<usize> {
    let mut buffer = [0u8; 256];
    // Room for as many as one message brings: files that do not fit would be closed.
    let mut files = nix::cmsg_space!([RawFd; KEEP_AT_ONCE]);
    let mut slices = [IoSliceMut::new(&mut buffer)];
    let got = recvmsg::<()>(
        quiet.as_raw_fd(),
        &mut slices,
        Some(&mut files),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?
    .bytes;
    pending.extend_from_slice(&buffer[..got]);
    Ok(got)
}

/// Closes every descriptor above stdio but `keep`: what lockrun had open
/// when it forked (its place in line, locked) is not the watchdog's to hold.
fn close_all_but(keep: [RawFd; 2]) {
    let [low, high] = if keep[0] < keep[1] {
        keep
    } else {
        [keep[1], keep[0]]
    };
    let ranges = [(3, low - 1), (low + 1, high - 1), (high + 1, RawFd::MAX)];
    let closed = ranges
        .into_iter()
        .filter(|(first, last)| first <= last)
        .all(|(first, last)| {
            // SAFETY: close_range(2) only closes descriptors, none of which
            // this process uses but the two it keeps.
            let done = unsafe {
                nix::libc::syscall(
                    nix::libc::SYS_close_range,
                    first,
                    last,
                    0 as nix::libc::c_uint,
                )
            };
            done == 0
        });
    if !closed {
        // Before Linux 5.9: one at a time, those /proc lists.
        close_listed(keep);
    }
}

fn close_listed(keep: [RawFd; 2]) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let open: Vec<RawFd> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2 && !keep.contains(fd))
        .collect();
    for fd in open {
        let _ = nix::unistd::close(fd);
    }
}

/// lockrun died (or said something no lockrun says): the command must not run on without it.
fn lockrun_is_gone(group: Option<Pid>) -> ! {
    signal(group, Signal::SIGKILL);
    exit()
}

/// Signals the guarded group, once the command has named it.
fn signal(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
}

fn exit() -> ! {
    // SAFETY: ends this forked process without running lockrun's exit handlers.
    unsafe { nix::libc::_exit(0) }
}

/// Takes the watchdog's own name: its command name, and its command line in
/// place of lockrun's (this process's own copy of it since the fork).
fn rename() {
    let _ = nix::sys::prctl::set_name(NAME);
    super::startup::retitle(NAME);
}
