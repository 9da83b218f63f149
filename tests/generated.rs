//! The man pages in `man/` and the shell completions in `completions/` are
//! generated from the clap definition and the docs (README.md, docs/), and committed. This test
//! fails when they drift from either; `LOCKRUN_REGENERATE=1 cargo test generated`
//! rewrites them.

mod readme;

use std::fs;
use std::path::{Path, PathBuf};

use clap::{Command, CommandFactory};
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};
use lockrun::cli::Cli;

use crate::support::docs::Doc;
use readme::{inline, to_roff};

/// Every generated file: its path in the repository and its content.
fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut command = Cli::command();
    command.build();

    // `lockrun help` is for the terminal; the man pages cover every subcommand themselves.
    let main = Man::new(Cli::command().disable_help_subcommand(true));
    files.push((
        PathBuf::from("man").join(main.get_filename()),
        manual(&main, &command),
    ));
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
        let script = after_dashes(shell, script);
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

/// The script of `shell`, made to complete the words after `--` as the
/// shell completes a command line of its own: they are the command's, not
/// lockrun's (clap's scripts would offer lockrun's options there).
fn after_dashes(shell: Shell, script: Vec<u8>) -> Vec<u8> {
    let script = String::from_utf8(script).expect("a script is text");
    let (at, code) = match shell {
        Shell::Bash => (
            "    COMPREPLY=()\n",
            r#"    # Past `--` the words are the command's: complete them as bash would.
    local dashes
    for (( dashes = 1; dashes < COMP_CWORD; dashes++ )); do
        [[ ${COMP_WORDS[dashes]} == -- ]] || continue
        if declare -F _command_offset >/dev/null; then
            _command_offset $((dashes + 1))
        elif (( COMP_CWORD == dashes + 1 )); then
            COMPREPLY=($(compgen -c -- "${COMP_WORDS[COMP_CWORD]}"))
        else
            COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}"))
        fi
        return 0
    done
"#,
        ),
        Shell::Zsh => (
            "    local ret=1\n",
            r"    # Past `--` the words are the command's: complete them as zsh would.
    local dashes=${words[(i)--]}
    if (( dashes < CURRENT )); then
        shift $dashes words
        (( CURRENT -= dashes ))
        _normal
        return
    fi
",
        ),
        Shell::Fish => (
            "    set -e cmd[1]\n",
            "    # Past `--` the words are the command's (below), not lockrun's.\n    contains -- -- $cmd; and return 1\n",
        ),
        _ => return script.into_bytes(),
    };
    let (head, tail) = script
        .split_once(at)
        .unwrap_or_else(|| panic!("clap's {shell} script has no {at:?}"));
    let mut script = format!("{head}{at}{code}{tail}");
    if shell == Shell::Fish {
        script.push_str(
            r"
# Past `--` the words are the command's: complete them as fish would.
function __fish_lockrun_after_dashes
    set -l words (commandline -opc) (commandline -ct)
    set -l dashes (contains -i -- -- $words)
    __fish_complete_subcommand --commandline $words[(math $dashes + 1)..-1]
end
complete -c lockrun -n 'contains -- -- (commandline -opc)' -f -a '(__fish_lockrun_after_dashes)'
",
        );
    }
    script.into_bytes()
}

/// One of `Man::render_*_section`: a section of clap's page.
type RenderSection = fn(&Man, &mut dyn std::io::Write) -> std::io::Result<()>;

/// The documents lockrun(1) is made from.
struct Docs {
    readme: Doc,
    guide: Doc,
    operating: Doc,
    recipes: Doc,
}

impl Docs {
    fn load() -> Self {
        Self {
            readme: Doc::load("README.md"),
            guide: Doc::load("docs/guide.md"),
            operating: Doc::load("docs/operating.md"),
            recipes: Doc::load("docs/recipes.md"),
        }
    }
}

/// lockrun(1): clap's sections for the command line, then the docs' for
/// everything else, so that the page is the full reference.
fn manual(page: &Man, command: &Command) -> Vec<u8> {
    let docs = Docs::load();
    // Each of clap's renderings starts with roff's definition of the apostrophe: the page needs it once.
    let preamble = Roff::new().render();
    let clap_section = |render: RenderSection| {
        let mut section = Vec::new();
        render(page, &mut section).expect("render a man page section");
        assert!(section.starts_with(preamble.as_bytes()), "{section:?}");
        section.split_off(preamble.len())
    };
    let mut roff = preamble.as_bytes().to_vec();
    for render in [
        Man::render_title,
        Man::render_name_section,
        Man::render_synopsis_section,
    ] {
        roff.extend(clap_section(render));
    }
    // The README's opening, not clap's about, which NAME says already.
    let mut description = Roff::new();
    description.control("SH", ["DESCRIPTION"]);
    description.extend([to_roff(docs.readme.section_without_subsections("lockrun"))]);
    roff.extend(description.to_roff().into_bytes());
    roff.extend(clap_section(Man::render_options_section));
    // After the options: durations and the rules for the command's words.
    let notes = usage_notes(docs.readme.section_without_subsections("Usage"));
    roff.extend(to_roff(&notes).to_roff().into_bytes());
    roff.extend(clap_section(Man::render_subcommands_section));
    roff.extend(reference(command, &docs).to_roff().into_bytes());
    roff
}

