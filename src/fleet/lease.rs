//! The holds a request takes on the fleet: a reservation, a place among swap waiters, a place in a
//! pool's queue, and the lease on a ready instance. Each gives back what it holds when dropped, so
//! a client that goes away frees its place at once. Kept apart from `mod.rs` because they are plain
//! RAII guards with no scheduling logic of their own.

use std::sync::Arc;
use std::time::Instant;

use super::Inner;

/// A direct request admitted for an instance that has no lease yet.
pub(super) struct Reservation {
    pub(super) inner: Arc<Inner>,
    /// The instance's own `Arc` of its id, which also names it as the one held (`holder`).
    pub(super) id: Arc<str>,
    pub(super) done: bool,
}

impl Reservation {
    pub(super) fn into_lease(mut self, proxy: Arc<str>) -> Lease {
        self.done = true;
        Lease {
            inner: self.inner.clone(),
            id: self.id.clone(),
            proxy,
            direct: true,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            self.inner.unreserve(&self.id);
        }
    }
}

/// A direct request's place among swap waiters; gone when the request is.
pub(super) struct Turn {
    pub(super) inner: Arc<Inner>,
    pub(super) seq: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.inner.lock().waiting.remove(&self.seq);
        self.inner.touch();
    }
}

/// A place in a pool's queue; dropping it (the client left) removes it at once.
pub(super) struct Ticket {
    pub(super) inner: Arc<Inner>,
    pub(super) pool: String,
    pub(super) id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        if let Some(p) = st.pools.get_mut(&self.pool) {
            p.queue.leave(self.id);
        }
        drop(st);
        self.inner.touch();
    }
}

/// A request's hold on a ready instance. It lives in the response body, so the instance counts as
/// busy until the last byte is sent or the client goes away.
pub struct Lease {
    pub(super) inner: Arc<Inner>,
    /// As in `Reservation`: the instance's own `Arc`.
    pub(super) id: Arc<str>,
    pub(super) proxy: Arc<str>,
    pub(super) direct: bool,
}

impl Lease {
    /// The instance id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// The instance's base URL.
    pub fn proxy(&self) -> Arc<str> {
        self.proxy.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let direct = self.direct;
        self.inner.release(&self.id, |i| {
            i.in_flight -= 1;
            if direct {
                i.reserved -= 1;
            }
            i.last_used = Instant::now();
            i.recent_ends.record(i.last_used);
        });
    }
}
