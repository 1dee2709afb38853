//! The connection cap (`maxConnections`).
//!
//! Past the file-descriptor limit, `accept` fails with EMFILE and nobody is served, not even
//! `/health`. corral keeps its client connections under a cap below that limit instead. At the cap
//! a new connection makes room by closing the connection that has been idle longest (no request
//! in flight: a kept-alive one, or one that never sent a request), so a flood of silent sockets
//! cannot lock real clients out; only when every connection has a request in flight is the new
//! one refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::server::idle::Activity;

/// The open client connections, each with its activity.
pub struct Admission {
    max: usize,
    open: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    connections: HashMap<u64, Arc<Activity>>,
}

/// One admitted connection; leaves the table when dropped.
pub struct Admitted {
    id: u64,
    pub activity: Arc<Activity>,
    admission: Arc<Admission>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.table().connections.remove(&self.id);
    }
}

impl Admission {
    pub fn new(max: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max: max.max(1),
            open: Mutex::default(),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new connection, closing the longest-idle one at the cap; `None`: refuse it (every
    /// connection has a request in flight).
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut table = self.table();
        // below the cap no connection is looked at: a scan on every accept would make a flood
        // of connections cost the square of its size
        if table.connections.len() >= self.max {
            table.make_room(self.max)?;
        }
        let id = table.next_id;
        table.next_id += 1;
        let activity = Arc::new(Activity::default());
        table.connections.insert(id, activity.clone());
        Some(Admitted {
            id,
            activity,
            admission: self.clone(),
        })
    }
}

impl Table {
    /// At the cap: evicts the connection idle longest, unless enough idle ones are already on
    /// their way out; `None` when there is no room to make (every connection is busy).
    fn make_room(&self, max: usize) -> Option<()> {
        // an evicted connection is on its way out unless a request reached it first
        let mut evicting = 0;
        let mut longest_idle: Option<(tokio::time::Instant, &Arc<Activity>)> = None;
        for activity in self.connections.values() {
            let Some(since) = activity.idle_since() else {
                continue;
            };
            if activity.is_evicted() {
                evicting += 1;
            } else if longest_idle.is_none_or(|(oldest, _)| since < oldest) {
                longest_idle = Some((since, activity));
            }
        }
        if self.connections.len() - evicting >= max {
            longest_idle?.1.evict();
        }
        Some(())
    }
}

/// The cap when `maxConnections` is not set: half of what the file-descriptor limit leaves after
/// a reserve, since each client connection may hold an upstream connection to an engine too. The
/// reserve (64 plus 1/16 of the limit) covers engines' pipes, the listener, logs and config files.
pub fn default_max(fd_limit: u64) -> usize {
    let reserve = 64 + fd_limit / 16;
    (fd_limit.saturating_sub(reserve) / 2).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_leaves_a_reserve_and_room_for_upstream_connections() {
        assert_eq!(default_max(200), 62);
        assert_eq!(default_max(1024), 448);
        assert_eq!(default_max(10), 1);
    }

    /// At the cap the longest-idle connection is evicted; busy ones never are, and when all are
    /// busy a new connection is refused.
    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let admission = Admission::new(2);
        let oldest = admission.admit().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let newer = admission.admit().unwrap();
        let third = admission.admit().unwrap();
        assert!(oldest.activity.is_evicted());
        assert!(!newer.activity.is_evicted());
        drop(oldest);
        let _busy = (
            newer.activity.begin(http::Version::HTTP_11),
            third.activity.begin(http::Version::HTTP_11),
        );
        assert!(admission.admit().is_none());
    }

    /// A connection evicted while idle that then gets a request stays open, and still counts: the
    /// next admission at the cap makes room by evicting another idle one.
    #[tokio::test]
    async fn an_evicted_connection_that_got_a_request_still_counts() {
        let admission = Admission::new(2);
        let raced = admission.admit().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let idle = admission.admit().unwrap();
        let third = admission.admit().unwrap();
        assert!(raced.activity.is_evicted());
        let _request = raced.activity.begin(http::Version::HTTP_11); // a request reached it before it closed
        drop(third);
        let _fourth = admission.admit().unwrap();
        assert!(
            idle.activity.is_evicted(),
            "two open already: the idle one makes room"
        );
    }
}
