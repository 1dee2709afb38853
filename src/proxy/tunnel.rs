//! Upgraded connections (websockets), joined to their engine's and copied both ways.
//!
//! A tunnel runs on the client connection it came on (see [`Handoff`]): that connection then stays
//! open, and counted against `maxConnections`, for as long as the tunnel does, and the tunnel ends
//! when nothing has passed either way for the client idle timeout, or when the server drains.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// A joined upgrade, copying until either side closes, it idles out, or it is dropped.
pub type Tunnel = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a tunnel runs: the client connection the upgrade request came on.
pub trait Keeper: Send + Sync {
    /// Runs `tunnel` once the connection's socket has been handed over.
    fn keep(&self, tunnel: Tunnel);
}

/// Put in an upgrade request's extensions by the client connection it came on; a request
/// without one (not from a client connection) has its tunnel run on a task of its own.
#[derive(Clone)]
pub struct Handoff {
    pub keeper: Arc<dyn Keeper>,
    /// A tunnel that carries nothing either way for this long is closed.
    pub idle: Duration,
}

/// The client's side and the upstream's, once each has been handed over, copied both ways until
/// either closes or nothing passes for `idle`; `guard` (the engine's lease) lives as long.
pub async fn join<G>(client: OnUpgrade, upstream: OnUpgrade, idle: Duration, guard: G) {
    let _guard = guard;
    let (Ok(client), Ok(upstream)) = (client.await, upstream.await) else {
        return;
    };
    let start = Instant::now();
    // when a byte last passed, in nanoseconds since `start`
    let last = AtomicU64::new(0);
    let mut client = Moving::new(TokioIo::new(client), start, &last);
    let mut upstream = Moving::new(TokioIo::new(upstream), start, &last);
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    let mut copy = std::pin::pin!(copy);
    let quiet = tokio::time::sleep_until(crate::clock::deadline::after(start, idle));
    let mut quiet = std::pin::pin!(quiet);
    loop {
        tokio::select! {
            _ = copy.as_mut() => return,
            () = quiet.as_mut() => {
                let moved = start + Duration::from_nanos(last.load(Ordering::Relaxed));
                let due = crate::clock::deadline::after(moved, idle);
                if due <= Instant::now() {
                    tracing::debug!("closed a websocket idle for {}s", idle.as_secs());
                    return;
                }
                quiet.as_mut().reset(due);
            }
        }
    }
}

/// One side of a tunnel, noting when bytes pass.
struct Moving<'a, T> {
    io: T,
    start: Instant,
    last: &'a AtomicU64,
}

impl<'a, T> Moving<'a, T> {
    fn new(io: T, start: Instant, last: &'a AtomicU64) -> Self {
        Moving { io, start, last }
    }

    fn moved(&self) {
        let since = self.start.elapsed().as_nanos();
        self.last
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Moving<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Moving<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
