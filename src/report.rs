//! Diagnostics on stderr (docs/operating.md: "Feeding the events to a log pipeline"): text lines for people, or one JSON object
//! per event for log pipelines. stdout belongs to the command.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::backend::{Entry, Mode};
use crate::duration::display;
use crate::error::{Error, Trouble};
use crate::escape::escape_controls;
use crate::identity::epoch_millis;
use crate::timestamp::{now_rfc3339, rfc3339};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Quiet,
    Normal,
    Verbose,
}

pub enum Event<'a> {
    /// The first look found no slot for us.
    Waiting {
        holders: &'a [Entry],
        /// Our place in line, from 1; 0 when not in line.
        position: u32,
    },
    /// Waiting goes on: a backoff step begins, our place changed, or trouble is waited out.
    Retry {
        retry: Retry,
        position: u32,
        /// Longest time until the next look; `None` when only a wake-up ends the wait.
        delay: Option<Duration>,
    },
    Acquired {
        slot: u32,
        fence: u64,
        waited: Duration,
    },
    Renewed {
        ttl: Duration,
    },
    Released {
        slot: u32,
    },
    Lost {
        reason: &'a str,
    },
    /// Something worth knowing that is not an error (shown with `-v`).
    Notice {
        message: &'a str,
    },
    Error {
        message: &'a str,
    },
}

#[derive(Clone)]
pub struct Reporter {
    level: Level,
    format: Format,
    name: String,
    /// The mode a run holds its names in, once known: JSON events then say it.
    mode: Option<Mode>,
    /// The run's `--note`, which JSON events carry.
    note: Option<String>,
}

impl Reporter {
    pub fn new(level: Level, format: Format, name: impl Into<String>) -> Self {
        Self {
            level,
            format,
            name: name.into(),
            mode: None,
            note: None,
        }
    }

    /// This reporter, for a run that holds its names in `mode`.
    #[must_use]
    pub fn in_mode(self, mode: Mode) -> Self {
        Self {
            mode: Some(mode),
            ..self
        }
    }

    /// This reporter, for a run that says `note` about itself (`--note`).
    #[must_use]
    pub fn with_note(self, note: Option<String>) -> Self {
        Self { note, ..self }
    }

    /// This reporter, speaking of the lock `name`: a run of several names
    /// reports each one's events under its own name.
    #[must_use]
    pub fn about(&self, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..self.clone()
        }
    }

    /// The lock this reporter speaks of.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when diagnostics are text for a person (not JSON, not `-q`): a terminal
    /// then gets the live waiting line.
    pub fn speaks_to_people(&self) -> bool {
        self.format == Format::Text && self.level != Level::Quiet
    }

    /// True when events other than errors are shown, so callers can skip gathering their details.
    pub fn wants_details(&self) -> bool {
        match self.format {
            Format::Json => self.level != Level::Quiet,
            Format::Text => self.level == Level::Verbose,
        }
    }

    pub fn event(&self, event: &Event) {
        let shown = match event {
            Event::Error { .. } => self.level != Level::Quiet,
            _ => self.wants_details(),
        };
        if !shown {
            return;
        }
        let line = match self.format {
            // With -v, cron jobs sharing a log tell their lines apart by the pid, as syslog does.
            Format::Text if self.level == Level::Verbose => {
                format!("lockrun[{}]: {}", std::process::id(), self.text(event))
            }
            Format::Text => format!("lockrun: {}", self.text(event)),
            Format::Json => self.json(event).to_string(),
        };
        // stderr may be closed; diagnostics must never fail the run.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    pub fn error(&self, message: &str) {
        self.event(&Event::Error { message });
    }

    fn text(&self, event: &Event) -> String {
        let name = &self.name;
        match event {
            Event::Waiting { holders, position } => {
                format!("waiting for {name}{}", in_line(*position, holders))
            }
            Event::Retry {
                retry,
                position,
                delay,
            } => {
                let next = delay.map_or(String::new(), |delay| {
                    format!("; next try in {}", display(delay))
                });
                match retry {
                    Retry::Contended if delay.is_some() => {
                        format!("{name} still busy{}{next}", place(*position, ", "))
                    }
                    Retry::Contended => format!("{name}: now{}", place(*position, " ")),
                    Retry::Unavailable(why) | Retry::TransientError(why) => {
                        format!("{why}; still waiting for {name}{next}")
                    }
                }
            }
            Event::Acquired {
                slot,
                fence,
                waited,
            } => {
                let shared = if self.mode == Some(Mode::Shared) {
                    "shared "
                } else {
                    ""
                };
                format!(
                    "acquired {name} ({shared}slot {slot}, fence {fence}) after {}",
                    display(*waited)
                )
            }
            Event::Renewed { ttl } => format!("renewed the lease on {name} for {}", display(*ttl)),
            Event::Released { slot } => format!("released {name} (slot {slot})"),
            Event::Lost { reason } => format!("lost the lease on {name}: {reason}"),
            Event::Notice { message } | Event::Error { message } => (*message).to_owned(),
        }
    }

    fn json(&self, event: &Event) -> Value {
        let (kind, mut fields) = match event {
            Event::Waiting { holders, position } => (
                "waiting",
                json!({
                    "holders": holders.iter().map(holder_json).collect::<Vec<_>>(),
                    "position": position,
                }),
            ),
            Event::Retry {
                retry,
                position,
                delay,
            } => {
                let mut fields = json!({
                    "reason": retry.reason(),
                    "position": position,
                    "delay_ms": delay.map(|delay| delay.as_millis() as u64),
                });
                if let Retry::Unavailable(why) | Retry::TransientError(why) = retry {
                    fields["message"] = json!(why);
                }
                ("retry", fields)
            }
            Event::Acquired {
                slot,
                fence,
                waited,
            } => (
                "acquired",
                json!({ "slot": slot, "fence": fence, "waited_ms": waited.as_millis() as u64 }),
            ),
            Event::Renewed { ttl } => ("renewed", json!({ "ttl_ms": ttl.as_millis() as u64 })),
            Event::Released { slot } => ("released", json!({ "slot": slot })),
            Event::Lost { reason } => ("lost", json!({ "reason": reason })),
            Event::Notice { message } => ("notice", json!({ "message": message })),
            Event::Error { message } => ("error", json!({ "message": message })),
        };
        let object = fields.as_object_mut().expect("built as an object");
        object.insert("ts".into(), now_rfc3339().into());
        object.insert("event".into(), kind.into());
        object.insert("name".into(), self.name.clone().into());
        if let Some(mode) = self.mode {
            object.insert("mode".into(), mode.as_str().into());
        }
        object.insert("pid".into(), std::process::id().into());
        if let Some(note) = &self.note {
            object.insert("note".into(), note.clone().into());
        }
        fields
    }
}

