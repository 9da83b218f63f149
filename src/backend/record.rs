//! The record every backend keeps of a holder or a waiter, and the entry that
//! `status` shows for one.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::Line;
use super::boot_date::BootDate;
use crate::identity::{Process, epoch_millis};
use crate::platform::clock::Moment;

/// Who takes or waits for a slot, as the store keeps it: enough to show in
/// `status` and, on the same host, to tell whether its process still lives.
/// Nothing of the command's arguments unless asked (docs/operating.md: "Who holds a lock"): a store may be read from every host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub struct Owner {
    /// Unique to one acquisition (`LOCKRUN_TOKEN`): what a change checks before touching an entry.
    pub token: String,
    #[serde(flatten)]
    pub process: Process,
    /// The program's name, or with `--record-command` the command line,
    /// quoted as a shell would need it. Older lockruns recorded the command line.
    pub command: String,
    /// The user lockrun runs as; empty in records of older lockruns.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// `--note`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Its `-p`: a name's slot count is part of the lock (docs/guide.md: "Slots").
    /// `None` in records of older lockruns, which are never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u32>,
    /// Whether it holds (or waits to hold) the name alone or with other sharers.
    /// Records of older lockruns have no mode: they held alone.
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
}

/// An [`Owner`] as a store gives it back, before [`Owner::unpacked`].
#[derive(Deserialize)]
struct Stored {
    token: String,
    #[serde(flatten)]
    process: Process,
    command: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    parallelism: Option<u32>,
    #[serde(default)]
    mode: Mode,
}

impl From<Stored> for Owner {
    fn from(stored: Stored) -> Self {
        Self {
            token: stored.token,
            process: stored.process,
            command: stored.command,
            user: stored.user,
            note: stored.note,
            parallelism: stored.parallelism,
            mode: stored.mode,
        }
        .unpacked()
    }
}

/// What the SQL stores keep in their one `command` column: the program's
/// name (or command line), the user and the note together. A column of their
/// own would change the schema, which older lockruns sharing the database
/// would refuse; they show this text as the command instead.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Described {
    command: String,
    user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl Owner {
    /// The text of a SQL store's `command` column for this owner.
    pub fn packed(&self) -> String {
        serde_json::to_string(&Described {
            command: self.command.clone(),
            user: self.user.clone(),
            note: self.note.clone(),
        })
        .expect("strings serialize")
    }

    /// This owner with a `command` column read from a SQL store taken apart
    /// ([`Owner::packed`]); a plain command (an older lockrun's) stays as it is.
    #[must_use]
    pub fn unpacked(self) -> Self {
        if !self.user.is_empty() || self.note.is_some() || !self.command.starts_with('{') {
            return self;
        }
        match serde_json::from_str::<Described>(&self.command) {
            Ok(described) => Self {
                command: described.command,
                user: described.user,
                note: described.note,
                ..self
            },
            Err(_) => self,
        }
    }
}

/// How a run holds a name (docs/guide.md: "Shared locks"): shared holders hold it
/// together, an exclusive holder (the default) alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
}

impl Mode {
    /// `exclusive` or `shared`: as `status`, the events and the stores spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
        }
    }

    /// The mode a store spelled with [`Mode::as_str`]; anything else (an older record) is exclusive.
    pub fn parse(text: &str) -> Self {
        if text == "shared" {
            Self::Shared
        } else {
            Self::Exclusive
        }
    }

    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
    pub fn is_exclusive(&self) -> bool {
        *self == Self::Exclusive
    }
}

/// What a store keeps of a holder, where it keeps a document (a slot file, a key's value).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HolderRecord {
    /// The lock's name as given (the store's own key or file name may be escaped).
    pub name: String,
    #[serde(flatten)]
    pub owner: Owner,
    /// Milliseconds since the Unix epoch, by the holder's clock (shown, never compared).
    pub acquired_at: u64,
    /// The acquisition's fence; 0 until the store assigns it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fence: u64,
    /// Set when its holder released it with `--min-hold`: the slot stays taken
    /// until then (milliseconds since the Unix epoch), though its holder is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<u64>,
    /// The same end on the boot clock, which decides where the store has no
    /// clock of its own (the file backend); `None` in records of older lockruns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_on: Option<BootDate>,
}

/// What a store keeps of a waiter, where it keeps a document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaiterRecord {
    pub name: String,
    #[serde(flatten)]
    pub owner: Owner,
    /// When it began waiting, in milliseconds since the Unix epoch.
    pub since: u64,
}

impl HolderRecord {
    /// When a `--min-hold` lets the slot go, if it still keeps it: by the boot
    /// clock, or for a record of an older lockrun by the wall clock.
    pub fn kept_end(&self) -> Option<Moment> {
        match (&self.kept_on, self.kept_until) {
            (Some(date), _) => date.end(),
            (None, Some(until)) => {
                let now = epoch_millis(SystemTime::now());
                (until > now).then(|| Moment::now() + Duration::from_millis(until - now))
            }
            (None, None) => None,
        }
    }

