//! When a waiter polls the state object next (docs/backends/s3.md: "S3 backend": waiting
//! polls). The first pause after a change is [`FIRST`] times the waiter's place in line: the
//! head polls most often, a waiter further back, whom the line reaches only after those ahead
//! have gone, the less the further, so that what a line costs per acquisition barely grows with
//! its length. The first [`QUICK_PLACES`] keep their first pause for [`QUICK`] after a change:
//! a holder that took its slot at that change lets go at no point of that second more likely
//! than another, so the head's handoff is half its first pause on average, not half of one that
//! has doubled; and the one behind it, which becomes the head when the head takes the slot,
//! learns so within its own first pause, before that holder is likely to let go. After that,
//! and from the start for the rest of the line, the pause doubles while nothing changes, up to
//! [`MOST`], or stays at that first pause where it is longer (beyond place 20).

use std::time::Duration;

use crate::platform::clock::Moment;

/// The first pause after a change, per place in line.
pub const FIRST: Duration = Duration::from_millis(50);
/// The longest pause, where the first is not longer.
const MOST: Duration = Duration::from_secs(1);
/// How long after a change the first places keep polling at their first pause...
const QUICK: Duration = Duration::from_secs(1);
/// ...and how many places do.
const QUICK_PLACES: u32 = 2;

/// A waiter's poll schedule; its pause starts again at every change it sees.
#[derive(Default)]
pub struct Schedule {
    /// The pause before the next poll; zero until timed from our place.
    pause: Duration,
    /// When the next poll is due, once a wait has begun counting.
    due: Option<Moment>,
    /// Until when a waiter at one of the first places keeps its first pause.
    quick_until: Option<Moment>,
}

impl Schedule {
    /// When the next poll is due for a waiter at `position`: counted from the
    /// last poll, not from this call, so that a caller that ends each wait
    /// early (to check a process of this host ahead of it) never puts it off.
    pub fn due(&mut self, position: u32) -> Moment {
        if self.pause.is_zero() {
            self.pause = first(position);
            self.quick_until = (position <= QUICK_PLACES).then(|| Moment::now() + QUICK);
        }
        *self.due.get_or_insert_with(|| Moment::now() + self.pause)
    }

    /// A poll was made: `changed` says whether it found the object changed.
    pub fn polled(&mut self, changed: bool, position: u32) {
        self.due = None;
        if changed {
            self.pause = Duration::ZERO;
        } else if self.quick_until.is_none_or(Moment::has_passed) {
            self.pause = (self.pause * 2).min(first(position).max(MOST));
        }
    }
}

fn first(position: u32) -> Duration {
    FIRST * position.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses a waiter at `position` would take while nothing changes,
    /// without sleeping, the quick spell of the first places made to have passed or not.
    fn pauses(position: u32, quick_passed: bool, count: usize) -> Vec<u64> {
        let mut schedule = Schedule::default();
        (0..count)
            .map(|_| {
                schedule.due(position);
                if quick_passed {
                    schedule.quick_until = None;
                }
                let pause = schedule.pause.as_millis() as u64;
                schedule.polled(false, position);
                pause
            })
            .collect()
    }

    #[test]
    fn the_first_two_keep_their_first_pause_then_double_to_a_second() {
        assert_eq!(pauses(1, false, 4), [50, 50, 50, 50]);
        assert_eq!(pauses(1, true, 7), [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(pauses(2, false, 3), [100, 100, 100]);
        assert_eq!(pauses(2, true, 5), [100, 200, 400, 800, 1000]);
    }

    #[test]
    fn a_waiter_further_back_doubles_from_a_longer_first_pause() {
        assert_eq!(pauses(3, false, 4), [150, 300, 600, 1000]);
        assert_eq!(pauses(40, false, 2), [2000, 2000]);
    }

    #[test]
    fn a_change_starts_the_pause_again_from_the_new_place() {
        let mut schedule = Schedule::default();
        schedule.due(3);
        schedule.polled(false, 3);
        schedule.due(3);
        assert_eq!(schedule.pause, Duration::from_millis(300));
        schedule.polled(true, 3);
        schedule.due(1);
        assert_eq!(schedule.pause, FIRST);
    }
}
