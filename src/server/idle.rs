//! Connections that sit without a request.
//!
//! hyper's header-read timer would start only once hyper-util's auto builder has told HTTP/1 from
//! HTTP/2, which waits for the first bytes with no timer, and HTTP/2 has no idle timer at all: a
//! socket that sends nothing (or half a preface, or opens no stream) would hold a file descriptor
//! for ever. [`IdleDeadline`] closes a connection that has had no request in flight for a bound:
//! the header-read timeout before its first request, the idle timeout after; on HTTP/1.1, where
//! the wait between requests is a wait for the next head, no longer than the header-read timeout
//! either. hyper's own header-read timer, which boxes and arms a timer for every request, is off
//! (see `connection_builder`): this one is set once per connection. The connection's
//! [`Activity`] counts its requests in flight; the admission table reads it to pick an idle
//! connection to close when the connection cap is reached.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What one connection is doing, shared by its I/O, its requests and the admission table.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection was accepted).
    idle_since: Mutex<Instant>,
    /// Set by the first request: from then on the idle timeout applies instead of the head one.
    served: AtomicBool,
    /// Its requests are HTTP/1: the wait for the next one is bounded by the head timeout too.
    http1: AtomicBool,
    /// Upgraded (a websocket): its bytes no longer pass through hyper, so it is never idle here.
    upgraded: AtomicBool,
    /// Set to close the connection to make room for a new one.
    evicted: AtomicBool,
    /// The connection's task, woken when the state above changes.
    waker: AtomicWaker,
    /// The connection's future is being polled (see [`Polled`]).
    in_poll: AtomicBool,
    /// The last request ended and the deadline has not been looked at since.
    ended: AtomicBool,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            served: AtomicBool::new(false),
            http1: AtomicBool::new(false),
            upgraded: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            in_poll: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }
}

impl Activity {
    /// Counts a request in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>, version: http::Version) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        self.http1
            .store(version < http::Version::HTTP_2, Ordering::Release);
        InFlight(self.clone())
    }

    /// Since when the connection has had no request in flight; `None` while it has one.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 || self.upgraded.load(Ordering::Acquire) {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Closes the connection if it is idle (it is then no longer counted as idle).
    pub fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Marks the connection as handed over to an upgrade (a websocket).
    pub fn upgrade(&self) {
        self.upgraded.store(true, Ordering::Release);
    }
}

/// A request in flight on its connection; dropped with the response body.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    /// The last request's end starts the idle deadline, which the connection's task arms when
    /// its next read waits. An HTTP/1 response body is dropped while that task polls the
    /// connection, which then reads for the next request: the task is woken only when the body
    /// ends elsewhere (an HTTP/2 stream), or when that poll read nothing after it (see [`Polled`]).
    fn drop(&mut self) {
        let activity = &self.0;
        *activity
            .idle_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.ended.store(true, Ordering::SeqCst);
            if !activity.in_poll.load(Ordering::SeqCst) {
                activity.waker.wake();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's future, marked as polled while it is: a request that ends within the poll
    /// need not wake the task (see [`InFlight`]'s drop). When the deadline was not looked at
    /// after it, the connection is polled once more at once, and the task is woken only if that
    /// poll did not look either.
    pub struct Polled<F> {
        #[pin]
        inner: F,
        activity: Arc<Activity>,
    }
}

impl<F> Polled<F> {
    pub fn new(inner: F, activity: Arc<Activity>) -> Self {
        Polled { inner, activity }
    }
}

impl<F: Future> Future for Polled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        this.activity.in_poll.store(true, Ordering::SeqCst);
        let mut polled = this.inner.as_mut().poll(cx);
        if polled.is_pending() && this.activity.ended.load(Ordering::SeqCst) {
            // the last request ended after the poll's last read (hyper writes after it reads):
            // a second poll reads for the next request, and arms the deadline, without a trip
            // through the scheduler
            polled = this.inner.as_mut().poll(cx);
        }
        this.activity.in_poll.store(false, Ordering::SeqCst);
        if polled.is_pending() && this.activity.ended.swap(false, Ordering::SeqCst) {
            cx.waker().wake_by_ref();
        }
        polled
    }
}

/// An I/O stream whose reads fail once its connection has been idle too long or was evicted.
pub struct IdleDeadline<T> {
    inner: T,
    activity: Arc<Activity>,
    /// Before the first request: the header-read timeout.
    first: Duration,
    /// After it: the idle timeout.
    idle: Duration,
    /// Set at or before the connection's deadline (see [`IdleDeadline::expired`]).
    timer: Option<Pin<Box<Sleep>>>,
}

impl<T> IdleDeadline<T> {
    pub fn new(inner: T, activity: Arc<Activity>, first: Duration, idle: Duration) -> Self {
        IdleDeadline {
            inner,
            activity,
            first,
            idle,
            timer: None,
        }
    }

