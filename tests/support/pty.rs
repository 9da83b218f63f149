//! An interactive bash in a real pseudo-terminal, for what only a terminal
//! shows: Ctrl-C and Ctrl-Z from the keyboard, job control, terminal reads.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use super::PATIENCE;

/// A new pseudo-terminal whose two sides are not inherited by processes that
/// other tests start meanwhile (openpty(3) leaves them open across exec).
pub fn open(size: Option<&nix::pty::Winsize>) -> nix::pty::OpenptyResult {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    let pty = nix::pty::openpty(size, None).expect("a pseudo-terminal");
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).expect("close-on-exec");
    }
    pty
}

pub struct Shell {
    master: File,
    child: Child,
    screen: Arc<Mutex<Vec<u8>>>,
}

impl Shell {
    /// `bash -i` as the session leader of a new terminal, with lockrun on its `PATH`.
    pub fn bash() -> Self {
        Self::start("bash", &["--norc", "--noprofile", "-i"])
    }

    /// `zsh -i` without startup files, as [`Shell::bash`].
    pub fn zsh() -> Self {
        Self::start("zsh", &["-f", "-i"])
    }

    fn start(shell: &str, args: &[&str]) -> Self {
        let pty = open(None);
        let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup pty slave"));
        let mut command = Command::new(shell);
        command
            .args(args)
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .env("HISTFILE", "/dev/null")
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin_dir(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .stdin(slave(&pty.slave))
            .stdout(slave(&pty.slave))
            .stderr(slave(&pty.slave));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("LOCKRUN_") {
                command.env_remove(key);
            }
        }
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid()?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawn the shell");
        drop(pty.slave);
        let master = File::from(pty.master);
        let screen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("dup pty master");
        let sink = Arc::clone(&screen);
        thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // Ends with EIO once the shell and every process on the terminal are gone.
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                sink.lock()
                    .expect("screen lock")
                    .extend_from_slice(&buffer[..n]);
            }
        });
        let shell = Self {
            master,
            child,
            screen,
        };
        shell.wait_for("$ ");
        shell
    }

    /// Types `text` (a command line ends with "\n"; Ctrl-C is "\x03", Ctrl-Z "\x1a").
    pub fn send(&mut self, text: &str) {
        self.master
            .write_all(text.as_bytes())
            .expect("write to the terminal");
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().expect("screen lock")).into_owned()
    }

    /// Presses Enter every 50 ms until `needle` has appeared on the screen.
    pub fn enter_until(&mut self, needle: &str) {
        let started = std::time::Instant::now();
        while !self.screen().contains(needle) {
            assert!(
                started.elapsed() < PATIENCE,
                "no {needle:?} on the terminal within {PATIENCE:?}:\n{}",
                self.screen()
            );
            self.send("\n");
            thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits until `needle` has appeared on the screen.
    pub fn wait_for(&self, needle: &str) {
        let started = std::time::Instant::now();
        while !self.screen().contains(needle) {
            assert!(
                started.elapsed() < PATIENCE,
                "no {needle:?} on the terminal within {PATIENCE:?}; it shows:\n{}",
                self.screen()
            );
            thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin_dir() -> String {
    std::path::Path::new(env!("CARGO_BIN_EXE_lockrun"))
        .parent()
        .expect("bin dir")
        .display()
        .to_string()
}
