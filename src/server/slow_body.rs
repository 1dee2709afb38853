//! Request bodies that arrive too slowly.
//!
//! A client that sends a request head and then its body one byte at a time holds a connection
//! (and, for a streamed upload, an engine's slot) for as long as it likes. [`BodyDeadline`] ends
//! such a body with [`TooSlow`], and the connection answers 408 and closes. Two bounds, in the
//! manner of Apache's `mod_reqtimeout`:
//!
//! - no progress: no byte for `stall` ends the body;
//! - minimum rate: the body must have ended by `stall + received / min_rate` after its first
//!   read, so every byte that arrives buys `1 / min_rate` more seconds. A 1 byte/s trickle
//!   (always "progressing") ends shortly after `stall`, while a 100 MiB upload at a few MB/s
//!   keeps extending its own deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The bounds on reading one request body.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub stall: Duration,
    /// Bytes per second; 0 leaves only the no-progress bound.
    pub min_rate: u64,
}

/// A body read too slowly.
#[derive(Debug, thiserror::Error)]
pub enum SlowBodyError<E> {
    #[error("request body too slow: {0}")]
    TooSlow(&'static str),
    #[error(transparent)]
    Inner(E),
}

/// A request body ended (with an error) once it is read too slowly; `tripped` tells the
/// connection to answer 408 and close.
pub struct BodyDeadline<B> {
    inner: B,
    limits: BodyLimits,
    /// First read, last byte seen, bytes seen: `None` until first polled.
    progress: Option<(Instant, Instant, u64)>,
    timer: Option<(Instant, Pin<Box<Sleep>>)>,
    tripped: Arc<AtomicBool>,
}

impl<B> BodyDeadline<B> {
    pub fn new(inner: B, limits: BodyLimits) -> (Self, Arc<AtomicBool>) {
        let tripped = Arc::new(AtomicBool::new(false));
        let body = BodyDeadline {
            inner,
            limits,
            progress: None,
            timer: None,
            tripped: tripped.clone(),
        };
        (body, tripped)
    }

    /// The earlier of the two bounds, and which one it is.
    fn deadline(&self, started: Instant, last: Instant, received: u64) -> (Instant, &'static str) {
        let stalled = crate::clock::deadline::after(last, self.limits.stall);
        if self.limits.min_rate == 0 {
            return (stalled, "no data within the limit");
        }
        let earned = Duration::from_secs_f64(received as f64 / self.limits.min_rate as f64);
        let slow = crate::clock::deadline::after(started, self.limits.stall.saturating_add(earned));
        if slow < stalled {
            (slow, "below the minimum rate")
        } else {
            (stalled, "no data within the limit")
        }
    }

    /// Arms the timer for the current deadline; `Some(why)` once it has passed.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        let now = Instant::now();
        let (started, last, received) = *self.progress.get_or_insert((now, now, 0));
        let (deadline, why) = self.deadline(started, last, received);
        let timer = match &mut self.timer {
            Some((at, timer)) if *at == deadline => timer,
            slot => {
                &mut slot
                    .insert((deadline, Box::pin(tokio::time::sleep_until(deadline))))
                    .1
            }
        };
        timer.as_mut().poll(cx).is_ready().then_some(why)
    }
}

impl<B> Body for BodyDeadline<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = SlowBodyError<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let now = Instant::now();
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                let (started, _, received) = self.progress.unwrap_or((now, now, 0));
                self.progress = Some((started, now, received + len));
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(SlowBodyError::Inner(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.expired(cx) {
                None => Poll::Pending,
                Some(why) => {
                    self.tripped.store(true, Ordering::Release);
                    Poll::Ready(Some(Err(SlowBodyError::TooSlow(why))))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    /// A body that yields one byte every `every`, `n` times.
    fn trickle(
        every: Duration,
        n: usize,
    ) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let frames = futures_util::stream::unfold(0, move |i| async move {
            if i == n {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((Ok(Frame::data(Bytes::from_static(b"x"))), i + 1))
        });
        StreamBody::new(Box::pin(frames))
    }

    const LIMITS: BodyLimits = BodyLimits {
        stall: Duration::from_millis(300),
        min_rate: 10,
    };

    /// A body that sends nothing ends after the no-progress bound.
    #[tokio::test]
    async fn a_silent_body_ends_after_the_stall_bound() {
        let (body, tripped) = BodyDeadline::new(trickle(Duration::from_secs(3600), 1), LIMITS);
        let started = Instant::now();
        assert!(body.collect().await.is_err());
        let took = started.elapsed();
        assert!(took >= LIMITS.stall && took < LIMITS.stall * 2, "{took:?}");
        assert!(tripped.load(Ordering::Acquire));
    }

    /// A body trickled below the rate always progresses, yet ends soon after the stall bound.
    #[tokio::test]
    async fn a_trickled_body_ends_at_the_minimum_rate() {
        let (body, tripped) = BodyDeadline::new(trickle(Duration::from_millis(50), 1000), slow());
        let started = Instant::now();
        assert!(body.collect().await.is_err());
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1500), "{took:?}");
        assert!(tripped.load(Ordering::Acquire));
    }

    /// A body fast enough is read whole, though it takes longer than the stall bound in total.
    #[tokio::test]
    async fn a_body_above_the_rate_is_read_whole() {
        let (body, tripped) = BodyDeadline::new(trickle(Duration::from_millis(20), 50), LIMITS);
        let read = body.collect().await.unwrap().to_bytes();
        assert_eq!(read.len(), 50);
        assert!(!tripped.load(Ordering::Acquire));
    }

    /// A bound whose minimum rate (100 bytes/s) a 20 bytes/s trickle cannot keep.
    fn slow() -> BodyLimits {
        BodyLimits {
            stall: Duration::from_millis(300),
            min_rate: 100,
        }
    }
}
