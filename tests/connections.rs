//! Client connections that hold resources without making progress: silent sockets, half an
//! HTTP/2 preface, idle kept-alive connections, trickled bodies, floods past the file-descriptor
//! limit. Timeouts are set to a second so nothing waits for the 30 s defaults.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(server: &str) -> String {
    format!("{server}\nmodels:\n{}", fake_model("a", "", ""))
}

fn addr(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// How long until the server closes `sock` (EOF or reset), reading and discarding what it
/// sends; `None` if it is still open after `within`.
async fn closed_after(sock: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut sink = Vec::new();
    tokio::time::timeout(within, sock.read_to_end(&mut sink))
        .await
        .ok()
        .map(|_| started.elapsed())
}

/// A socket that sends nothing is closed at `requestHeader` (the wait for the first bytes that
/// tell its protocol has no timer of hyper's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_is_closed() {
    let h = Harness::start(&config("clientTimeouts: {requestHeader: 1}")).await;
    let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
    let closed = closed_after(&mut sock, Duration::from_secs(5)).await;
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(3)),
        "{closed:?}"
    );
    h.stop().await;
}

/// A socket that has not said its protocol does not hold up a shutdown: it is closed at once,
/// not at `requestHeader` (here longer than the whole bound the test gives the stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_does_not_hold_up_a_shutdown() {
    let h = Harness::start(&config("clientTimeouts: {requestHeader: 60}")).await;
    let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
    // a beginning of the preface: the protocol is still unknown
    sock.write_all(b"PRI").await.unwrap();
    let started = Instant::now();
    h.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let closed = closed_after(&mut sock, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "the socket is still open");
}

/// Half an HTTP/2 preface is closed at `requestHeader` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_h2_preface_is_closed() {
    let h = Harness::start(&config("clientTimeouts: {requestHeader: 1}")).await;
    let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
    sock.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let closed = closed_after(&mut sock, Duration::from_secs(5)).await;
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(3)),
        "{closed:?}"
    );
    h.stop().await;
}

/// An HTTP/2 connection with no open stream is closed after `idle`, although the server's
/// keep-alive pings are answered all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_is_closed() {
    use http_body_util::{BodyExt, Empty};
    let h = Harness::start(&config(
        "clientTimeouts: {idle: 1, http2PingInterval: 1, http2PingTimeout: 5}",
    ))
    .await;
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(addr(&h.url)).await.unwrap());
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get(format!("{}/health", h.url))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    let idle_from = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "the idle connection is still open");
    let took = idle_from.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    h.stop().await;
}

/// On HTTP/1.1 the wait for the next request is a wait for its head, so a kept-alive connection
/// is closed at `requestHeader`; and at `idle` when that is shorter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_http1_connection_is_closed() {
    for (server, bound) in [
        (
            "clientTimeouts: {requestHeader: 1, idle: 60}",
            "requestHeader",
        ),
        ("clientTimeouts: {requestHeader: 30, idle: 1}", "idle"),
    ] {
        let h = Harness::start(&config(server)).await;
        let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
        sock.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0; 12];
        sock.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        let closed = closed_after(&mut sock, Duration::from_secs(5)).await;
        assert!(
            closed.is_some_and(|t| t < Duration::from_secs(3)),
            "{bound}: {closed:?}"
        );
        h.stop().await;
    }
}

/// A response that streams for longer than `idle` is not cut: its request is in flight until
/// its last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_response_is_not_idle() {
    let h = Harness::start(&config("clientTimeouts: {requestHeader: 1, idle: 1}")).await;
    let body = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": 25, "interval_ms": 100}});
    let (resp, frames) = stream_frames(&format!("{}/v1/chat/completions", h.url), &body).await;
    assert_eq!(resp.status, 200);
    assert!(
        frames_text(&frames).contains("[DONE]"),
        "the stream was cut"
    );
    h.stop().await;
}

