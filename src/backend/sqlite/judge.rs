//! Whether a lease, or a waiter's place, still runs, whatever any wall clock
//! does (docs/backends/sqlite.md: "SQLite backend"). Each row dates its end on the boot clock of
//! the kernel that wrote it (`CLOCK_BOOTTIME`, which only counts forward): a
//! row dated on this kernel's clock is judged by it. A row dated by another
//! boot (another host, or before a reboot) runs until this lockrun has seen it
//! unchanged for its whole span on its own boot clock: each renewal changes its
//! beat (the observed-heartbeat rule). So a lockrun that meets such a row for
//! the first time waits up to one span before it takes that slot.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use crate::duration::millis;
use crate::identity::epoch_millis;
use crate::platform::clock::Moment;
use crate::platform::proc::kernel_boot_id;

/// How a row dates its end, as read.
pub(super) struct Dated {
    /// The row, across looks: its table and key.
    pub(super) key: String,
    /// The boot whose clock `ends` is on; `None` in rows of older lockruns.
    pub(super) clock: Option<String>,
    /// Milliseconds after that boot at which it ends.
    pub(super) ends: Option<u64>,
    /// Milliseconds from its last writing to its end.
    pub(super) span: u64,
    /// Changed by every writing.
    pub(super) beat: Beat,
}

/// A row's beat, and its wall-clock end, which an older lockrun's renewal changes alone.
pub(super) type Beat = (i64, u64);

/// This lockrun's judge of ends: its boot, and the rows dated elsewhere it has seen.
pub(super) struct Judge {
    boot: String,
    /// Per row dated elsewhere: the beat it had and when it was first seen with it.
    seen: RefCell<HashMap<String, (Beat, Moment)>>,
}

impl Judge {
    pub(super) fn new() -> Self {
        Self {
            boot: kernel_boot_id(),
            seen: RefCell::default(),
        }
    }

    /// The moment of a look, to be taken once its transaction has begun.
    pub(super) fn now(&self) -> Now<'_> {
        Now {
            judge: self,
            at: Moment::now(),
            wall: epoch_millis(std::time::SystemTime::now()),
        }
    }
}

/// One look's moment, by which rows are judged and dated.
pub(super) struct Now<'a> {
    judge: &'a Judge,
    pub(super) at: Moment,
    /// The wall clock, only for the times `status` shows (`expires_at`, `since`).
    pub(super) wall: u64,
}

impl Now<'_> {
    /// This kernel's boot, whose clock dates what this lockrun writes.
    pub(super) fn clock(&self) -> &str {
        &self.judge.boot
    }

    /// Milliseconds after this boot at which something `span` ms from now ends.
    pub(super) fn ends(&self, span: u64) -> u64 {
        millis(self.at.since_boot()) + span
    }

    /// When the row dated by `dated` ends, `None` when it has. Called once its
    /// row was read: a first sight is timed after it was written.
    pub(super) fn end(&self, dated: &Dated) -> Option<Moment> {
        let end = if let Some(ends) = self.on_our_clock(dated) {
            Moment::after_boot(Duration::from_millis(ends))
        } else {
            let mut seen = self.judge.seen.borrow_mut();
            let first = match seen.get(&dated.key) {
                Some(&(beat, first)) if beat == dated.beat => first,
                _ => {
                    let first = Moment::now();
                    seen.insert(dated.key.clone(), (dated.beat, first));
                    first
                }
            };
            first + Duration::from_millis(dated.span)
        };
        (end > self.at).then_some(end)
    }

    /// When the row was last dated (taken, granted, renewed), if on our clock.
    pub(super) fn dated_at(&self, dated: &Dated) -> Option<Moment> {
        let ends = self.on_our_clock(dated)?;
        Some(Moment::after_boot(Duration::from_millis(
            ends.saturating_sub(dated.span),
        )))
    }

    /// The row's end in milliseconds after this boot, if it was dated on our clock.
    fn on_our_clock(&self, dated: &Dated) -> Option<u64> {
        let ours = !self.clock().is_empty() && dated.clock.as_deref() == Some(self.clock());
        dated.ends.filter(|_| ours)
    }
}