    /// How long the connection may go without a request in flight.
    fn bound(&self, served: bool) -> Duration {
        if !served {
            self.first
        } else if self.activity.http1.load(Ordering::Acquire) {
            self.idle.min(self.first)
        } else {
            self.idle
        }
    }

    /// Why the connection must close now, if it must; otherwise arms the timer for when it will.
    ///
    /// The timer is set once and left alone while requests come and go: a connection's deadline
    /// only moves later as it serves, so a timer set for an earlier one fires early and is then
    /// moved on. A request costs no timer of its own, only a comparison.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        self.activity.waker.register(cx.waker());
        self.activity.ended.store(false, Ordering::SeqCst);
        let since = self.activity.idle_since()?;
        if self.activity.is_evicted() {
            return Some(closed(
                "closed an idle connection to make room for a new one",
            ));
        }
        let served = self.activity.served.load(Ordering::Acquire);
        let deadline = since + self.bound(served);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            // the idle timeout is shorter than the head one the timer was set for
            timer.as_mut().reset(deadline);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                return Some(closed(if served {
                    "closed a connection idle for too long"
                } else {
                    "closed a connection that sent no request in time"
                }));
            }
            timer.as_mut().reset(deadline);
        }
        None
    }
}

fn closed(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, why)
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleDeadline<T> {
    /// Checks the deadline before reading, so bytes that keep coming (pings, a trickled head)
    /// do not keep an idle connection open.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // the deadline is looked at only when the read would wait: a read that has bytes (a
        // request arriving) costs no timer work, and one that trickles still waits after each
        // byte, where its deadline is checked
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if read.is_pending() {
            if let Some(err) = self.expired(cx) {
                return Poll::Ready(Err(err));
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const FIRST: Duration = Duration::from_millis(300);
    const IDLE: Duration = Duration::from_millis(600);

    fn pipe() -> (
        tokio::io::DuplexStream,
        IdleDeadline<tokio::io::DuplexStream>,
        Arc<Activity>,
    ) {
        let (client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let io = IdleDeadline::new(server, activity.clone(), FIRST, IDLE);
        (client, io, activity)
    }

    /// Reads until the stream fails; returns how long that took.
    async fn time_to_failure(io: &mut IdleDeadline<tokio::io::DuplexStream>) -> Duration {
        let started = Instant::now();
        let mut buf = [0; 8];
        loop {
            match io.read(&mut buf).await {
                Ok(_) => continue,
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
                    return started.elapsed();
                }
            }
        }
    }

    /// A peer with no request is cut off at the first deadline, even while it trickles bytes.
    #[tokio::test]
    async fn a_peer_with_no_request_is_cut_off_at_the_first_deadline() {
        let (mut client, mut io, _activity) = pipe();
        let trickle = tokio::spawn(async move {
            while client.write_all(b"P").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let took = time_to_failure(&mut io).await;
        assert!(took >= FIRST && took < IDLE, "{took:?}");
        trickle.abort();
    }

    /// No deadline applies while a request is in flight; the idle one starts when it ends.
    #[tokio::test]
    async fn the_idle_deadline_starts_when_the_last_request_ends() {
        let (_client, mut io, activity) = pipe();
        let request = activity.begin(http::Version::HTTP_2);
        let mut buf = [0; 8];
        let read = tokio::time::timeout(IDLE * 2, io.read(&mut buf)).await;
        assert!(
            read.is_err(),
            "nothing closes a connection with a request in flight"
        );
        drop(request);
        let took = time_to_failure(&mut io).await;
        assert!(took >= IDLE && took < IDLE * 2, "{took:?}");
    }

    /// Counts the wake-ups of the task a future is polled in.
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A stand-in for a connection: each poll runs `step` on the connection's reads.
    fn connection(
        io: IdleDeadline<tokio::io::DuplexStream>,
        step: impl FnMut(&mut IdleDeadline<tokio::io::DuplexStream>, &mut Context<'_>) + Unpin,
    ) -> impl Future<Output = ()> {
        let mut state = (io, step);
        std::future::poll_fn(move |cx| {
            let (io, step) = &mut state;
            step(io, cx);
            Poll::Pending
        })
    }

    /// A connection whose request ends in its second poll, which reads nothing after it; its first
    /// poll reads, and so do those after the second when `reads_later`.
    fn ending_in_second_poll(reads_later: bool) -> (impl Future<Output = ()>, Arc<Activity>) {
        let (client, io, activity) = pipe();
        let mut request = Some(activity.begin(http::Version::HTTP_2));
        let mut polls = 0;
        let conn = connection(io, move |io, cx| {
            let _open = &client;
            polls += 1;
            if polls == 2 {
                request.take();
            } else if polls == 1 || reads_later {
                let mut buf = [0; 8];
                let _ = Pin::new(io).poll_read(cx, &mut ReadBuf::new(&mut buf));
            }
        });
        (conn, activity)
    }

    /// A request that ends while its connection is polled, which then reads, wakes nobody; one
    /// that ends while the connection waits wakes it. One that ends in a poll that reads nothing
    /// after it has the connection polled again at once, and wakes it (once) only if that poll
    /// reads nothing either.
    #[tokio::test]
    async fn a_request_wakes_its_connection_only_when_the_deadline_needs_a_look() {
        let counter = Arc::new(CountingWaker(Default::default()));
        let waker = std::task::Waker::from(counter.clone());
        let wakes = || counter.0.load(Ordering::SeqCst);
        let mut cx = Context::from_waker(&waker);
        let read = |io: &mut IdleDeadline<tokio::io::DuplexStream>, cx: &mut Context<'_>| {
            let mut buf = [0; 8];
            let _ = Pin::new(io).poll_read(cx, &mut ReadBuf::new(&mut buf));
        };

        // ends in the poll, then reads: as an HTTP/1 response body's end does
        let (_client, io, activity) = pipe();
        let mut request = Some(activity.begin(http::Version::HTTP_2));
        let conn = connection(io, move |io, cx| {
            read(io, cx);
            request.take();
            read(io, cx);
        });
        let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes(), 0);

        // ends while the connection waits
        let (_client, io, activity) = pipe();
        let request = activity.begin(http::Version::HTTP_2);
        let mut polled = std::pin::pin!(Polled::new(connection(io, read), activity.clone()));
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        drop(request);
        assert_eq!(wakes(), 1);

        // ends in a poll that reads nothing after it
        let (conn, activity) = ending_in_second_poll(false);
        let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes(), 2, "woken to look at the deadline");
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes(), 2, "once");

        // ends in a poll that reads nothing after it, and the next poll reads
        let (conn, activity) = ending_in_second_poll(true);
        let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes(), 2, "polled again at once, not woken");
        assert!(
            !activity.ended.load(Ordering::SeqCst),
            "the deadline was looked at"
        );
    }

    /// Eviction closes an idle connection at once, and never one with a request in flight.
    #[tokio::test]
    async fn eviction_closes_only_idle_connections() {
        let (_client, mut io, activity) = pipe();
        let request = activity.begin(http::Version::HTTP_2);
        activity.evict();
        let mut buf = [0; 8];
        let read = tokio::time::timeout(FIRST * 2, io.read(&mut buf)).await;
        assert!(read.is_err(), "a connection with a request in flight stays");
        drop(request);
        assert!(time_to_failure(&mut io).await < FIRST);
    }

    /// The timer armed at the first deadline is moved on, not fired, while requests keep coming
    /// before each deadline; the connection closes one idle timeout after the last of them.
    #[tokio::test(start_paused = true)]
    async fn requests_before_each_deadline_keep_the_connection() {
        let (_client, mut io, activity) = pipe();
        let requests = tokio::spawn(async move {
            for _ in 0..8 {
                tokio::time::sleep(FIRST * 2 / 3).await;
                drop(activity.begin(http::Version::HTTP_2));
            }
        });
        let took = time_to_failure(&mut io).await;
        let last_request = FIRST * 2 / 3 * 8;
        assert!(took >= last_request + IDLE, "{took:?}");
        assert!(took < last_request + IDLE * 2, "{took:?}");
        requests.await.unwrap();
    }

    /// On HTTP/1.1 the wait for the next request is a wait for its head: it ends at the head
    /// timeout when that is the shorter; an HTTP/2 connection waits for the idle one.
    #[tokio::test(start_paused = true)]
    async fn an_http1_connection_waits_for_its_next_head_no_longer_than_the_head_timeout() {
        let (head, idle) = (Duration::from_secs(2), Duration::from_secs(10));
        for (version, bound) in [
            (http::Version::HTTP_11, head),
            (http::Version::HTTP_2, idle),
        ] {
            let (_client, server) = tokio::io::duplex(64);
            let activity = Arc::new(Activity::default());
            let mut io = IdleDeadline::new(server, activity.clone(), head, idle);
            drop(activity.begin(version));
            let took = time_to_failure(&mut io).await;
            assert!(
                took >= bound && took < bound + head,
                "{version:?}: {took:?}"
            );
        }
    }

    /// An idle timeout shorter than the head one is kept, though the timer was armed for the head.
    #[tokio::test(start_paused = true)]
    async fn a_shorter_idle_timeout_is_not_overslept() {
        let (_client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let (head, idle) = (Duration::from_secs(10), Duration::from_secs(1));
        let mut io = IdleDeadline::new(server, activity.clone(), head, idle);
        let mut buf = [0; 8];
        let first = tokio::time::timeout(Duration::from_millis(100), io.read(&mut buf)).await;
        assert!(first.is_err(), "the head deadline is 10 s away");
        drop(activity.begin(http::Version::HTTP_2));
        let took = time_to_failure(&mut io).await;
        assert!(took >= idle && took < idle * 2, "{took:?}");
    }
}
