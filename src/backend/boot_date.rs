//! An end dated on the boot clock of the kernel that wrote it (docs/guide.md:
//! "Clocks"): no step of a wall clock moves it, as `CLOCK_BOOTTIME` only counts
//! forward, suspended time included.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::millis;
use crate::platform::clock::Moment;
use crate::platform::proc::kernel_boot_id;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootDate {
    /// The boot id of the kernel whose clock `ends` is on; empty when unknown.
    pub boot: String,
    /// Milliseconds after that boot at which it ends.
    pub ends: u64,
    /// Milliseconds from its writing to its end.
    pub span: u64,
}

impl BootDate {
    /// `until`, on this kernel's clock.
    pub fn until(until: Moment) -> Self {
        Self {
            boot: kernel_boot_id(),
            ends: millis(until.since_boot()),
            span: millis(until.remaining()),
        }
    }

    /// When it ends on this kernel's clock, `None` when it has. Dated by another
    /// boot (before a reboot: the file backend's directory is one host's), it
    /// was written before this boot began, so it ends no later than its span
    /// after the boot.
    pub fn end(&self) -> Option<Moment> {
        let end = if !self.boot.is_empty() && self.boot == kernel_boot_id() {
            Moment::after_boot(Duration::from_millis(self.ends))
        } else {
            Moment::after_boot(Duration::from_millis(self.span))
        };
        (!end.has_passed()).then_some(end)
    }
}
