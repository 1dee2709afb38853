//! What corral makes of an engine's unusual answers, byte for byte on the wire: an engine
//! written by hand here answers each request with a scripted answer and keeps the request's head.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::*;

/// An engine on loopback that reads each request's head (and no body), answers `answer` as
/// written and closes the connection.
struct RawEngine {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RawEngine {
    async fn start(answer: &'static str) -> RawEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let head = read_head(&mut sock).await;
                seen.lock().unwrap().push(head);
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            }
        });
        RawEngine { port, heads }
    }

    /// corral's config for model `m` served by this engine.
    fn config(&self) -> String {
        format!(
            "models:\n  m:\n    cmd: sleep 600\n    checkEndpoint: none\n    proxy: http://127.0.0.1:{}\n    env: [\"${{env.MARKER}}\"]\n",
            self.port
        )
    }

    fn last_head(&self) -> String {
        self.heads
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

async fn read_head(sock: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if sock.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends `request` on `sock` and reads one answer, framed by its length or chunked.
async fn exchange(sock: &mut TcpStream, request: &str) -> (String, String) {
    sock.write_all(request.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(sock))
        .await
        .expect("an answer's head");
    let lower = head.to_ascii_lowercase();
    let length = lower.lines().find_map(|l| {
        let value = l.strip_prefix("content-length:")?;
        Some(value.trim().parse::<usize>().unwrap())
    });
    let body = match length {
        Some(length) => read_exactly(sock, length).await,
        None if lower.contains("transfer-encoding: chunked") => read_chunked(sock).await,
        None => panic!("an answer with no framing: {head}"),
    };
    (head, String::from_utf8(body).unwrap())
}

async fn read_exactly(sock: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut body = vec![0; n];
    sock.read_exact(&mut body).await.unwrap();
    body
}

async fn read_chunked(sock: &mut TcpStream) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            line.extend(read_exactly(sock, 1).await);
        }
        let size = std::str::from_utf8(&line).unwrap().trim();
        let size = usize::from_str_radix(size, 16).unwrap();
        let chunk = read_exactly(sock, size + 2).await;
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

fn chat_request(host: &str) -> String {
    let body = r#"{"model":"m","messages":[]}"#;
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// An engine that answers in HTTP/1.0 (its body ending with its connection) is answered on to an
/// HTTP/1.1 client in HTTP/1.1, framed (chunked), and the client's connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_answer_goes_on_in_http_1_1() {
    let engine =
        RawEngine::start("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"ok\":1}")
            .await;
    let h = Harness::start(&engine.config()).await;
    let host = h.url.trim_start_matches("http://").to_string();
    let mut sock = TcpStream::connect(&host).await.unwrap();
    for _ in 0..2 {
        let (head, body) = exchange(&mut sock, &chat_request(&host)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, "{\"ok\":1}");
    }
    h.stop().await;
}

/// An answer framed both ways (chunked, and a `content-length` that is not its body's) reaches
/// the client whole: the encoding frames it, as RFC 9112 says, and the stale length is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_framed_both_ways_goes_on_whole() {
    let engine = RawEngine::start(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\nconnection: close\r\n\r\n10\r\n{\"ok\":\"chunked\"}\r\n0\r\n\r\n",
    )
    .await;
    let h = Harness::start(&engine.config()).await;
    let resp = post_json(&format!("{}/v1/chat/completions", h.url), &chat("m")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "{\"ok\":\"chunked\"}");
    h.stop().await;
}

/// A GET for a model that comes with a body: the body is not read, so its length does not go
/// on either (the engine would wait for bytes that never come).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_body_is_not_announced_upstream() {
    let engine =
        RawEngine::start("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            .await;
    let h = Harness::start(&engine.config()).await;
    let host = h.url.trim_start_matches("http://").to_string();
    let mut sock = TcpStream::connect(&host).await.unwrap();
    let request =
        format!("GET /props?model=m HTTP/1.1\r\nhost: {host}\r\ncontent-length: 2\r\n\r\n{{}}");
    let (head, body) = exchange(&mut sock, &request).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "{}");
    let upstream = engine.last_head();
    assert!(upstream.starts_with("GET /props"), "{upstream}");
    assert!(
        !upstream.to_ascii_lowercase().contains("content-length"),
        "{upstream}"
    );
    h.stop().await;
}
