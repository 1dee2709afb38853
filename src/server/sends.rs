//! A connection's responses that wait for hyper to take their next frame, counted by generation
//! of the connection's send clock: what the send deadline (`stall.rs`) reads, and what each
//! response's body updates as it is polled.

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many generations of waiting responses are counted: a response that began to wait in one
/// tick of the send clock is found still waiting when the clock comes back to its generation,
/// two full ticks later at least.
const GENERATIONS: usize = 3;

/// A connection's responses that wait for hyper to take their next frame (handed over, or just
/// having yielded one), counted by the tick of the connection's send clock in which each began to
/// wait. A response costs no timer and no clock reading: two counter updates per frame.
#[derive(Debug, Default)]
pub struct Sends {
    /// The current tick's generation, `0..GENERATIONS`.
    generation: AtomicUsize,
    waiting: [AtomicUsize; GENERATIONS],
}

impl Sends {
    /// A response begins to wait; returns the generation it waits in.
    pub(crate) fn wait(&self) -> usize {
        let generation = self.generation.load(Ordering::Relaxed);
        self.waiting[generation].fetch_add(1, Ordering::Relaxed);
        generation
    }

    /// A response that waited since `generation` was polled (or dropped).
    pub(crate) fn taken(&self, generation: usize) {
        self.waiting[generation].fetch_sub(1, Ordering::Relaxed);
    }

    /// The clock ticks; true when a response that began to wait two ticks ago or more still waits.
    pub(crate) fn tick(&self) -> bool {
        let next = (self.generation.load(Ordering::Relaxed) + 1) % GENERATIONS;
        self.generation.store(next, Ordering::Relaxed);
        self.waiting[next].load(Ordering::Relaxed) > 0
    }
}

/// One response's place in its connection's [`Sends`].
#[derive(Debug, Default)]
pub struct Turn {
    /// The generation it began to wait in, while it waits.
    waiting: Option<usize>,
}

impl Turn {
    /// The response is handed to hyper, or was polled: it waits for its next poll when `waits`
    /// (it yielded a frame, or none yet), and not otherwise (it waits for its own source, or
    /// has ended). A response polled again while it waits starts its wait anew.
    pub fn polled(&mut self, sends: &Sends, waits: bool) {
        match (self.waiting, waits) {
            (None, false) => {}
            (Some(since), false) => {
                sends.taken(since);
                self.waiting = None;
            }
            (Some(since), true) if since == sends.generation.load(Ordering::Relaxed) => {}
            (since, true) => {
                if let Some(since) = since {
                    sends.taken(since);
                }
                self.waiting = Some(sends.wait());
            }
        }
    }

    /// The response is gone.
    pub fn end(&mut self, sends: &Sends) {
        self.polled(sends, false);
    }
}
