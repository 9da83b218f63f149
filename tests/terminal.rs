//! lockrun in the foreground of an interactive terminal (docs/guide.md: "Signals and the
//! process group"): the command can read the terminal, a Ctrl-C reaches it
//! exactly once, Ctrl-Z and `fg` work.

use crate::support::pty::Shell;
use crate::support::*;

#[test]
fn ctrl_c_reaches_the_command_once() {
    let scratch = Scratch::new();
    let mut shell = Shell::bash();
    let script = format!(
        "trap \"echo INT >> {log}; exit 5\" INT; touch {ready}; while :; do sleep 0.02; done",
        log = scratch.path("log").display(),
        ready = scratch.path("ready").display(),
    );
    start(&mut shell, &scratch, &script, "; echo \"exit=$?\"");
    shell.send("\x03");
    shell.wait_for("exit=5");
    assert_eq!(
        scratch.lines("log"),
        ["INT"],
        "one SIGINT, from the kernel, none forwarded"
    );
}

#[test]
fn the_command_reads_the_terminal_and_survives_ctrl_z_and_fg() {
    let scratch = Scratch::new();
    let mut shell = Shell::bash();
    let script = reads_a_line(&scratch);
    // No `; echo` after it: a stopped job ends a command list in bash.
    start(&mut shell, &scratch, &script, "");
    shell.send("\x1a");
    shell.wait_for("Stopped");
    bring_to_foreground_and_type(&mut shell, &scratch);
    shell.send("echo \"exit=$?\"\n");
    shell.wait_for("exit=0");
}

/// Types a lockrun command line running `script` (which touches `ready`), then waits for `ready`.
fn start(shell: &mut Shell, scratch: &Scratch, script: &str, rest_of_line: &str) {
    let dir = scratch.path("locks");
    shell.send(&format!(
        "lockrun --dir {} --name tty -c '{script}'{rest_of_line}\n",
        dir.display()
    ));
    wait_for_file(&scratch.path("ready"));
}

#[test]
fn a_background_command_that_reads_the_terminal_waits_for_fg() {
    let scratch = Scratch::new();
    let mut shell = Shell::bash();
    let script = reads_a_line(&scratch);
    start(&mut shell, &scratch, &script, " &");
    // The command's terminal read stops it, and lockrun with it: the shell reports the job
    // stopped before its next prompt, so press Enter until it does.
    shell.enter_until("Stopped");
    bring_to_foreground_and_type(&mut shell, &scratch);
}

/// A command that says it is ready, then reads a line from the terminal into `out`.
fn reads_a_line(scratch: &Scratch) -> String {
    format!(
        "touch {ready}; read line; echo \"got:$line\" > {out}",
        ready = scratch.path("ready").display(),
        out = scratch.path("out").display(),
    )
}

/// `fg`, then a line for the command, which must read it.
fn bring_to_foreground_and_type(shell: &mut Shell, scratch: &Scratch) {
    shell.send("fg\n");
    shell.send("typed after fg\n");
    wait_until("the command to read the line", || {
        std::fs::read_to_string(scratch.path("out")).is_ok_and(|out| out == "got:typed after fg\n")
    });
}

#[test]
fn ctrl_c_while_waiting_clears_the_live_line() {
    let scratch = Scratch::new();
    let locks = scratch.path("locks");
    let store = Store::file_in(&locks);
    let holder = crate::core::hold(&store, &scratch, "tty", &[]);
    let mut shell = Shell::bash();
    shell.send(&format!(
        "lockrun --dir {} --name tty true\n",
        locks.display()
    ));
    shell.wait_for("waiting for tty");
    shell.send("\x03");
    // A job ended by SIGINT ends its command list too: its status is asked for on a line of its own.
    shell.send("echo \"exit=$?\"\n");
    shell.wait_for("exit=130");
    let screen = shell.screen();
    let after_the_line = &screen[screen.rfind("waiting for tty").unwrap()..];
    assert!(
        after_the_line.contains("\r\x1b[K"),
        "the line was left on the terminal: {after_the_line:?}"
    );
    std::fs::write(scratch.path("release"), "").unwrap();
    assert_status(&finish(holder), 0);
}

/// A command that cannot be executed may have taken the terminal's foreground
/// before its exec failed: lockrun takes it back, so that the rest of its
/// pipeline (a pager, say) can still read the terminal.
#[test]
fn a_command_that_cannot_be_executed_leaves_the_terminal_to_the_pipeline() {
    let scratch = Scratch::new();
    let mut shell = Shell::bash();
    shell.send(&format!(
        "lockrun --dir {dir} --name tty /nonexistent/command | \
         {{ cat >/dev/null; read line </dev/tty; echo \"got:$line\" > {out}; }}\n",
        dir = scratch.path("locks").display(),
        out = scratch.path("out").display(),
    ));
    shell.send("typed after the failure\n");
    wait_until("the pipeline to read the line", || {
        std::fs::read_to_string(scratch.path("out"))
            .is_ok_and(|out| out == "got:typed after the failure\n")
    });
}
