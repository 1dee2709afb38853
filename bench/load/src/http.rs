//! Closed-loop HTTP/1.1 load: N keep-alive connections (hyper's client connection API), each sending
//! its next request as soon as the previous answer is read, for a fixed request count or duration.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy)]
pub enum Limit {
    Requests(u64),
    Duration(Duration),
}

#[derive(Debug, Clone)]
pub struct Load {
    pub addr: SocketAddr,
    pub method: hyper::Method,
    pub path: String,
    pub body: Bytes,
    pub content_type: String,
    pub concurrency: usize,
    pub limit: Limit,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub ok: u64,
    pub errors: u64,
    pub reconnects: u64,
    pub elapsed: Duration,
    /// Per-request latency of every successful request, µs.
    pub latency_us: Vec<f64>,
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
}

/// Opens one keep-alive HTTP/1.1 connection; its driver runs as a task.
pub async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

pub fn request(load: &Load) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(load.method.clone())
        .uri(load.path.as_str())
        .header(header::HOST, load.addr.to_string())
        .header(header::USER_AGENT, "corral-load");
    if !load.body.is_empty() || load.method == hyper::Method::POST {
        b = b
            .header(header::CONTENT_TYPE, load.content_type.as_str())
            .header(header::CONTENT_LENGTH, load.body.len());
    }
    b.body(Full::new(load.body.clone())).expect("valid request")
}

/// One request on an existing connection; the latency covers sending it and reading the whole answer.
pub async fn once(
    sender: &mut SendRequest<Full<Bytes>>,
    load: &Load,
) -> Result<(u16, Bytes, Duration), BoxError> {
    sender.ready().await?;
    let req = request(load);
    let t = Instant::now();
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body, t.elapsed()))
}

/// Runs the load; connections are opened before the clock starts.
pub async fn run(load: &Load) -> Result<Outcome, BoxError> {
    let mut senders = Vec::with_capacity(load.concurrency);
    for _ in 0..load.concurrency {
        senders.push(connect(load.addr).await?);
    }
    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = match load.limit {
        Limit::Duration(d) => Some(start + d),
        Limit::Requests(_) => None,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for mut sender in senders {
        let load = load.clone();
        let issued = issued.clone();
        tasks.spawn(async move {
            let mut out = Outcome::default();
            loop {
                match (load.limit, deadline) {
                    (Limit::Requests(n), _) => {
                        if issued.fetch_add(1, Ordering::Relaxed) >= n {
                            break;
                        }
                    }
                    (_, Some(d)) => {
                        if Instant::now() >= d {
                            break;
                        }
                    }
                    _ => unreachable!(),
                }
                match once(&mut sender, &load).await {
                    Ok((200, _, lat)) => {
                        out.ok += 1;
                        out.latency_us.push(lat.as_secs_f64() * 1e6);
                    }
                    Ok((status, body, _)) => {
                        out.errors += 1;
                        out.first_error.get_or_insert_with(|| {
                            format!(
                                "status {status}: {}",
                                String::from_utf8_lossy(&body[..body.len().min(200)])
                            )
                        });
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert_with(|| e.to_string());
                        // The connection is gone (or the server closed it): open another.
                        out.reconnects += 1;
                        match connect(load.addr).await {
                            Ok(s) => sender = s,
                            Err(e) => {
                                out.first_error
                                    .get_or_insert_with(|| format!("reconnect: {e}"));
                                break;
                            }
                        }
                    }
                }
            }
            out
        });
    }
    let mut total = Outcome::default();
    while let Some(r) = tasks.join_next().await {
        let o = r?;
        total.ok += o.ok;
        total.errors += o.errors;
        total.reconnects += o.reconnects;
        total.latency_us.extend(o.latency_us);
        if total.first_error.is_none() {
            total.first_error = o.first_error;
        }
    }
    total.elapsed = start.elapsed();
    Ok(total)
}
