//! Diagnostics on stderr (SPEC §6): text lines for people, or one JSON object
//! per event for log pipelines. stdout belongs to the command.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::backend::Holder;
use crate::duration::display;
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
    Waiting {
        holders: &'a [Holder],
    },
    Retry {
        delay: Duration,
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

pub struct Reporter {
    level: Level,
    format: Format,
    name: String,
}

impl Reporter {
    pub fn new(level: Level, format: Format, name: impl Into<String>) -> Self {
        Self {
            level,
            format,
            name: name.into(),
        }
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
            Event::Waiting { holders } => format!("waiting for {name}{}", held_by(holders)),
            Event::Retry { delay } => format!("{name} still busy; next try in {}", display(*delay)),
            Event::Acquired {
                slot,
                fence,
                waited,
            } => {
                format!(
                    "acquired {name} (slot {slot}, fence {fence}) after {}",
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
            Event::Waiting { holders } => (
                "waiting",
                json!({ "holders": holders.iter().map(holder_json).collect::<Vec<_>>() }),
            ),
            Event::Retry { delay } => ("retry", json!({ "delay_ms": delay.as_millis() as u64 })),
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
        object.insert("pid".into(), std::process::id().into());
        fields
    }
}

/// ": held by pid 4242 on web-1 for 3m12s (./backup.sh)" for the first holder, when known.
pub fn held_by(holders: &[Holder]) -> String {
    held_by_at(holders, epoch_millis(SystemTime::now()))
}

fn held_by_at(holders: &[Holder], now_millis: u64) -> String {
    let Some(first) = holders.first() else {
        return String::new();
    };
    let mut text = format!(": held by pid {}", first.pid);
    if !first.host.is_empty() {
        let _ = write!(text, " on {}", first.host);
    }
    if first.acquired_at > 0 {
        let held = Duration::from_millis(now_millis.saturating_sub(first.acquired_at));
        let _ = write!(text, " for {}", display(held));
    }
    // The command last: on a narrow terminal a long one is what gets cut.
    if !first.command.is_empty() {
        let _ = write!(text, " ({})", printable(&first.command));
    }
    if holders.len() > 1 {
        let _ = write!(text, " and {} more", holders.len() - 1);
    }
    text
}

/// A control character (a newline in a `-c` script) would split a diagnostic line.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn holder_json(holder: &Holder) -> Value {
    json!({
        "slot": holder.slot,
        "pid": holder.pid,
        "host": holder.host,
        "command": holder.command,
        "acquired_at": (holder.acquired_at > 0).then(|| rfc3339(holder.acquired_at)),
        "fence": holder.fence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, acquired_at: u64) -> Holder {
        Holder {
            name: "backup".into(),
            slot: 0,
            pid,
            host: "web-1".into(),
            command: "./backup.sh\n--all".into(),
            acquired_at,
            expires_at: None,
            fence: 7,
        }
    }

    #[test]
    fn says_who_holds_the_lock_and_for_how_long() {
        let now = 1_000_000_000;
        assert_eq!(
            held_by_at(&[holder(4242, now - 192_400)], now),
            ": held by pid 4242 on web-1 for 3m12s (./backup.sh --all)"
        );
        assert_eq!(
            held_by_at(&[holder(1, now - 2300), holder(2, now)], now),
            ": held by pid 1 on web-1 for 2.3s (./backup.sh --all) and 1 more"
        );
        assert_eq!(held_by_at(&[], now), "");
    }
}
