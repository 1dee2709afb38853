//! Serving threads: one event loop per core.
//!
//! Each accepted connection is handed to the least busy serving thread and stays there: its
//! requests, the upstream connections they drive and the responses they stream are all polled on
//! that one thread, so a request costs no hand-off between threads (a work-stealing runtime moves
//! a task to whichever thread saw its socket become ready, paying a wake-up each time). The
//! control plane (supervision, reloads, signals) stays on the runtime that called
//! [`crate::server::run`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::api::App;
use crate::config::ServerSettings;
use crate::server::admission::Admitted;
use crate::server::connection::{Builders, ClientConnection};
use crate::server::idle::{Activity, IdleDeadline, Polled};
use crate::server::layers::{ConnectionService, InFlightBody};
use crate::server::peek::Peek;
use crate::server::slow_body::{BodyDeadline, BodyLimits};
use crate::server::stall::{SendDeadline, WriteDeadline};
use crate::server::tls::TlsStream;
use crate::server::trim::Open;

/// How many serving threads: `CORRAL_THREADS`, else one per core.
pub fn count() -> usize {
    std::env::var("CORRAL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// What every serving thread shares.
#[derive(Clone)]
pub struct Shared {
    /// The service for the config in force (a reload swaps it).
    pub current: Arc<RwLock<Arc<App>>>,
    /// Timeouts for client connections (read at start).
    pub settings: ServerSettings,
    /// The handshake of every connection, when the listener serves HTTPS.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

struct Accepted {
    stream: std::net::TcpStream,
    remote: SocketAddr,
    open: Open,
    admitted: Admitted,
}

struct Worker {
    /// `None` once the thread takes no more connections.
    conns: Option<mpsc::UnboundedSender<Accepted>>,
    /// Connections this thread serves now.
    load: Arc<AtomicUsize>,
    /// Fires once the thread has stopped taking connections and drained (or given up on) them.
    drained: Option<oneshot::Receiver<()>>,
    thread: std::thread::JoinHandle<()>,
}

/// The serving threads, fed by one accept loop.
pub struct Workers {
    workers: Vec<Worker>,
    /// Cancelled when the threads may end their event loops (everything has been shut down).
    finish: CancellationToken,
}

impl Workers {
    pub fn start(n: usize, shared: Shared, drain_timeout: Duration) -> std::io::Result<Workers> {
        let finish = CancellationToken::new();
        let mut workers = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let (conns, rx) = mpsc::unbounded_channel();
            let (drained_tx, drained) = oneshot::channel();
            let load = Arc::new(AtomicUsize::new(0));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (shared, finish, thread_load) = (shared.clone(), finish.clone(), load.clone());
            let thread = std::thread::Builder::new()
                .name(format!("corral-serve-{i}"))
                .spawn(move || {
                    let serving = serve(rx, shared, thread_load, drain_timeout, finish.clone());
                    runtime.block_on(serving);
                    let _ = drained_tx.send(());
                    runtime.block_on(finish.cancelled());
                })?;
            workers.push(Worker {
                conns: Some(conns),
                load,
                drained: Some(drained),
                thread,
            });
        }
        Ok(Workers { workers, finish })
    }

    /// Hands a connection to the thread serving the fewest.
    pub fn dispatch(
        &self,
        stream: tokio::net::TcpStream,
        remote: SocketAddr,
        open: Open,
        admitted: Admitted,
    ) {
        let Ok(stream) = stream.into_std() else {
            return;
        };
        let Some((worker, conns)) = self
            .workers
            .iter()
            .filter_map(|w| Some((w, w.conns.as_ref()?)))
            .min_by_key(|(w, _)| w.load.load(Ordering::Relaxed))
        else {
            return;
        };
        worker.load.fetch_add(1, Ordering::Relaxed);
        let handed = conns.send(Accepted {
            stream,
            remote,
            open,
            admitted,
        });
        if handed.is_err() {
            // the thread is gone; the connection is dropped (closed) with the message
            worker.load.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Stops taking connections and lets the open ones finish; returns once all threads have
    /// drained (each gives up after the drain timeout).
    pub async fn drain(&mut self) {
        for w in &mut self.workers {
            // a closed channel ends the thread's loop of taking connections
            w.conns = None;
        }
        for w in &mut self.workers {
            if let Some(drained) = w.drained.take() {
                let _ = drained.await;
            }
        }
    }

    /// Ends the threads at once; connections still open (a drain cut short) are dropped.
    pub async fn stop(mut self) {
        self.finish.cancel();
        let threads: Vec<_> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(|w| w.thread)
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }

    pub fn open_connections(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.load.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for Workers {
    /// Threads never outlive their `Workers`, however the serving ends.
    fn drop(&mut self) {
        self.finish.cancel();
    }
}

/// One connection's service: the API of the config in force when each request arrives, inside the
/// connection's own bookkeeping (its requests in flight, the slow-body bounds, the idle limit of
/// a websocket tunnel).
fn connection_service(
    current: Arc<RwLock<Arc<App>>>,
    remote: SocketAddr,
    activity: Arc<Activity>,
    (body_limits, tunnel_idle): (BodyLimits, Duration),
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<InFlightBody>,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<http::Response<InFlightBody>, std::convert::Infallible>,
    > + Send,
> {
    let api = move |req: http::Request<BodyDeadline<hyper::body::Incoming>>| {
        let app = current.read().unwrap_or_else(|e| e.into_inner()).clone();
        // unboxed: the API's own future is small, its routes' work boxed within it
        async move { api::serve(&app, remote, req).await }
    };
    ConnectionService::new(api, activity, body_limits, tunnel_idle)
}

/// `conn` run to its end, then `held` let go. Not an `async` block: one keeps the connection
/// twice, as what it captured and as what it awaits, and a connection's task is its largest
/// allocation (about 1.8 KB of connection state).
fn holding<F: std::future::Future, H>(conn: F, held: H) -> impl std::future::Future<Output = ()> {
    conn.map(move |_| drop(held))
}

/// A connection counted in its serving thread's load, given back however the connection ends: a
/// panic in its task unwinds through this too, so the least-busy pick never drifts.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One serving thread's loop: serves each connection it is handed until the channel closes, then
/// drains them.
async fn serve(
    mut conns: mpsc::UnboundedReceiver<Accepted>,
    shared: Shared,
    load: Arc<AtomicUsize>,
    drain_timeout: Duration,
    finish: CancellationToken,
) {
    let serving = Serving::new(shared);
    let heartbeat = tokio::spawn(heartbeat());
    loop {
        let next = tokio::select! {
            next = conns.recv() => next,
            _ = finish.cancelled() => None,
        };
        let Some(accepted) = next else {
            break;
        };
        serving.start(accepted, Counted(load.clone()));
    }
    serving.drain(drain_timeout, &finish).await;
    heartbeat.abort();
}

/// The connections one serving thread serves: how each is set up, and the watch that lets the
/// open ones finish at shutdown.
struct Serving {
    current: Arc<RwLock<Arc<App>>>,
    settings: ServerSettings,
    builders: Arc<Builders>,
    body_limits: BodyLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Cancelled when the thread drains: each connection finishes what it has and closes.
    draining: CancellationToken,
    connections: TaskTracker,
}

impl Serving {
    fn new(shared: Shared) -> Self {
        let settings = shared.settings;
        Serving {
            current: shared.current,
            builders: Arc::new(Builders::new(&settings)),
            body_limits: BodyLimits {
                stall: settings.request_body,
                min_rate: settings.request_body_min_rate,
            },
            settings,
            tls: shared.tls,
            draining: CancellationToken::new(),
            connections: TaskTracker::new(),
        }
    }

    /// Serves one connection on a task of its own, over TLS when the listener serves HTTPS: the
    /// handshake is the connection's first step, under the same deadlines as the first bytes of a
    /// plain one (see `tls.rs`).
    fn start(&self, accepted: Accepted, counted: Counted) {
        let Accepted {
            stream,
            remote,
            open,
            admitted,
        } = accepted;
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let held = (open, admitted, counted);
        match &self.tls {
            None => self.serve(stream, remote, held),
            Some(tls) => self.serve(TlsStream::accept(tls, stream), remote, held),
        }
    }

    /// Serves `stream` under the write, send and idle deadlines; its admission, trim slot and
    /// count are held until it closes (a websocket tunnel on it included: the tunnel runs in the
    /// connection's task).
    fn serve<T>(&self, stream: T, remote: SocketAddr, held: (Open, Admitted, Counted))
    where
        T: Peek + AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let settings = &self.settings;
        let activity = held.1.activity.clone();
        let service = connection_service(
            self.current.clone(),
            remote,
            activity.clone(),
            (self.body_limits, settings.idle),
        );
        let stream = WriteDeadline::new(stream, settings.write);
        let stream = IdleDeadline::new(
            stream,
            activity.clone(),
            settings.request_header,
            settings.idle,
        );
        let conn = ClientConnection::new(
            stream,
            service,
            self.builders.clone(),
            self.draining.clone(),
        )
        .with_tunnels(activity.clone());
        let conn = Polled::new(conn, activity.clone());
        let conn = SendDeadline::new(conn, activity, settings.write);
        self.connections.spawn(holding(conn, held));
    }

    /// Lets the open connections finish, for at most `drain_timeout`, or until `finish` (a second
    /// signal: stop at once).
    async fn drain(self, drain_timeout: Duration, finish: &CancellationToken) {
        self.draining.cancel();
        self.connections.close();
        tokio::select! {
            drained = tokio::time::timeout(drain_timeout, self.connections.wait()) => {
                if drained.is_err() {
                    tracing::warn!(
                        "in-flight requests did not finish within {}s",
                        drain_timeout.as_secs()
                    );
                }
            }
            // a second signal: stop at once
            _ = finish.cancelled() => {}
        }
    }
}

/// Once a second, closes this thread's idle upstream connections that expired or were closed by
/// their engine. Its timer also keeps the event loop from waking for the timers requests set (a
/// stream's idle limit, a body's deadline): a loop is woken when a timer is set that is due before
/// every armed one, which is every time when no other timer is armed.
async fn heartbeat() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        crate::proxy::upstream::sweep_this_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_connection_gives_its_count_back() {
        let load = Arc::new(AtomicUsize::new(1));
        let counted = Counted(load.clone());
        let task = tokio::spawn(async move {
            let _held = counted;
            panic!("a handler bug");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(load.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_connection_task_holds_its_connection_once() {
        let conn = std::future::ready([0u8; 2048]);
        let task = holding(conn, (Arc::new(1u64), 2u64));
        let size = std::mem::size_of_val(&task);
        assert!(size < 2048 + 64, "the task takes {size} bytes");
    }

    #[tokio::test]
    async fn what_a_connection_holds_goes_after_the_connection() {
        let held = Arc::new(());
        let conn = std::future::ready(());
        let task = tokio::spawn(holding(conn, held.clone()));
        task.await.unwrap();
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