/// A body trickled at 5 bytes/s (always progressing, never stalling) is answered 408 and the
/// connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_gets_408() {
    let h = Harness::start(&config(
        "clientTimeouts: {requestBody: 1, requestBodyMinRate: 100}",
    ))
    .await;
    let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
    sock.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n",
    )
    .await
    .unwrap();
    let (mut read, mut write) = sock.into_split();
    let trickle = tokio::spawn(async move {
        while write.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(6), read.read_to_end(&mut answer)).await;
    trickle.abort();
    assert!(read.is_ok(), "the connection is still open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(4));
    h.stop().await;
}

/// At `maxConnections`, idle connections are closed to make room: a flood of silent sockets
/// cannot lock out a real client, and the oldest silent socket is the one closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_idle_connections_make_room() {
    let h = Harness::start(&config("maxConnections: 5")).await;
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(TcpStream::connect(addr(&h.url)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let health = tokio::time::timeout(Duration::from_secs(3), get(&format!("{}/health", h.url)))
        .await
        .expect("/health answers at the cap");
    assert_eq!(health.status, 200);
    let closed = closed_after(&mut silent[0], Duration::from_secs(3)).await;
    assert!(closed.is_some(), "the oldest idle socket was closed");
    h.stop().await;
}

/// A shell wrapper that sets the open-file limits before running corral.
fn with_limits(ulimit: &str) -> [String; 3] {
    [
        "sh".into(),
        "-c".into(),
        format!("ulimit {ulimit} && exec \"$0\" \"$@\""),
    ]
}

fn spawn_with_limits(ulimit: &str) -> (process::Proc, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let yaml = format!("startPort: {}\n{}", free_port_range(4), config(""));
    std::fs::write(&path, yaml).unwrap();
    let wrapper = with_limits(ulimit);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let proc = process::spawn_corral_wrapped(&wrapper, dir, &path, state.path(), &[], &[]);
    (proc, state)
}

/// The (soft, hard) open-file limits of a process.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

/// corral raises its soft open-file limit to the hard limit at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_fd_limit_is_raised_to_the_hard_one() {
    let hard = open_file_limits(std::process::id()).1;
    if hard.parse::<u64>().is_ok_and(|h| h <= 256) {
        eprintln!("skipped: the hard open-file limit ({hard}) leaves nothing to raise");
        return;
    }
    let (proc, _state) = spawn_with_limits("-S -n 256");
    let (soft, hard_now) = open_file_limits(proc.child.id());
    assert_eq!(soft, hard_now);
    assert_eq!(hard_now, hard);
}

/// Under a 200-file limit it cannot raise, 250 silent sockets do not lock out `/health`: the
/// default cap keeps corral below EMFILE and closes idle sockets to make room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_sockets_under_a_low_fd_limit_leaves_health_answering() {
    let (proc, _state) = spawn_with_limits("-n 200");
    let mut silent = Vec::new();
    for _ in 0..250 {
        silent.push(TcpStream::connect(addr(&proc.url)).await.unwrap());
    }
    for _ in 0..3 {
        let health =
            tokio::time::timeout(Duration::from_secs(3), get(&format!("{}/health", proc.url)))
                .await
                .expect("/health answers during the flood");
        assert_eq!(health.status, 200);
    }
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// HTTP/2 rapid-reset and CONTINUATION floods leave corral up, answering, with bounded memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_floods_leave_corral_up_with_bounded_memory() {
    let Some(python) = python() else { return };
    let state = tempfile::tempdir().unwrap();
    let proc = process::spawn_corral(&config(""), state.path());
    assert_eq!(get(&format!("{}/health", proc.url)).await.status, 200);
    let before = rss_kib(proc.child.id());
    let (host, port) = addr(&proc.url).split_once(':').unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/h2_flood.py");
    for (mode, count) in [("rapid-reset", "20000"), ("continuation", "20000")] {
        let out = tokio::process::Command::new(&python)
            .args([script, host, port, mode, count])
            .output()
            .await
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        eprintln!("{report}");
        assert!(
            report["goaway"] == true || report["closed"] == true,
            "{mode}: the connection was not ended: {report}"
        );
        assert_eq!(get(&format!("{}/health", proc.url)).await.status, 200);
    }
    let after = rss_kib(proc.child.id());
    eprintln!("corral RSS: {before} KiB before the floods, {after} KiB after");
    assert!(after < before + 64 * 1024, "{before} KiB -> {after} KiB");
}
