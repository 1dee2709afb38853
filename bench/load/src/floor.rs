//! The floor: the least a proxy built on hyper and tokio does, measured beside corral and nginx.
//!
//! One thread accepts and hands each connection to one of N serving threads (one per core, each a
//! current-thread runtime; `FLOOR_THREADS` sets N, as `CORRAL_THREADS` does for corral), as corral
//! does. Each client connection gets its own upstream
//! connection, opened on its first request and kept; requests and answers pass through untouched
//! (hyper's HTTP/1 server, hyper's HTTP/1 client, bodies streamed frame by frame). No routing, no
//! metrics, no logging, no limits. What corral costs beyond this is corral's own; what this costs
//! beyond nginx is hyper's and tokio's.
//!
//! `FLOOR_CLIENT=minimal` swaps hyper's client for the least an HTTP/1 client can do for the
//! benchmark's small answers ([`minimal`]): the request written in one write, the answer's head
//! parsed by httparse and its `content-length` body read whole. It handles nothing else (no chunked
//! answers, no streamed bodies), so it bounds from below what any client written for the engine
//! link could cost, and so how much such a client could save.

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
            let minimal = std::env::var("FLOOR_CLIENT").is_ok_and(|c| c == "minimal");
            while let Some((conn, upstream)) = rx.recv().await {
                if minimal {
                    tokio::spawn(minimal::serve(conn, upstream));
                } else {
                    tokio::spawn(serve(conn, upstream));
                }
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

/// The floor with the least client there can be; see the module's doc.
mod minimal {
    use std::io::{Error, ErrorKind};
    use std::net::SocketAddr;
    use std::sync::Arc;

    use bytes::{Bytes, BytesMut};
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::Mutex;

    /// One client connection, with its one upstream connection.
    pub async fn serve(conn: std::net::TcpStream, upstream: SocketAddr) {
        let _ = conn.set_nonblocking(true);
        let Ok(conn) = TcpStream::from_std(conn) else {
            return;
        };
        let link: Arc<Mutex<Link>> = Arc::new(Mutex::new(Link {
            stream: None,
            buf: BytesMut::with_capacity(8192),
        }));
        let service = service_fn(move |req: hyper::Request<Incoming>| {
            let link = link.clone();
            async move { link.lock().await.exchange(upstream, req).await }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(conn), service)
            .await;
    }

    struct Link {
        stream: Option<TcpStream>,
        buf: BytesMut,
    }

    impl Link {
        async fn exchange(
            &mut self,
            upstream: SocketAddr,
            req: hyper::Request<Incoming>,
        ) -> std::io::Result<hyper::Response<Full<Bytes>>> {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.map_err(Error::other)?.to_bytes();
            let mut out = Vec::with_capacity(512 + body.len());
            out.extend_from_slice(parts.method.as_str().as_bytes());
            out.push(b' ');
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            out.extend_from_slice(target.as_bytes());
            out.extend_from_slice(b" HTTP/1.1\r\n");
            for (name, value) in &parts.headers {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&body);
            if self.stream.is_none() {
                let stream = TcpStream::connect(upstream).await?;
                stream.set_nodelay(true)?;
                self.stream = Some(stream);
                self.buf.clear();
            }
            let stream = self.stream.as_mut().expect("connected above");
            stream.write_all(&out).await?;
            loop {
                if let Some(response) = parse(&mut self.buf)? {
                    return Ok(response);
                }
                if stream.read_buf(&mut self.buf).await? == 0 {
                    self.stream = None;
                    return Err(ErrorKind::UnexpectedEof.into());
                }
            }
        }
    }

    /// The answer at the start of `buf` once all of it is there (taken out of `buf`).
    pub(super) fn parse(
        buf: &mut BytesMut,
    ) -> std::io::Result<Option<hyper::Response<Full<Bytes>>>> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut head = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head_len) = head.parse(buf).map_err(Error::other)? else {
            return Ok(None);
        };
        let mut response = hyper::Response::builder().status(head.code.unwrap_or(502));
        let mut length = 0;
        let map = response.headers_mut().expect("a valid status");
        for h in head.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(Error::other)?;
            let value = HeaderValue::from_bytes(h.value).map_err(Error::other)?;
            if name == CONTENT_LENGTH {
                length = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| Error::other("bad content-length"))?;
            }
            map.append(name, value);
        }
        if buf.len() < head_len + length {
            return Ok(None);
        }
        let body = buf.split_to(head_len + length).freeze().slice(head_len..);
        response
            .body(Full::new(body))
            .map(Some)
            .map_err(Error::other)
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use http_body_util::BodyExt;

    use super::minimal::parse;

    #[tokio::test]
    async fn the_least_client_takes_an_answer_once_all_of_it_is_there() {
        let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhelloHTTP/1.1";
        let mut buf = BytesMut::from(&answer[..answer.len() - 10]);
        assert!(
            parse(&mut buf).unwrap().is_none(),
            "the body is not all there"
        );
        buf.extend_from_slice(&answer[answer.len() - 10..]);
        let response = parse(&mut buf).unwrap().expect("a whole answer");
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-a"], "b");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert_eq!(&buf[..], b"HTTP/1.1", "the next answer's start stays");
    }
}