/// Why waiting goes on (the `reason` of a `retry` event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Every slot is taken, or waiters are ahead of us.
    Contended,
    /// The backend cannot be reached or is not serving now; the message says why.
    Unavailable(String),
    /// The backend answered that it cannot do it now; the message says why.
    TransientError(String),
}

impl Retry {
    /// The retry that waits out `err`, when it is trouble that may pass.
    pub fn for_error(err: &Error) -> Option<Self> {
        match err {
            Error::Trouble {
                message,
                kind: Trouble::Unavailable,
            } => Some(Self::Unavailable(message.clone())),
            Error::Trouble {
                message,
                kind: Trouble::Transient,
            } => Some(Self::TransientError(message.clone())),
            _ => None,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::Contended => "contended",
            Self::Unavailable(_) => "unavailable",
            Self::TransientError(_) => "transient-error",
        }
    }
}

/// ": 3rd in line, held by pid 4242 on web-1 for 3m12s (./backup.sh)", as far as known.
pub fn in_line(position: u32, holders: &[Entry]) -> String {
    let held = held_by(holders);
    match (place(position, ""), held.is_empty()) {
        (place, true) if place.is_empty() => String::new(),
        (place, true) => format!(": {place}"),
        (place, false) if place.is_empty() => format!(": {held}"),
        (place, false) => format!(": {place}, {held}"),
    }
}

/// "3rd in line" after `lead`, or nothing when not in line.
fn place(position: u32, lead: &str) -> String {
    if position == 0 {
        return String::new();
    }
    let suffix = match (position % 10, position % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{lead}{position}{suffix} in line")
}

/// "held by pid 4242 on web-1 for 3m12s (./backup.sh)" for the first holder, when known.
pub fn held_by(holders: &[Entry]) -> String {
    held_by_at(holders, epoch_millis(SystemTime::now()))
}

fn held_by_at(holders: &[Entry], now_millis: u64) -> String {
    let Some(first) = holders.first() else {
        return String::new();
    };
    let mut text = format!("held by pid {}", first.pid);
    if !first.host.is_empty() {
        let _ = write!(text, " on {}", escape_controls(&first.host));
    }
    if let Some(since) = first.since {
        let held = Duration::from_millis(now_millis.saturating_sub(since));
        let _ = write!(text, " for {}", display(held));
    }
    // The command last: on a narrow terminal a long one is what gets cut.
    if !first.command.is_empty() {
        let _ = write!(text, " ({})", escape_controls(&first.command));
    }
    if holders.len() > 1 {
        let _ = write!(text, " and {} more", holders.len() - 1);
    }
    text
}

fn holder_json(holder: &Entry) -> Value {
    json!({
        "slot": holder.slot,
        "pid": holder.pid,
        "host": holder.host,
        "command": holder.command,
        "user": holder.user,
        "note": holder.note,
        "acquired_at": holder.since.map(rfc3339),
        "fence": holder.fence,
        "mode": holder.mode.as_str(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, acquired_at: u64) -> Entry {
        Entry {
            name: "backup".into(),
            slot: Some(0),
            position: 0,
            pid,
            host: "web-1".into(),
            command: "./backup.sh\n--all".into(),
            since: Some(acquired_at),
            expires_at: None,
            fence: Some(7),
            mode: Mode::Exclusive,
            user: String::new(),
            note: None,
        }
    }

    #[test]
    fn says_who_holds_the_lock_and_for_how_long() {
        let now = 1_000_000_000;
        assert_eq!(
            held_by_at(&[holder(4242, now - 192_400)], now),
            "held by pid 4242 on web-1 for 3m12s (./backup.sh\\n--all)"
        );
        assert_eq!(
            held_by_at(&[holder(1, now - 2300), holder(2, now)], now),
            "held by pid 1 on web-1 for 2.3s (./backup.sh\\n--all) and 1 more"
        );
        assert_eq!(held_by_at(&[], now), "");
    }

    #[test]
    fn places_in_line_are_ordinals() {
        let places: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 103, 111]
            .into_iter()
            .map(|n| place(n, ""))
            .collect();
        assert_eq!(
            places,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd",
                "111th"
            ]
            .map(|p| format!("{p} in line"))
        );
        assert_eq!(place(0, ", "), "");
        assert_eq!(in_line(3, &[]), ": 3rd in line");
        assert_eq!(in_line(0, &[]), "");
    }
}
