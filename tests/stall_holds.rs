//! Clients that hold an engine without taking anything: an HTTP/2 stream granted no flow-control
//! window while the connection answers pings, and websocket tunnels, which must count against
//! `maxConnections` and close when nothing passes. Limits are set to a second or two, and every
//! wait is bounded well past them.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn addr(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// The instance of `model` as `/running` lists it.
async fn instance(h: &Harness, model: &str) -> Value {
    let list = get(&format!("{}/running", h.url)).await.json();
    list["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == model)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until `model`'s instance has `n` requests in flight.
async fn wait_in_flight(h: &Harness, model: &str, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = instance(h, model).await;
        if now["inFlight"] == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{model} has {} in flight, not {n}",
            now["inFlight"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP/2 connection to corral, its streams granted `window` bytes (`Some(0)`: the server can
/// send heads but not a byte of any body). Its pings are answered by the connection's task.
async fn h2_client(
    url: &str,
    window: Option<u32>,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(addr(url)).await.unwrap());
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(window)
            .handshake(io)
            .await
            .unwrap();
    (send, tokio::spawn(conn))
}

fn streaming_chat(url: &str, chunks: u64, interval_ms: u64) -> http::Request<Full<Bytes>> {
    let body = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": chunks, "interval_ms": interval_ms}});
    http::Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A client that grants its HTTP/2 stream no window (and answers the keep-alive pings) cannot
/// hold the engine: its connection is closed after the write limit, and the model has no
/// request in flight again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_given_no_window_lets_its_engine_go() {
    let yaml = format!(
        "clientTimeouts: {{write: 1, http2PingInterval: 1, http2PingTimeout: 5}}\nmodels:\n{}",
        fake_model("a", "", "")
    );
    let h = Harness::start(&yaml).await;
    // loaded first, so the bounds below are not spent on the start
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("a"))
            .await
            .status,
        200
    );
    let (mut send, conn) = h2_client(&h.url, Some(0)).await;
    // a stream of about a minute, unless it is cut
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        send.send_request(streaming_chat(&h.url, 3000, 20)),
    )
    .await
    .expect("the head arrives")
    .unwrap();
    assert_eq!(resp.status(), 200);
    let held_from = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(closed.is_ok(), "the connection is still open");
    wait_in_flight(&h, "a", 0, Duration::from_secs(5)).await;
    assert!(
        held_from.elapsed() >= Duration::from_millis(500),
        "closed at once: {:?}",
        held_from.elapsed()
    );
    drop(resp);
    h.stop().await;
}

/// A client that takes its stream, over HTTP/2, keeps it past the write limit while the engine
/// is slow between tokens: waiting for the engine is not a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_waiting_for_its_engine_is_not_cut() {
    let yaml = format!(
        "clientTimeouts: {{write: 1}}\nmodels:\n{}",
        fake_model("a", "", "")
    );
    let h = Harness::start(&yaml).await;
    let (mut send, _conn) = h2_client(&h.url, None).await;
    let resp = tokio::time::timeout(
        Duration::from_secs(30),
        send.send_request(streaming_chat(&h.url, 2, 2500)),
    )
    .await
    .expect("the head arrives")
    .unwrap();
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .expect("the stream ends")
        .expect("the stream is whole")
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("[DONE]"),
        "the stream was cut"
    );
    h.stop().await;
}

/// An engine that answers every upgrade with 101 and then echoes what it reads; tells on
/// `closed` each time one of its tunnels is closed from corral's side.
async fn echo_engine() -> (u16, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let engine = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = engine.local_addr().unwrap().port();
    let (closed_tx, closed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = engine.accept().await {
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                if read_head(&mut sock).await.is_none() {
                    return;
                }
                let switched =
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
                if sock.write_all(switched).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 256];
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if sock.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = closed_tx.send(());
            });
        }
    });
    (port, closed)
}

/// Reads an HTTP head byte by byte; `None` if the socket closes first.
async fn read_head(sock: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match sock.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn ws_config(port: u16, server: &str) -> String {
    format!("{server}\nmodels:\n  ws:\n    cmd: sleep 60\n    checkEndpoint: none\n    proxy: http://127.0.0.1:{port}\n    env: [\"${{env.MARKER}}\"]\n")
}

/// A websocket through `/upstream/ws/`, echoed once to show it is joined.
async fn open_tunnel(url: &str) -> TcpStream {
    let mut sock = TcpStream::connect(addr(url)).await.unwrap();
    sock.write_all(b"GET /upstream/ws/socket HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut sock))
        .await
        .expect("the upgrade is answered")
        .expect("the connection stays open");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    echo(&mut sock, b"ping").await;
    sock
}

async fn echo(sock: &mut TcpStream, what: &[u8]) {
    sock.write_all(what).await.unwrap();
    let mut back = vec![0u8; what.len()];
    tokio::time::timeout(Duration::from_secs(5), sock.read_exact(&mut back))
        .await
        .expect("echoed in time")
        .expect("echoed");
    assert_eq!(back, what);
}

/// True if corral answers `/health` on a new connection within a few seconds.
async fn health_answers(url: &str) -> bool {
    let Ok(mut sock) = TcpStream::connect(addr(url)).await else {
        return false;
    };
    let _ = sock
        .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), sock.read_to_end(&mut answer)).await;
    read.is_ok() && answer.starts_with(b"HTTP/1.1 200")
}

/// Websocket tunnels count against `maxConnections` for as long as they live: with the cap taken
/// by tunnels (never idle), a new connection is refused; once one tunnel closes, there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_tunnels_count_against_the_connection_cap() {
    let (port, _closed) = echo_engine().await;
    let h = Harness::start(&ws_config(port, "maxConnections: 2")).await;
    let mut first = open_tunnel(&h.url).await;
    let mut second = open_tunnel(&h.url).await;
    assert!(
        !health_answers(&h.url).await,
        "a third connection was served past the cap of two tunnels"
    );
    echo(&mut first, b"still here").await;
    echo(&mut second, b"still here").await;
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !health_answers(&h.url).await {
        assert!(Instant::now() < deadline, "no room after a tunnel closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(second);
    h.stop().await;
}

/// A tunnel that carries nothing either way for the client idle timeout is closed, both ways,
/// and its model has no request in flight again; one that keeps carrying stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_tunnel_is_closed() {
    let (port, mut closed) = echo_engine().await;
    let h = Harness::start(&ws_config(port, "clientTimeouts: {idle: 1}")).await;
    let mut busy = open_tunnel(&h.url).await;
    let mut quiet = open_tunnel(&h.url).await;
    let quiet_from = Instant::now();
    let quiet = tokio::spawn(async move {
        let mut sink = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), quiet.read_to_end(&mut sink));
        ended.await.ok().map(|_| quiet_from.elapsed())
    });
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        echo(&mut busy, b"tick").await;
    }
    let took = quiet.await.unwrap();
    assert!(
        took.is_some_and(|t| t >= Duration::from_millis(900)),
        "the idle tunnel closed at {took:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("the engine's side is closed too");
    echo(&mut busy, b"still open").await;
    wait_in_flight(&h, "ws", 1, Duration::from_secs(5)).await;
    drop(busy);
    h.stop().await;
}
