//! An operator's cancel of one request, checked where the request is polled.
//!
//! A request is cancellable for its whole life, but almost never cancelled, so the check is what
//! must cost nothing: one atomic load, and a waker kept in an [`AtomicWaker`] (a compare-and-swap,
//! skipped when the waker is the same). tokio's `CancellationToken` would take a mutex on every
//! poll of the request and of each body frame, and allocate for its waiter list.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use http::Response;

use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// One request's cancel: set once by an operator, seen by the request's task. Only one task polls a
/// request at a time (its future, then its response body), so one waker is enough.
#[derive(Default)]
pub struct Cancel {
    cancelled: AtomicBool,
    waker: AtomicWaker,
}

impl Cancel {
    pub fn new() -> Arc<Cancel> {
        Arc::default()
    }

    /// Cancels the request and wakes its task.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// True once cancelled; else the task is woken when it is.
    pub fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        if self.is_cancelled() {
            return true;
        }
        self.waker.register(cx.waker());
        // a cancel between the first check and the registration woke no one
        self.is_cancelled()
    }
}

pin_project_lite::pin_project! {
    /// `work` until it ends or an operator cancels the request (then [`Error::Cancelled`]).
    pub struct Cancellable<'c, F> {
        #[pin]
        work: F,
        cancel: &'c Cancel,
    }
}

impl<'c, F> Cancellable<'c, F> {
    pub fn new(cancel: &'c Cancel, work: F) -> Self {
        Cancellable { work, cancel }
    }
}

impl<F> Future for Cancellable<'_, F>
where
    F: Future<Output = Result<Response<Body>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if this.cancel.poll_cancelled(cx) {
            return Poll::Ready(Err(Error::Cancelled));
        }
        this.work.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pending_request_ends_when_cancelled() {
        let cancel = Cancel::new();
        let waiting = {
            let cancel = cancel.clone();
            tokio::spawn(async move { Cancellable::new(&cancel, std::future::pending()).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        cancel.cancel();
        let result = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the cancel woke the request")
            .unwrap();
        assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    }

    #[tokio::test]
    async fn work_that_ends_is_answered_and_a_cancelled_request_does_no_work() {
        let cancel = Cancel::new();
        let answer = Cancellable::new(&cancel, async {
            Ok(Response::new(crate::proxy::body::full("done")))
        })
        .await;
        assert_eq!(answer.unwrap().status(), 200);
        cancel.cancel();
        let never = Cancellable::new(&cancel, async { panic!("polled after the cancel") }).await;
        assert!(matches!(never, Err(Error::Cancelled)));
    }
}