    pub fn entry(&self, slot: u32) -> Entry {
        let entry = Entry::holder(&self.name, slot, &self.owner, Some(self.acquired_at))
            .expiring(self.kept_until);
        match self.fence {
            0 => entry,
            fence => entry.fenced(fence),
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One holder or waiter of a name, as `status` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// The slot held; `None` for a waiter.
    pub slot: Option<u32>,
    /// 0 for a holder, 1.. for a waiter's place in line.
    pub position: u32,
    pub pid: u32,
    pub host: String,
    pub command: String,
    /// When the slot was acquired, or the wait began (milliseconds since the Unix epoch); `None` when unknown.
    pub since: Option<u64>,
    /// When the lease runs out (milliseconds since the Unix epoch); `None` without a lease.
    pub expires_at: Option<u64>,
    /// The fence of a holder's acquisition; `None` for a waiter or when unknown.
    pub fence: Option<u64>,
    pub mode: Mode,
    /// The user it runs as; empty when unknown (an older lockrun's record).
    pub user: String,
    /// Its `--note`.
    pub note: Option<String>,
}

impl Entry {
    pub fn holder(name: &str, slot: u32, owner: &Owner, since: Option<u64>) -> Self {
        Self {
            name: name.to_owned(),
            slot: Some(slot),
            position: 0,
            pid: owner.process.pid,
            host: owner.process.host.clone(),
            command: owner.command.clone(),
            since,
            expires_at: None,
            fence: None,
            mode: owner.mode,
            user: owner.user.clone(),
            note: owner.note.clone(),
        }
    }

    pub fn waiter(name: &str, position: u32, owner: &Owner, since: Option<u64>) -> Self {
        Self {
            slot: None,
            position,
            ..Self::holder(name, 0, owner, since)
        }
    }

    #[must_use]
    pub fn expiring(self, expires_at: Option<u64>) -> Self {
        Self { expires_at, ..self }
    }

    #[must_use]
    pub fn fenced(self, fence: u64) -> Self {
        Self {
            fence: Some(fence),
            ..self
        }
    }

    pub fn is_holder(&self) -> bool {
        self.slot.is_some()
    }
}

/// Holders first by name and slot, then waiters by name and place in line.
pub fn sort(entries: &mut [Entry]) {
    entries.sort_by(|a, b| {
        (&a.name, a.slot.is_none(), a.slot, a.position).cmp(&(
            &b.name,
            b.slot.is_none(),
            b.slot,
            b.position,
        ))
    });
}

/// The waiters of one or more names as `status` lists them, from `(name,
/// owner, since, expires_at)` in line order: those whose processes are known
/// to be gone are left out, and the others numbered from 1 in each name's line.
pub fn waiting<'a>(
    waiters: impl IntoIterator<Item = (&'a str, &'a Owner, u64, Option<u64>)>,
) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    for (name, owner, since, expires_at) in waiters {
        if owner.process.is_gone() {
            continue;
        }
        let position = match entries.last() {
            Some(last) if last.name == name => last.position + 1,
            _ => 1,
        };
        entries.push(Entry::waiter(name, position, owner, Some(since)).expiring(expires_at));
    }
    entries
}

/// Counts the places of a line, waiter by waiter in line order: consecutive
/// sharers stand in one place, as they go together (docs/guide.md: "Shared locks");
/// an exclusive waiter stands alone.
#[derive(Default)]
pub struct Places {
    place: u32,
    last: Option<Mode>,
}

impl Places {
    /// The place, from 1, of the next waiter, who waits in `mode`.
    pub fn next(&mut self, mode: Mode) -> u32 {
        if mode == Mode::Exclusive || self.last != Some(Mode::Shared) {
            self.place += 1;
        }
        self.last = Some(mode);
        self.place
    }
}

/// A holder or waiter ahead of us, as one look at the line saw it.
pub struct Ahead<'a> {
    pub owner: &'a Owner,
    /// Kept taken by `--min-hold` after its holder left: no process to watch.
    pub kept: bool,
    /// When it goes by itself: its lease ends, or its place in line lapses.
    pub ends: Moment,
}

/// Where we stand after a look at the line that found us at `position` (0:
/// not in line) behind `holders`. What we watch follows our `place`, where
/// consecutive sharers stand in one place, as they go together (docs/guide.md:
/// "Shared locks"), and an exclusive waiter alone; `just_ahead` are the
/// waiters of the place just ahead of ours, `nearest_local` the waiter
/// nearest ahead of us on our host, if any. At place 1 (or out of line) the
/// line moves by itself when the first lease ends; at 2, when a place of
/// `just_ahead` lapses; further back we are told (see [`local_ahead`]).
pub fn line(
    me: &Process,
    position: u32,
    place: u32,
    holders: &[Ahead],
    just_ahead: &[Ahead],
    nearest_local: Option<&Owner>,
) -> Line {
    let moves_by = match place {
        0 | 1 => holders.iter().map(|holder| holder.ends).min(),
        2 => just_ahead.iter().map(|waiter| waiter.ends).min(),
        _ => None,
    };
    Line {
        position,
        local_ahead: local_ahead(
            me,
            place,
            holders
                .iter()
                .filter(|holder| !holder.kept)
                .map(|holder| holder.owner),
            just_ahead.iter().map(|waiter| waiter.owner),
            nearest_local,
        ),
        moves_by,
        watched: false,
        other_parallelism: None,
    }
}

