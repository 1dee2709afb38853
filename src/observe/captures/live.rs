//! The budget of captures being built: the bytes every capture in flight holds (its copies of
//! the heads and bodies so far, and a request body it shares), together at most the capture
//! budget. A capture takes room as it grows, a grant at a time so that a stream does not touch the
//! shared count for every frame, and gives all of it back when it is kept or dropped. Taking room
//! never waits: what is left is all there is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The most room a capture takes beyond what it needs at once: a small capture (about 1 KiB)
/// then touches the shared count once or twice in all.
const GRANT_MAX: usize = 4096;

/// The budget shared by the captures being built.
pub struct Live {
    total: usize,
    used: AtomicUsize,
    /// Room taken at once: a thousandth of the total, up to [`GRANT_MAX`], so that the grants of
    /// a thousand captures in flight hold at most the whole budget.
    grant: usize,
}

impl Live {
    pub fn new(total: usize) -> Live {
        Live {
            total,
            used: AtomicUsize::new(0),
            grant: (total / 1024).min(GRANT_MAX),
        }
    }

    /// Up to `want` bytes of room: as much of it as is left.
    fn take(&self, want: usize) -> usize {
        let mut got = 0;
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                got = want.min(self.total.saturating_sub(used));
                (got > 0).then_some(used + got)
            });
        got
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// The bytes held by captures being built.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// The room one capture holds, given back when it is dropped.
pub struct Room {
    live: Arc<Live>,
    held: usize,
}

impl Room {
    pub fn new(live: Arc<Live>) -> Room {
        Room { live, held: 0 }
    }

    /// How many of `more` bytes may be added to the `used` bytes the capture holds, taking the
    /// room they need (and a grant more) when it holds too little.
    pub fn allow(&mut self, used: usize, more: usize) -> usize {
        let wanted = used.saturating_add(more);
        if wanted > self.held {
            let short = wanted - self.held;
            self.held += self.live.take(short.max(self.live.grant));
        }
        more.min(self.held.saturating_sub(used))
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        self.live.give(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_shared_and_given_back() {
        let live = Arc::new(Live::new(100));
        let (mut a, mut b) = (Room::new(live.clone()), Room::new(live.clone()));
        assert_eq!(a.allow(0, 60), 60);
        assert_eq!(b.allow(0, 60), 40, "what is left");
        assert_eq!(b.allow(40, 10), 0, "nothing left");
        assert_eq!(live.used(), 100);
        drop(a);
        assert_eq!(live.used(), 40);
        assert_eq!(b.allow(40, 10), 10, "room came back");
        drop(b);
        assert_eq!(live.used(), 0);
    }

    /// A capture takes a grant more than it needs, so a stream of small frames takes room once
    /// in a while, never more than the total.
    #[test]
    fn room_is_taken_a_grant_at_a_time() {
        let live = Arc::new(Live::new(1 << 20));
        assert_eq!(live.grant, 1024);
        let mut room = Room::new(live.clone());
        assert_eq!(room.allow(0, 10), 10);
        assert_eq!(live.used(), 1024);
        assert_eq!(room.allow(10, 1000), 1000);
        assert_eq!(live.used(), 1024, "within the grant");
        assert_eq!(room.allow(1010, 100), 100);
        assert_eq!(live.used(), 1024 + 1024);
    }
}
