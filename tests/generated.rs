//! The man pages in `man/` and the shell completions in `completions/` are
//! generated from the clap definition and committed. This test fails when they
//! drift from the CLI; `LOCKRUN_REGENERATE=1 cargo test generated` rewrites them.

use std::fs;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};
use lockrun::cli::Cli;

/// Every generated file: its path in the repository and its content.
fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut command = Cli::command();
    command.build();

    let mut page = Vec::new();
    // `lockrun help` is for the terminal; the man pages cover every subcommand themselves.
    let main = Man::new(command.clone().disable_help_subcommand(true));
    main.render(&mut page).expect("render the man page");
    page.extend(exit_status().to_roff().as_bytes());
    files.push((PathBuf::from("man").join(main.get_filename()), page));
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        // Built, a subcommand is named `lockrun-status`: its page is lockrun-status.1.
        let subpage = Man::new(sub.clone());
        let mut page = Vec::new();
        subpage
            .render(&mut page)
            .expect("render a subcommand's man page");
        files.push((PathBuf::from("man").join(subpage.get_filename()), page));
    }

    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::Elvish,
        Shell::PowerShell,
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command, "lockrun", &mut script);
        let file_name = match shell {
            Shell::Bash => "lockrun.bash",
            Shell::Zsh => "_lockrun",
            Shell::Fish => "lockrun.fish",
            Shell::Elvish => "lockrun.elv",
            _ => "_lockrun.ps1",
        };
        files.push((PathBuf::from("completions").join(file_name), script));
    }
    files
}

/// SPEC §2, which clap knows nothing about.
fn exit_status() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (status, meaning) in [
        ("the command", "the command ran; its own exit status"),
        ("128+N", "the command was ended by signal N"),
        ("64", "usage error: bad flag, value or name"),
        (
            "69",
            "backend unavailable: Redis unreachable or refusing auth, database or directory unusable",
        ),
        ("70", "internal error"),
        (
            "75",
            "no slot acquired (busy with --no-wait, or --timeout passed); change it with -E",
        ),
        (
            "76",
            "the lease was lost while the command ran; lockrun stopped the command",
        ),
        ("124", "--max-runtime passed; lockrun stopped the command"),
        (
            "126, 127",
            "the command cannot be executed (not executable, or a script whose #! interpreter is missing) / was not found",
        ),
    ] {
        roff.control("TP", []);
        roff.text([bold(status)]);
        roff.text([roman(meaning)]);
    }
    roff
}

#[test]
fn man_pages_and_completions_match_the_cli() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let regenerate = std::env::var_os("LOCKRUN_REGENERATE").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (path, content) in generated() {
        let full = root.join(&path);
        if regenerate {
            fs::create_dir_all(full.parent().expect("in a directory")).expect("create directory");
            fs::write(&full, &content).expect("write a generated file");
        } else if fs::read(&full).ok().as_deref() != Some(&content[..]) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date with the CLI: {}; run `LOCKRUN_REGENERATE=1 cargo test generated` and commit",
        stale.join(", ")
    );
}

#[test]
fn bash_completes_subcommands_and_options() {
    // The script as generated now: the test above checks that the committed one is the same.
    let (_, bash) = generated()
        .into_iter()
        .find(|(path, _)| path.ends_with("lockrun.bash"))
        .expect("a bash script");
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("lockrun.bash");
    fs::write(&script, bash).expect("write the script");
    // Drives the completion function the way bash does on <Tab>.
    let complete = |line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        let program = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; \
             _lockrun lockrun '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display(),
            words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            words.len() - 1,
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let output = std::process::Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .expect("run bash");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let first = complete("lockrun ");
    assert!(
        first.lines().any(|w| w == "status") && first.lines().any(|w| w == "release"),
        "{first}"
    );
    let options = complete("lockrun --time");
    assert_eq!(options.trim(), "--timeout");
    let backends = complete("lockrun --backend ");
    assert_eq!(
        backends.split_whitespace().collect::<Vec<_>>(),
        ["file", "sqlite", "redis"]
    );
    let status = complete("lockrun status --");
    assert!(status.lines().any(|w| w == "--json"), "{status}");
}
