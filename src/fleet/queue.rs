//! A pool's queue of waiting requests, in arrival order, and the rule that serves it first come,
//! first served: a request may take a free slot only while every request ahead of it could take
//! one too, so a later arrival that happens to wake first never takes an earlier one's slot.

use std::collections::VecDeque;

/// The tickets of a pool's waiting requests, oldest first.
#[derive(Debug, Default)]
pub(super) struct Queue {
    tickets: VecDeque<u64>,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.tickets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tickets.is_empty()
    }

    /// Puts `ticket` at the back, unless `depth` requests (at least one) wait already: a burst
    /// beyond what the pool can absorb is refused rather than left waiting. True when it joined.
    pub fn join(&mut self, ticket: u64, depth: usize) -> bool {
        if self.tickets.len() >= depth.max(1) {
            return false;
        }
        self.tickets.push_back(ticket);
        true
    }

    /// Whether `ticket` may take one of `free` slots now: only while its place is within them.
    /// `None` when it is not queued (it left, or was served).
    pub fn may_take(&self, ticket: u64, free: usize) -> Option<bool> {
        let place = self.tickets.iter().position(|t| *t == ticket)?;
        Some(place < free)
    }

    /// Takes `ticket` out: served, or its request gone.
    pub fn leave(&mut self, ticket: u64) {
        self.tickets.retain(|t| *t != ticket);
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
