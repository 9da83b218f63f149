//! The interpreter a script's `#!` line names, read the way the kernel reads it,
//! to say which one is missing when execve(2) reports the script as not found.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The most of a file the kernel reads for its `#!` line.
const LINE_MAX: u64 = 256;

/// The first word after `#!`, if `script` starts with one.
pub fn interpreter(script: &Path) -> Option<String> {
    let mut head = Vec::new();
    File::open(script)
        .ok()?
        .take(LINE_MAX)
        .read_to_end(&mut head)
        .ok()?;
    let line = head
        .strip_prefix(b"#!")?
        .split(|&byte| byte == b'\n')
        .next()?;
    let word = line
        .split(|byte| b" \t\0".contains(byte))
        .find(|word| !word.is_empty())?;
    Some(String::from_utf8_lossy(word).into_owned())
}
