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

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::api::{self, App};
use crate::stall::WriteDeadline;
use crate::trim::Open;

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
    pub header_read_timeout: Duration,
    pub client_write_timeout: Duration,
}

struct Accepted {
    stream: std::net::TcpStream,
    remote: SocketAddr,
    open: Open,
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
    pub fn dispatch(&self, stream: tokio::net::TcpStream, remote: SocketAddr, open: Open) {
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

fn connection_builder(header_read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(64 * 1024)
        .max_headers(100);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(100)
        .max_header_list_size(64 * 1024);
    builder
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
    let builder = connection_builder(shared.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let heartbeat = tokio::spawn(heartbeat());
    loop {
        let next = tokio::select! {
            next = conns.recv() => next,
            _ = finish.cancelled() => None,
        };
        let Some(Accepted {
            stream,
            remote,
            open,
        }) = next
        else {
            break;
        };
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
            load.fetch_sub(1, Ordering::Relaxed);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let current = shared.current.clone();
        let service = service_fn(move |req| {
            let app = current.read().unwrap_or_else(|e| e.into_inner()).clone();
            // boxed: the request future is large, and unboxed it would size every connection's task
            Box::pin(async move {
                Ok::<_, std::convert::Infallible>(api::handle(app, req, remote).await)
            })
        });
        let stream = WriteDeadline::new(stream, shared.client_write_timeout);
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        let load = load.clone();
        tokio::spawn(async move {
            let _ = conn.await;
            load.fetch_sub(1, Ordering::Relaxed);
            drop(open);
        });
    }
    tokio::select! {
        drained = tokio::time::timeout(drain_timeout, graceful.shutdown()) => {
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
    heartbeat.abort();
}

/// Once a second, closes this thread's idle upstream connections that expired or were closed by
/// their engine. Its timer also keeps the event loop from waking for each request's header-read
/// timer: a loop is woken when a timer is set that is due before every armed one, which is every
/// time when no other timer is armed.
async fn heartbeat() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        crate::upstream::sweep_this_thread();
    }
}
