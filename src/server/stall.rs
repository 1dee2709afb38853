//! Client connections that stop taking their responses.
//!
//! A client that stops reading its response fills the socket buffers; hyper then stops pulling
//! the response body, so neither a timer in the body nor the engine notices, and the request
//! would hold its slot on the engine for ever. [`WriteDeadline`] fails a write that has made no
//! progress for the limit: hyper closes the connection, the response body and its upstream
//! connection are dropped, and the engine sees the request go.
//!
//! An HTTP/2 client can stop taking a response without a write ever waiting: it grants the stream
//! no flow-control window (or never more of it) and answers the keep-alive pings, so the socket
//! stays writable while hyper waits for send capacity and never polls the body again, and the idle
//! deadline does not apply to a connection with a request in flight. [`Sends`] counts the
//! responses that wait for hyper to take their next frame, and [`SendDeadline`], a timer of the
//! connection's own that does not depend on any body being polled, closes the connection when one
//! has waited for the same limit; the bodies, and the engine leases in them, are dropped with it.

use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::server::idle::Activity;
use crate::server::peek::{Peek, Protocol};

/// An I/O stream whose writes fail after `limit` without progress.
pub struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    /// Armed while a write waits; dropped as soon as one goes through.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Passes a write's outcome through; a `Pending` one starts (or checks) the deadline.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing for {}s; closing its connection",
                    limit.as_secs()
                ),
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Peek> Peek for WriteDeadline<T> {
    fn poll_protocol(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<Protocol>> {
        self.inner.poll_protocol(cx)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pin_project_lite::pin_project! {
    /// A connection's future, ended (the connection closed, its response bodies dropped) once one
    /// of its responses has waited for hyper to take its next frame for the limit. The clock ticks
    /// every half limit while the connection has a request in flight, so a stalled response is
    /// found after between one and one and a half limits; no response moves the timer.
    pub struct SendDeadline<F> {
        #[pin]
        inner: F,
        activity: Arc<Activity>,
        tick: Duration,
        // armed while a request is in flight
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<F> SendDeadline<F> {
    pub fn new(inner: F, activity: Arc<Activity>, limit: Duration) -> Self {
        SendDeadline {
            inner,
            activity,
            tick: (limit / 2).max(Duration::from_millis(1)),
            timer: None,
        }
    }
}

impl<F: Future<Output = ()>> Future for SendDeadline<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.inner.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        // every request begins within a poll of the connection (hyper calls the service there,
        // for HTTP/2 too), so the timer is armed before any of its responses can wait
        if this.timer.is_none() {
            if !this.activity.has_requests() {
                return Poll::Pending;
            }
            *this.timer = Some(Box::pin(tokio::time::sleep(*this.tick)));
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        while timer.as_mut().poll(cx).is_ready() {
            if this.activity.sends().tick() {
                tracing::debug!(
                    "closed a connection whose client took no response data for {}s",
                    (*this.tick * 2).as_secs()
                );
                return Poll::Ready(());
            }
            if !this.activity.has_requests() {
                *this.timer = None;
                return Poll::Pending;
            }
            let next = crate::clock::deadline::after(tokio::time::Instant::now(), *this.tick);
            timer.as_mut().reset(next);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A write into a pipe nobody reads fails after the limit; one that goes through does not.
    #[tokio::test]
    async fn a_write_without_progress_fails_after_the_limit() {
        let (client, _server) = tokio::io::duplex(64);
        let mut io = WriteDeadline::new(client, Duration::from_millis(200));
        io.write_all(&[0; 64]).await.unwrap();
        let started = std::time::Instant::now();
        let err = io.write_all(&[0; 1]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    const LIMIT: Duration = Duration::from_secs(10);

    /// A connection that never ends on its own, under the send deadline.
    fn watched(activity: &Arc<Activity>) -> SendDeadline<std::future::Pending<()>> {
        SendDeadline::new(std::future::pending(), activity.clone(), LIMIT)
    }

    /// How long until `conn` ends, if it does within `within`.
    async fn ends_after<F: Future<Output = ()>>(conn: F, within: Duration) -> Option<Duration> {
        let started = tokio::time::Instant::now();
        tokio::time::timeout(within, conn)
            .await
            .ok()
            .map(|()| started.elapsed())
    }

    /// A response handed to hyper and never polled (an HTTP/2 stream granted no window) closes
    /// its connection after between one and one and a half limits.
    #[tokio::test(start_paused = true)]
    async fn a_response_never_taken_closes_its_connection() {
        let activity = Arc::new(Activity::default());
        let mut request = activity.begin(http::Version::HTTP_2);
        request.polled(true);
        let took = ends_after(watched(&activity), LIMIT * 5).await;
        assert!(
            took.is_some_and(|t| t >= LIMIT && t <= LIMIT * 3 / 2),
            "{took:?}"
        );
    }

    /// A response that waits for its own source (an engine slow to send its next token) is the
    /// body's business, however long; one taken frame after frame is never stalled.
    #[tokio::test(start_paused = true)]
    async fn responses_waiting_for_their_engine_or_taken_steadily_stay() {
        let activity = Arc::new(Activity::default());
        let mut slow = activity.begin(http::Version::HTTP_2);
        slow.polled(true);
        slow.polled(false);
        let mut steady = activity.begin(http::Version::HTTP_2);
        let taking = tokio::spawn(async move {
            loop {
                steady.polled(true);
                tokio::time::sleep(LIMIT / 3).await;
            }
        });
        assert_eq!(ends_after(watched(&activity), LIMIT * 10).await, None);
        taking.abort();
        drop(slow);
    }

    /// A stalled stream is found although another on the same connection keeps going.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_stream_is_found_beside_a_steady_one() {
        let activity = Arc::new(Activity::default());
        let mut steady = activity.begin(http::Version::HTTP_2);
        let taking = tokio::spawn(async move {
            loop {
                steady.polled(true);
                tokio::time::sleep(LIMIT / 4).await;
                steady.polled(false);
                tokio::time::sleep(LIMIT / 4).await;
            }
        });
        let conn = watched(&activity);
        tokio::time::sleep(LIMIT * 3).await;
        let mut stalled = activity.begin(http::Version::HTTP_2);
        stalled.polled(true);
        let took = ends_after(conn, LIMIT * 5).await;
        taking.abort();
        assert!(took.is_some_and(|t| t <= LIMIT * 3 / 2), "{took:?}");
    }

    /// The timer runs only while a request is in flight, and a request that begins after it
    /// stopped arms it again.
    #[tokio::test(start_paused = true)]
    async fn the_clock_stops_between_requests_and_starts_again() {
        let activity = Arc::new(Activity::default());
        let mut conn = std::pin::pin!(watched(&activity));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(conn.as_mut().poll(&mut cx).is_pending());
        assert!(conn.timer.is_none(), "no request: no timer");
        let done = activity.begin(http::Version::HTTP_11);
        assert!(conn.as_mut().poll(&mut cx).is_pending());
        assert!(conn.timer.is_some());
        drop(done);
        tokio::time::advance(LIMIT).await;
        assert!(conn.as_mut().poll(&mut cx).is_pending());
        assert!(conn.timer.is_none(), "the clock stopped");
        let mut request = activity.begin(http::Version::HTTP_11);
        request.polled(true);
        let took = ends_after(conn, LIMIT * 5).await;
        assert!(took.is_some_and(|t| t >= LIMIT), "{took:?}");
    }
}
