//! The live waiting line (docs/operating.md: "Who holds a lock"): when stderr is a terminal and a wait lasts
//! more than a second, one stderr line rewritten in place says who holds the
//! lock and for how long, and is cleared once the wait ends.
//!
//! The acquire loop owns it and asks [`Progress::redraw_due`] how long a backend
//! wait may last before the line needs redrawing; backends that block (the file
//! backend's kernel wait, Redis's BLPOP) return at that moment.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::backend::Entry;
use crate::platform::clock::Moment;
use crate::platform::{interrupt, terminal};
use crate::report::in_line;

/// The line appears after this long and is redrawn this often.
const EVERY: Duration = Duration::from_secs(1);

const ERASE: &str = terminal::ERASE_LINE;

pub struct Progress {
    /// `None` when stderr is not a terminal or diagnostics are not for people.
    live: Option<Live>,
}

struct Live {
    name: String,
    next_draw: Moment,
    /// The text on screen, if any, so it can be put back after another line.
    shown: Option<String>,
}

impl Progress {
    /// A live line for `name` when `wanted` (text diagnostics, not `-q`) and stderr is a terminal.
    pub fn new(wanted: bool, name: &str, started: Moment) -> Self {
        let live = (wanted && std::io::stderr().is_terminal()).then(|| Live {
            name: name.to_owned(),
            next_draw: started + EVERY,
            shown: None,
        });
        Self { live }
    }

    /// When the line next needs drawing; `None` when there is no live line.
    pub fn redraw_due(&self) -> Option<Moment> {
        self.live.as_ref().map(|live| live.next_draw)
    }

    /// Draws the line for our `position` and the `holders` (the caller checks [`Progress::redraw_due`]).
    pub fn draw(&mut self, holders: &[Entry], position: u32) {
        let Some(live) = &mut self.live else { return };
        live.next_draw = Moment::now() + EVERY;
        // "waiting for backup: 3rd in line, held by pid 4242 on web-1 for 3m12s (./backup.sh)"
        let text = fit(&format!(
            "waiting for {}{}",
            live.name,
            in_line(position, holders)
        ));
        put(&format!("{ERASE}{text}"));
        if live.shown.is_none() {
            interrupt::erase_line_first();
        }
        live.shown = Some(text);
    }

    /// Prints a whole line of diagnostics without mangling the live line.
    pub fn around(&self, print: impl FnOnce()) {
        let shown = self.live.as_ref().and_then(|live| live.shown.as_deref());
        if shown.is_some() {
            put(ERASE);
        }
        print();
        if let Some(text) = shown {
            put(text);
        }
    }

    /// Clears the line: the wait is over, whatever its outcome.
    pub fn finish(&mut self) {
        if let Some(live) = &mut self.live
            && live.shown.take().is_some()
        {
            put(ERASE);
            interrupt::leave_the_line();
        }
    }
}

/// Cuts the line to the terminal's width: a wrapped line cannot be rewritten in place.
fn fit(text: &str) -> String {
    let width = terminal::width(&std::io::stderr()).unwrap_or(80).max(20);
    if text.chars().count() < width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width - 2).collect();
    cut.push('…');
    cut
}

fn put(text: &str) {
    // stderr may be gone; the wait must go on regardless.
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}