/// The sections after the command line's, from the docs.
fn reference(command: &Command, docs: &Docs) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["WHY NOT FLOCK(1)?"]);
    roff.extend([to_roff(docs.readme.section("Why not flock(1)?"))]);
    roff.control("SH", ["BACKENDS"]);
    roff.extend([to_roff(docs.readme.section("Which backend when"))]);
    for backend in lockrun::backend::NAMES {
        // Each backend's page (`docs/backends/sqlite.md`, `# SQLite backend`) makes its part of the page.
        let page = Doc::load(&format!("docs/backends/{backend}.md"));
        let title = page
            .titles(1)
            .next()
            .filter(|title| {
                let title = title.to_lowercase();
                title.starts_with(backend) && title.ends_with(" backend")
            })
            .unwrap_or_else(|| panic!("{} is not titled \"{backend} backend\"", page.path()));
        roff.control("SS", [title]);
        roff.extend([to_roff(page.body())]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    roff.extend([environment_read(command)]);
    for title in ["The command's environment", "A lockrun inside a lockrun"] {
        roff.control("SS", [title]);
        roff.extend([to_roff(docs.guide.section(title))]);
    }
    for (heading, doc, section) in [
        ("THE COMMAND", &docs.guide, "What the command gets"),
        ("SIGNALS", &docs.guide, "Signals and the process group"),
        ("SLOTS", &docs.guide, "Slots"),
        ("SHARED LOCKS", &docs.guide, "Shared locks"),
        ("SEVERAL NAMES", &docs.guide, "Several names"),
        ("THE WAITING LINE", &docs.guide, "The waiting line"),
        (
            "TROUBLE WITH THE STORE",
            &docs.guide,
            "When the server has trouble",
        ),
        ("EXIT STATUS", &docs.readme, "Exit status"),
        ("STATUS", &docs.operating, "Who holds a lock"),
        ("RELEASE", &docs.operating, "Breaking a dead lease"),
        (
            "EVENTS",
            &docs.operating,
            "Feeding the events to a log pipeline",
        ),
        ("FILES", &docs.operating, "Files"),
        ("EXAMPLES", &docs.recipes, "Recipes"),
    ] {
        roff.control("SH", [heading]);
        let text = if heading == "THE COMMAND" {
            // Its subsections have sections of their own above and below.
            doc.section_without_subsections(section)
        } else {
            doc.section(section)
        };
        roff.extend([to_roff(text)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([
        bold("lockrun-status"),
        roman("(1), "),
        bold("lockrun-release"),
        roman("(1), "),
        bold("flock"),
        roman("(1)"),
    ]);
    roff
}

/// The Usage section's notes: its paragraphs, without the synopsis and the
/// options table that clap's own sections show.
fn usage_notes(usage: &str) -> String {
    usage
        .split("\n\n")
        .filter(|block| {
            let block = block.trim_start();
            !block.starts_with("```") && !block.starts_with('|')
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The variables lockrun reads, from the options that read them.
fn environment_read(command: &Command) -> Roff {
    let mut roff = Roff::new();
    roff.control("PP", []);
    roff.text([roman(
        "Each of these sets the option named; a flag wins over its variable \
         (but see A lockrun inside a lockrun, below).",
    )]);
    for arg in command.get_arguments() {
        let (Some(variable), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        roff.control("TP", []);
        roff.text([bold(variable.to_string_lossy())]);
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let mut text = vec![bold(format!("--{long}")), roman(": ")];
        text.extend(inline(&help));
        roff.text(text);
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
        "out of date with the CLI or the README: {}; run `LOCKRUN_REGENERATE=1 cargo test --test integration generated` and commit",
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
        lockrun::backend::NAMES
    );
    let status = complete("lockrun status --");
    assert!(status.lines().any(|w| w == "--json"), "{status}");
}

/// The generated script of `file_name`, written to a new directory.
fn script_in_a_directory(file_name: &str) -> (tempfile::TempDir, PathBuf) {
    // The script as generated now: the first test checks that the committed one is the same.
    let (_, script) = generated()
        .into_iter()
        .find(|(path, _)| path.ends_with(file_name))
        .expect("a generated script");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(file_name);
    fs::write(&path, script).expect("write the script");
    (dir, path)
}

#[test]
fn bash_completes_the_command_after_dashes() {
    let (_dir, script) = script_in_a_directory("lockrun.bash");
    // Drives the completion function the way bash does on <Tab>, without bash-completion.
    let complete = |words: &[&str]| {
        let program = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
             COMP_POINT=${{#COMP_LINE}}; _lockrun lockrun '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display(),
            words.join(" "),
            words.len() - 1,
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let output = std::process::Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .expect("run bash");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let commands = complete(&["lockrun", "--name", "x", "--", "ec"]);
    assert!(commands.lines().any(|w| w == "echo"), "{commands}");
    assert!(!commands.contains("--"), "lockrun's options: {commands}");
    let options = complete(&["lockrun", "--name", "x", "--", "echo", "--time"]);
    assert!(!options.contains("--timeout"), "{options}");
}

#[test]
fn fish_completes_the_command_after_dashes() {
    if !crate::support::program_installed("fish", "fish's completion") {
        return;
    }
    let (dir, script) = script_in_a_directory("lockrun.fish");
    let complete = |line: &str| {
        let program = format!("source '{}'; complete -C '{line}'", script.display());
        // fish's own completions (for the command's options) load; no user's configuration does.
        let output = std::process::Command::new("fish")
            .env("XDG_CONFIG_HOME", dir.path())
            .args(["-c", &program])
            .output()
            .expect("run fish");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let commands = complete("lockrun --name x -- ech");
    assert!(
        commands.lines().any(|w| w.starts_with("echo")),
        "{commands}"
    );
    assert!(!commands.contains("status"), "{commands}");
    // The command's own options, as fish knows them.
    let options = complete("lockrun --name x -- ls --all");
    assert!(options.lines().any(|w| w.starts_with("--all")), "{options}");
    let own = complete("lockrun --time");
    assert!(own.starts_with("--timeout"), "{own:?}");
}

#[test]
fn zsh_completes_the_command_after_dashes() {
    if !crate::support::program_installed("zsh", "zsh's completion") {
        return;
    }
    let (dir, _) = script_in_a_directory("_lockrun");
    let mut shell = crate::support::pty::Shell::zsh();
    shell.send(&format!(
        "fpath=({} $fpath); autoload -U compinit; compinit -u -D; echo ready\n",
        dir.path().display()
    ));
    shell.wait_for("ready\r\n");
    // One command starts with "printen": <Tab> writes it out whole.
    shell.send("lockrun --name x -- printen\t");
    shell.wait_for("printenv");
}

#[test]
fn the_manual_is_the_full_reference() {
    let (_, page) = generated()
        .into_iter()
        .find(|(path, _)| path.ends_with("lockrun.1"))
        .expect("lockrun(1)");
    let page = String::from_utf8(page).expect("roff is text");
    for needle in [
        ".SH SLOTS",
        // status: its columns, its JSON keys and its exit statuses
        ".SH STATUS",
        "EXPIRES",
        "waiting_since",
        "It exits 0, or 69",
        // release and its exit statuses
        ".SH RELEASE",
        "exits 0 when it released something",
        // every event
        ".SH EVENTS",
        "transient\\-error",
        "renewed",
        "lost",
    ] {
        assert!(page.contains(needle), "lockrun(1) lacks {needle:?}");
    }
}

#[test]
fn help_and_man_pages_show_no_markdown() {
    for (path, content) in generated() {
        if path.starts_with("man") {
            let text = String::from_utf8_lossy(&content);
            assert!(!text.contains('`'), "{} shows a backtick", path.display());
        }
    }
    for subcommand in [&[][..], &["status"], &["release"]] {
        let help = crate::support::stdout(&crate::support::run(
            crate::support::lockrun().args(subcommand).arg("--help"),
        ));
        assert!(!help.contains('`'), "{subcommand:?} --help: {help}");
    }
}

/// What a flock(1) user needs most is in the man page too: why lockrun, how
/// flock's options map, and how the two run side by side.
#[test]
fn the_man_page_has_what_a_flock_user_needs() {
    let (_, page) = generated()
        .into_iter()
        .find(|(path, _)| path.ends_with("lockrun.1"))
        .expect("lockrun(1)");
    let page = String::from_utf8(page).expect("roff is text");
    let (_, flock) = page
        .split_once(".SH \"WHY NOT FLOCK(1)?\"")
        .expect("a section for flock(1) users");
    for said in [
        "flock(1)\\fR is fine until it isn't",
        "\\fBflock \\-n\\fR",
        "\\fB\\-x\\fR / \\fB\\-e\\fR / \\fB\\-\\-exclusive\\fR",
    ] {
        assert!(flock.contains(said), "{said}: {flock}");
    }
    assert!(page.contains("Moving from flock(1)"), "the recipe");
}
