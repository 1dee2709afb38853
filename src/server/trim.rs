//! Giving memory back after a burst of connections.
//!
//! glibc keeps freed heap memory in its arenas, so after a thousand streams close, corral's resident
//! size would stay at its peak. When many connections have closed since the last look, corral asks
//! the allocator to return free pages to the system.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Open connections, and the most seen since the last trim.
#[derive(Default)]
pub struct Connections {
    open: AtomicUsize,
    peak: AtomicUsize,
}

/// Counts one open connection until dropped.
pub struct Open(Arc<Connections>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connections {
    pub fn opened(self: &Arc<Self>) -> Open {
        let now = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Open(self.clone())
    }
}

/// How many connections must have closed since the peak before a trim is worth it.
const CLOSED_BEFORE_TRIM: usize = 64;

pub async fn run(connections: Arc<Connections>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if connections.take_trim() {
            trim();
        }
    }
}

impl Connections {
    /// True (once) when enough connections have closed since the peak; the peak then restarts.
    fn take_trim(&self) -> bool {
        let open = self.open.load(Ordering::Relaxed);
        let peak = self.peak.load(Ordering::Relaxed);
        if peak.saturating_sub(open) >= CLOSED_BEFORE_TRIM {
            self.peak.store(open, Ordering::Relaxed);
            return true;
        }
        false
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_after_many_connections_close() {
        let c = Arc::new(Connections::default());
        let mut open: Vec<Open> = (0..100).map(|_| c.opened()).collect();
        assert!(!c.take_trim(), "nothing closed yet");
        open.truncate(50);
        assert!(!c.take_trim(), "50 closed: not worth it");
        open.truncate(10);
        assert!(c.take_trim(), "90 closed since the peak");
        assert!(!c.take_trim(), "only once per burst");
    }
}
