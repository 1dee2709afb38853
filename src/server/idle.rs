//! Connections that sit without a request.
//!
//! hyper's header-read timer would start only once the connection has told HTTP/1 from HTTP/2
//! (`connection.rs`), which waits for the first bytes, and HTTP/2 has no idle timer at all: a
//! socket that sends nothing (or half a preface, or opens no stream) would hold a file descriptor
//! for ever. [`IdleDeadline`] closes a connection that has had no request in flight for a bound:
//! the header-read timeout before its first request, the idle timeout after; on HTTP/1.1, where
//! the wait between requests is a wait for the next head, no longer than the header-read timeout
//! either. hyper's own header-read timer, which boxes and arms a timer for every request, is off
//! (see `connection::Builders`): this one is set once per connection. The connection's
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

use crate::proxy::tunnel::{Keeper, Tunnel};
use crate::server::peek::{Peek, Protocol};
use crate::server::sends::{Sends, Turn};

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
    /// Its responses that wait for hyper to take their next frame (see `stall.rs`).
    sends: Sends,
    /// The tunnel an upgrade request on it was joined to, for the connection to run once hyper
    /// hands its socket over.
    tunnel: Kept,
}

/// The tunnel left for the connection to run.
#[derive(Default)]
struct Kept(Mutex<Option<Tunnel>>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        f.debug_struct("Kept").field("tunnel", &kept).finish()
    }
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
            sends: Sends::default(),
            tunnel: Kept::default(),
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
        InFlight {
            activity: self.clone(),
            turn: Turn::default(),
        }
    }

    /// True while a request is in flight.
    pub fn has_requests(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Its responses waiting to be taken.
    pub fn sends(&self) -> &Sends {
        &self.sends
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

    /// The tunnel to run once hyper has let the connection go, if an upgrade was joined.
    pub fn take_tunnel(&self) -> Option<Tunnel> {
        self.tunnel
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Keeper for Activity {
    fn keep(&self, tunnel: Tunnel) {
        *self.tunnel.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(tunnel);
    }
}

/// A request in flight on its connection; dropped with the response body.
pub struct InFlight {
    activity: Arc<Activity>,
    /// Its response's wait for hyper to take the next frame.
    turn: Turn,
}

impl InFlight {
    /// The request switched its connection's protocol: the connection is never idle again.
    pub fn upgrade(&self) {
        self.activity.upgrade();
    }

    /// The request was answered with something other than a switch of protocols: a tunnel made
    /// for it (the engine agreed, then something else was answered) is dropped, with its lease.
    pub fn not_upgraded(&self) {
        drop(self.activity.take_tunnel());
    }

    /// Its response was handed to hyper, or polled: see [`Turn::polled`].
    pub fn polled(&mut self, waits: bool) {
        self.turn.polled(&self.activity.sends, waits);
    }
}

impl Drop for InFlight {
    /// The last request's end starts the idle deadline, which the connection's task arms when
    /// its next read waits. An HTTP/1 response body is dropped while that task polls the
    /// connection, which then reads for the next request: the task is woken only when the body
    /// ends elsewhere (an HTTP/2 stream), or when that poll read nothing after it (see [`Polled`]).
    fn drop(&mut self) {
        let activity = &self.activity;
        self.turn.end(&activity.sends);
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
        // the bookkeeping of the answers that end in this poll comes after their last write
        crate::observe::meter::after_the_write(|| self.poll_connection(cx))
    }
}

impl<F: Future> Polled<F> {
    fn poll_connection(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
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
        let deadline = crate::clock::deadline::after(since, self.bound(served));
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

impl<T: Peek> Peek for IdleDeadline<T> {
    /// The wait for the first bytes is bounded like a read's.
    fn poll_protocol(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<Protocol>> {
        let peeked = self.inner.poll_protocol(cx);
        if peeked.is_pending() {
            if let Some(err) = self.expired(cx) {
                return Poll::Ready(Err(err));
            }
        }
        peeked
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
mod tests;
