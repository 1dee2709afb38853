//! Work an engine reports that did not come through corral.
//!
//! A `/slots` reading lags corral's own count: llama-server marks a slot idle a moment after the
//! response has been sent, so a reading taken while one of corral's requests was in flight, or just
//! after one ended, shows that request as busy. Counted as outside work, it would make an idle
//! replica look full until the next reading. So corral remembers when its own requests ended
//! recently and discounts them from every reading.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long after one of corral's requests ends an engine may still report its slot as busy.
pub const SETTLE: Duration = Duration::from_secs(2);

/// More ends than this inside [`SETTLE`] are not told apart (each end is one slot at most).
const MAX_REMEMBERED: usize = 256;

/// When corral's own requests to one instance ended, for the last [`SETTLE`].
#[derive(Debug, Default)]
pub struct RecentEnds(VecDeque<Instant>);

impl RecentEnds {
    pub fn record(&mut self, at: Instant) {
        while self
            .0
            .front()
            .is_some_and(|t| at.saturating_duration_since(*t) > SETTLE)
            || self.0.len() >= MAX_REMEMBERED
        {
            self.0.pop_front();
        }
        self.0.push_back(at);
    }

    /// Requests that ended after a reading was asked for at `asked`, or within [`SETTLE`] before.
    pub fn around(&self, asked: Instant) -> usize {
        self.0
            .iter()
            .filter(|t| asked.saturating_duration_since(**t) <= SETTLE)
            .count()
    }
}

/// Slots a reading shows busy beyond corral's own work. `in_flight` is corral's count when the
/// reading arrived; `ended` counts corral's requests that ended during the reading or within
/// [`SETTLE`] before it was asked for: any of them may still show as busy.
pub fn outside_work(processing: usize, in_flight: usize, ended: usize) -> usize {
    processing.saturating_sub(in_flight + ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_just_ended_is_not_outside_work() {
        let asked = Instant::now();
        let mut ends = RecentEnds::default();
        ends.record(asked - Duration::from_millis(300));
        let ended = ends.around(asked);
        assert_eq!(outside_work(1, 0, ended), 0);
        // another client's request on the second slot still counts
        assert_eq!(outside_work(2, 0, ended), 1);
    }

    #[test]
    fn old_ends_are_forgotten() {
        let now = Instant::now();
        let mut ends = RecentEnds::default();
        ends.record(now);
        ends.record(now + SETTLE + Duration::from_millis(1));
        assert_eq!(ends.0.len(), 1);
        assert_eq!(ends.around(now + SETTLE), 1);
        assert_eq!(outside_work(1, 0, ends.around(now + SETTLE * 3)), 1);
    }

    #[test]
    fn memory_is_bounded() {
        let now = Instant::now();
        let mut ends = RecentEnds::default();
        for _ in 0..10 * MAX_REMEMBERED {
            ends.record(now);
        }
        assert_eq!(ends.0.len(), MAX_REMEMBERED);
    }
}