/// The entries ahead of us whose owners run on this host, so that the waiting
/// loop can drop one at once when its process dies: the holders when we are
/// next in line (or not in line), and the head of the line (its one waiter,
/// or the sharers that stand there together) when we are second. With none
/// of those on this host, the waiter of this host nearest ahead of us (or,
/// with none, this host's holders): as each waiter watches the nearest one
/// of its host ahead, every dead entry of a host with a live waiter behind it
/// is seen by one, however many died together, and one poll of one process
/// per waiter does it (docs/guide.md: "The waiting line").
pub fn local_ahead<'a>(
    me: &Process,
    position: u32,
    holders: impl Iterator<Item = &'a Owner> + Clone,
    nearest_waiters: impl IntoIterator<Item = &'a Owner>,
    nearest_local: Option<&Owner>,
) -> Vec<Owner> {
    let local = |owner: &&Owner| owner.process.shares_host_with(me);
    let mut ahead: Vec<Owner> = if position <= 1 {
        holders.clone().filter(local).cloned().collect()
    } else {
        Vec::new()
    };
    if position == 2 {
        ahead.extend(nearest_waiters.into_iter().filter(local).cloned());
    }
    if ahead.is_empty() && position > 1 {
        ahead = match nearest_local.filter(local) {
            Some(owner) => vec![owner.clone()],
            None => holders.filter(local).cloned().collect(),
        };
    }
    ahead
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(json: &str) -> Owner {
        serde_json::from_str(json).expect("an owner")
    }

    #[test]
    fn records_of_older_lockruns_still_read() {
        // Before the user and the note: a command line, or a program's name.
        let old = owner(r#"{"token":"t","pid":1,"host":"h","command":"backup.sh --all"}"#);
        assert_eq!(old.command, "backup.sh --all");
        assert_eq!((old.user.as_str(), old.note.as_deref()), ("", None));
        // An older lockrun's SQL column: plain text, even text like JSON.
        for column in ["backup.sh", "{not json", r#"{"command":"x"}"#] {
            let read = Owner {
                command: column.to_owned(),
                ..old.clone()
            }
            .unpacked();
            assert_eq!(read.command, column);
        }
    }

    #[test]
    fn the_user_and_note_go_through_a_document_and_a_sql_column() {
        let ours = Owner {
            user: "backup".into(),
            note: Some("nightly".into()),
            ..owner(r#"{"token":"t","pid":1,"host":"h","command":"sh"}"#)
        };
        let document = serde_json::to_string(&ours).unwrap();
        assert_eq!(owner(&document), ours);
        let column = Owner {
            command: ours.packed(),
            user: String::new(),
            note: None,
            ..ours.clone()
        };
        assert_eq!(column.clone().unpacked(), ours);
        // As PostgreSQL's look hands the column back, inside a document.
        let document = serde_json::to_string(&column).unwrap();
        assert_eq!(owner(&document), ours);
    }

    fn owner_on(token: &str, host: &str) -> Owner {
        Owner {
            token: token.to_owned(),
            process: Process {
                pid: 1,
                start_time: 1,
                boot_id: "boot".to_owned(),
                host: host.to_owned(),
            },
            command: "true".to_owned(),
            user: String::new(),
            note: None,
            parallelism: Some(1),
            mode: Mode::Exclusive,
        }
    }

    fn tokens(owners: &[Owner]) -> Vec<&str> {
        owners.iter().map(|owner| owner.token.as_str()).collect()
    }

    #[test]
    fn a_waiter_further_back_watches_the_nearest_entry_of_its_host() {
        let me = owner_on("me", "here").process;
        let (holder, head) = (owner_on("holder", "here"), owner_on("head", "elsewhere"));
        let near = owner_on("near", "here");
        let holders = || [&holder].into_iter();
        // First: the holders; second: the head, if it runs here.
        assert_eq!(
            tokens(&local_ahead(&me, 1, holders(), [], None)),
            ["holder"]
        );
        let second = local_ahead(&me, 2, holders(), [&near], None);
        assert_eq!(tokens(&second), ["near"]);
        // Further back, or second behind a head elsewhere: the nearest waiter
        // here, else the holders here.
        let back = local_ahead(&me, 4, holders(), [&head], Some(&near));
        assert_eq!(tokens(&back), ["near"]);
        let behind_elsewhere = local_ahead(&me, 2, holders(), [&head], None);
        assert_eq!(tokens(&behind_elsewhere), ["holder"]);
        let elsewhere = owner_on("far", "elsewhere");
        assert!(local_ahead(&me, 3, [&elsewhere].into_iter(), [], Some(&head)).is_empty());
    }
}
