//! The floor: the least a proxy built on hyper and tokio does, measured beside corral and nginx.
//!
//! One thread accepts and hands each connection to one of N serving threads (one per core, each a
//! current-thread runtime; `FLOOR_THREADS` sets N, as `CORRAL_THREADS` does for corral), as corral
//! does. Each client connection gets its own upstream
//! connection, opened on its first request and kept; requests and answers pass through untouched
//! (hyper's HTTP/1 server, hyper's HTTP/1 client, bodies streamed frame by frame). No routing, no
//! metrics, no logging, no limits. What corral costs beyond this is corral's own; what this costs
//! beyond nginx is hyper's and tokio's.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, Mutex};

/// Serves `routes` (listen address to upstream address) until the process is killed.
pub fn run(routes: Vec<(SocketAddr, SocketAddr)>) -> Result<(), String> {
    let threads = std::env::var("FLOOR_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let workers: Vec<mpsc::UnboundedSender<(std::net::TcpStream, SocketAddr)>> =
        (0..threads).map(|_| serving_thread()).collect();
    let workers = Arc::new(workers);
    let mut acceptors = Vec::new();
    for (listen, upstream) in routes {
        let listener =
            TcpListener::bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let workers = workers.clone();
        acceptors.push(std::thread::spawn(move || {
            for (n, conn) in listener.incoming().flatten().enumerate() {
                let _ = conn.set_nodelay(true);
                let _ = workers[n % workers.len()].send((conn, upstream));
            }
        }));
    }
    for a in acceptors {
        let _ = a.join();
    }
    Ok(())
}

fn serving_thread() -> mpsc::UnboundedSender<(std::net::TcpStream, SocketAddr)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(std::net::TcpStream, SocketAddr)>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async move {
            while let Some((conn, upstream)) = rx.recv().await {
                tokio::spawn(serve(conn, upstream));
            }
        });
    });
    tx
}

/// One client connection, with its one upstream connection.
async fn serve(conn: std::net::TcpStream, upstream: SocketAddr) {
    let _ = conn.set_nonblocking(true);
    let Ok(conn) = tokio::net::TcpStream::from_std(conn) else {
        return;
    };
    let sender: Arc<Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let sender = sender.clone();
        async move { forward(&sender, upstream, req).await }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(conn), service)
        .await;
}

async fn forward(
    sender: &Mutex<Option<SendRequest<Incoming>>>,
    upstream: SocketAddr,
    req: hyper::Request<Incoming>,
) -> std::io::Result<hyper::Response<Incoming>> {
    let mut sender = sender.lock().await;
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        let stream = tokio::net::TcpStream::connect(upstream).await?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        *sender = Some(send);
    }
    let send = sender.as_mut().expect("connected above");
    send.ready().await.map_err(std::io::Error::other)?;
    send.send_request(req).await.map_err(std::io::Error::other)
}
