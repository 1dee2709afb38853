//! One client connection: which HTTP it speaks, told from its first bytes, then hyper's own
//! connection for that protocol, told to finish its requests when the server drains.
//!
//! An h2c client with prior knowledge opens with HTTP/2's preface; anything else is HTTP/1.
//! hyper-util's auto connection told them apart by reading those bytes and handing them back
//! through a wrapper that then stayed in every read of the connection; given the 24 bytes first,
//! hyper reserved its 8 KiB read buffer again behind them, so every connection's buffer doubled
//! to 16 KiB. Here the bytes are peeked at and left in the socket, and hyper's HTTP/1 or HTTP/2
//! connection reads them as on a connection of its own.
//!
//! A websocket's tunnel runs here too, once hyper has handed the upgraded socket over: the
//! connection's task, with the admission, trim slot and thread count it holds, lasts as long as
//! the tunnel, so tunnels count against `maxConnections` like any connection with a request in
//! flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::ServerSettings;
use crate::proxy::tunnel::Tunnel;
use crate::server::idle::Activity;
use crate::server::layers::InFlightBody;
use crate::server::peek::{Peek, Protocol};

/// How client connections are served, per protocol.
pub struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Builders {
    pub fn new(settings: &ServerSettings) -> Builders {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            // bounded by `IdleDeadline` instead, with one timer per connection rather than one
            // boxed and armed for every request head
            .header_read_timeout(None)
            // a firm bound on a request head: the buffer's own is checked only between reads,
            // so one large read could carry a head past it
            .max_header_size(64 * 1024)
            .max_buf_size(64 * 1024);
        // hyper's own limit of 100 headers stands: setting one, even the same 100, makes hyper
        // fill both of its header arrays on every request (about 1,700 instructions per request)
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(settings.http2_ping_interval)
            .keep_alive_timeout(settings.http2_ping_timeout)
            .max_concurrent_streams(100)
            .max_header_list_size(64 * 1024);
        Builders { http1, http2 }
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<T, S>
    where
        S: HttpService<Incoming>,
    {
        Peeking { io: Option<T>, service: Option<S> },
        Http1 { #[pin] conn: http1::UpgradeableConnection<TokioIo<T>, S> },
        // boxed: twice the size of an HTTP/1 connection, and every connection's task would
        // carry it
        Http2 { conn: Pin<Box<http2::Connection<TokioIo<T>, S, TokioExecutor>>> },
        // a websocket joined to its engine's, after hyper let the connection go
        Tunnel { tunnel: Tunnel },
    }
}

pin_project_lite::pin_project! {
    /// A client connection, from its first bytes to its end. When the server drains, a
    /// connection that has not said its protocol is closed, and one that has finishes the
    /// requests it has (hyper's graceful shutdown).
    pub struct ClientConnection<T, S>
    where
        S: HttpService<Incoming>,
    {
        #[pin]
        state: State<T, S>,
        builders: Arc<Builders>,
        draining: CancellationToken,
        // the task's waker, registered at the first poll: later polls look at the token's flag
        // alone (polling this again takes the token's lock, on every poll of the connection)
        #[pin]
        woken_on_drain: WaitForCancellationFutureOwned,
        registered: bool,
        told_to_finish: bool,
        // where an upgrade's tunnel is left for the connection to run (see `with_tunnels`)
        tunnels: Option<Arc<Activity>>,
    }
}

impl<T, S: HttpService<Incoming>> ClientConnection<T, S> {
    pub fn new(io: T, service: S, builders: Arc<Builders>, draining: CancellationToken) -> Self {
        ClientConnection {
            state: State::Peeking {
                io: Some(io),
                service: Some(service),
            },
            builders,
            woken_on_drain: draining.clone().cancelled_owned(),
            draining,
            registered: false,
            told_to_finish: false,
            tunnels: None,
        }
    }

    /// Runs, once hyper has let an upgraded connection go, the tunnel its request left in
    /// `activity`; without this the connection ends there.
    pub fn with_tunnels(mut self, activity: Arc<Activity>) -> Self {
        self.tunnels = Some(activity);
        self
    }
}

impl<T, S> Future for ClientConnection<T, S>
where
    T: Peek + AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = InFlightBody> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let draining = match std::mem::replace(this.registered, true) {
            true => this.draining.is_cancelled(),
            false => this.woken_on_drain.poll(cx).is_ready(),
        };
        if draining && !*this.told_to_finish {
            *this.told_to_finish = true;
            match this.state.as_mut().project() {
                StateProj::Peeking { .. } => return Poll::Ready(()),
                StateProj::Http1 { conn } => conn.graceful_shutdown(),
                StateProj::Http2 { conn } => conn.as_mut().graceful_shutdown(),
                // a tunnel never finishes on its own: it is closed
                StateProj::Tunnel { .. } => return Poll::Ready(()),
            }
        }
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Peeking { io, service } => {
                    let told = ready!(io.as_mut().expect("peeking").poll_protocol(cx));
                    let (Some(io), Some(service)) = (io.take(), service.take()) else {
                        return Poll::Ready(());
                    };
                    let io = TokioIo::new(io);
                    match told {
                        Ok(Protocol::Http1) => State::Http1 {
                            conn: this
                                .builders
                                .http1
                                .serve_connection(io, service)
                                .with_upgrades(),
                        },
                        Ok(Protocol::Http2) => State::Http2 {
                            conn: Box::pin(this.builders.http2.serve_connection(io, service)),
                        },
                        // the deadline passed, or the socket failed, before a protocol was told
                        Err(_) => return Poll::Ready(()),
                    }
                }
                // how a connection ends is the client's business; its requests log their own
                StateProj::Http1 { conn } => {
                    // upgraded (or ended, with no tunnel left): the tunnel, unless the server
                    // drains
                    let _ = ready!(conn.poll(cx));
                    let tunnel = this.tunnels.as_ref().and_then(|a| a.take_tunnel());
                    match tunnel {
                        Some(tunnel) if !*this.told_to_finish => State::Tunnel { tunnel },
                        _ => return Poll::Ready(()),
                    }
                }
                StateProj::Http2 { conn } => return conn.as_mut().poll(cx).map(drop),
                StateProj::Tunnel { tunnel } => return tunnel.as_mut().poll(cx),
            };
            this.state.set(next);
        }
    }
}

#[cfg(test)]
mod tests;
