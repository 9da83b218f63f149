//! execvp(3) split in two. glibc's execvp searches `PATH` and, for a file
//! without `#!`, builds the `/bin/sh` argument list on the stack of its caller:
//! in a child that shares lockrun's memory on a small fixed stack, a long
//! argument list overran it. Here lockrun builds every path to try and every
//! argument list beforehand, and the child only calls execve(2) on them.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use nix::errno::Errno;
use nix::libc;

/// What execvp(3) runs a file the kernel cannot execute (no `#!`) with.
const SHELL: &CStr = c"/bin/sh";

/// glibc's search path when `PATH` is unset (`confstr(_CS_PATH)`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Everything exec needs, built before the child exists.
pub struct Exec {
    /// The paths to try, in execvp(3)'s order.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Exec {
    /// `argv[0]` is looked up in lockrun's `PATH` as execvp(3) does; `env` is
    /// added to (and overrides) lockrun's own environment.
    pub fn new(argv: &[&OsStr], env: &[(&str, String)]) -> io::Result<Self> {
        let overridden = |key: &OsStr| env.iter().any(|(k, _)| OsStr::new(k) == key);
        let mut envp: Vec<CString> = std::env::vars_os()
            .filter(|(key, _)| !overridden(key))
            .map(|(key, value)| c_string(&[&key, OsStr::new("="), &value]))
            .collect::<io::Result<_>>()?;
        for (key, value) in env {
            envp.push(c_string(&[
                OsStr::new(key),
                OsStr::new("="),
                OsStr::new(value),
            ])?);
        }
        Ok(Self {
            candidates: candidates(argv[0])?,
            argv: argv
                .iter()
                .map(|arg| c_string(&[arg]))
                .collect::<io::Result<_>>()?,
            envp,
        })
    }

    /// The first path tried that is a file. execve(2) says "not found" for a
    /// file whose interpreter is missing too: after that error, this is the file.
    pub fn found(&self) -> Option<&Path> {
        self.candidates
            .iter()
            .map(|path| Path::new(OsStr::from_bytes(path.to_bytes())))
            .find(|path| path.is_file())
    }

    /// The pointer arrays execve(2) takes, to be built before the child exists.
    pub(super) fn prepare(&self) -> Prepared<'_> {
        let argv = pointers(&self.argv);
        let script_argv = [SHELL.as_ptr(), ptr::null()]
            .into_iter()
            .chain(argv.iter().skip(1).copied())
            .collect();
        Prepared {
            candidates: &self.candidates,
            argv,
            envp: pointers(&self.envp),
            script_argv,
        }
    }
}

/// The paths execvp(3) tries for `program`: the name itself when it has a `/`;
/// else every `PATH` entry in turn, an empty entry meaning the current directory.
fn candidates(program: &OsStr) -> io::Result<Vec<CString>> {
    let name = program.as_bytes();
    if name.is_empty() {
        // execvp(3) finds nothing under an empty name.
        return Ok(Vec::new());
    }
    if name.contains(&b'/') {
        return Ok(vec![c_string(&[program])?]);
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    search
        .as_bytes()
        .split(|&byte| byte == b':')
        .map(|dir| match dir {
            b"" => c_string(&[program]),
            dir => c_string(&[OsStr::from_bytes(dir), OsStr::new("/"), program]),
        })
        .collect()
}

/// The parts joined, in one allocation (the NUL included): there is one per
/// variable of the environment and per `PATH` entry at every start.
fn c_string(parts: &[&OsStr]) -> io::Result<CString> {
    let mut bytes = Vec::with_capacity(parts.iter().map(|part| part.len()).sum::<usize>() + 1);
    for part in parts {
        bytes.extend_from_slice(part.as_bytes());
    }
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain([ptr::null()])
        .collect()
}

/// execve(2)'s arguments, pointing into the `Exec` they were prepared from.
pub(super) struct Prepared<'a> {
    candidates: &'a [CString],
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// `/bin/sh`, the file (filled in by the child), `argv[1..]`, NULL.
    script_argv: Vec<*const c_char>,
}

impl Prepared<'_> {
    /// execvp(3) on what was prepared: returns only when no candidate could be
    /// executed, with the errno execvp would have left. Runs in the child, so
    /// it allocates nothing and uses the same little stack whatever the sizes.
    pub(super) fn exec(&mut self) -> i32 {
        let mut denied = false;
        let mut errno = libc::ENOENT;
        for path in self.candidates {
            errno = self.exec_file(path);
            match errno {
                // Found but not ours to run: said at the end if nothing else runs.
                libc::EACCES => denied = true,
                // Not there (glibc also skips the odd errors of network file systems).
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return errno,
            }
        }
        if denied { libc::EACCES } else { errno }
    }

    /// execve(2) on `path`, then `/bin/sh path ARGS` if the kernel does not know its format.
    fn exec_file(&mut self, path: &CStr) -> i32 {
        // SAFETY: NUL-terminated strings in NULL-terminated arrays, alive until exec.
        unsafe { libc::execve(path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
        if Errno::last_raw() == libc::ENOEXEC {
            if let Some(file) = self.script_argv.get_mut(1) {
                *file = path.as_ptr();
            }
            // SAFETY: as above; `script_argv` points into the same strings and `path`.
            unsafe {
                libc::execve(
                    SHELL.as_ptr(),
                    self.script_argv.as_ptr(),
                    self.envp.as_ptr(),
                )
            };
        }
        Errno::last_raw()
    }
}
