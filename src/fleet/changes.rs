//! The fleet's change signal: requests waiting for a ready instance with room, and stops waiting
//! for instances to end, are woken when the fleet's state changes.
//!
//! Every request's end is such a change, on every serving thread, and almost always with nobody
//! waiting; a notification takes the signal's lock all the same, so the serving threads took
//! turns on it once a request. Waiters are counted here, and a request's end that finds none skips
//! it ([`Changes::notify_waiters_if_any`]). That loses no wake-up: a waiter is counted before it
//! registers and looks at the state under the fleet's lock, and a request's end changes the state
//! under that lock before it reads the count, so either the count shows the waiter or the
//! waiter's look comes after the change and sees it.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

#[derive(Default)]
pub(super) struct Changes {
    notify: Notify,
    waiting: AtomicUsize,
}

impl Changes {
    /// Counts a waiter until the returned guard is dropped; take it before looking at the state.
    pub fn waiter(&self) -> Waiter<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        Waiter { changes: self }
    }

    /// Wakes every waiter.
    pub fn notify_waiters(&self) {
        self.notify.notify_waiters();
    }

    /// Wakes every waiter, when there is one: for a change made under the fleet's lock.
    pub fn notify_waiters_if_any(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// A counted waiter.
pub(super) struct Waiter<'a> {
    changes: &'a Changes,
}

impl<'a> Waiter<'a> {
    /// The next change: enable it before looking at the state, then await it.
    pub fn notified(&self) -> Notified<'a> {
        self.changes.notify.notified()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.changes.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Poll};

    use super::*;

    /// A change with nobody counted skips the signal; one with a counted waiter wakes it.
    #[test]
    fn only_a_counted_waiter_is_signalled() {
        let changes = Changes::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());

        // a notification would complete even a future that was made before it
        let uncounted = changes.notify.notified();
        let mut uncounted = std::pin::pin!(uncounted);
        changes.notify_waiters_if_any();
        assert!(uncounted.as_mut().poll(&mut cx).is_pending(), "skipped");

        let waiter = changes.waiter();
        let notified = waiter.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        assert!(notified.as_mut().poll(&mut cx).is_pending());
        changes.notify_waiters_if_any();
        assert_eq!(notified.as_mut().poll(&mut cx), Poll::Ready(()));
        drop(waiter);
        assert_eq!(changes.waiting.load(Ordering::SeqCst), 0);
    }
}
