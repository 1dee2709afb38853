//! Routing and forwarding: how the model is found, what reaches the engine, how answers stream back.

mod support;

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};
use support::*;

fn one_model(extra: &str) -> String {
    format!("models:\n{}", fake_model("a", "", extra))
}

/// Unknown models and requests without a model get llama-swap's 404 envelope; nothing is spawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_missing_model_is_404_with_the_envelope() {
    let h = Harness::start(&one_model("")).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for model in [
        "nope",
        "../../etc/passwd",
        "$(touch /tmp/corral-pwn)",
        "a;rm -rf /",
    ] {
        let resp = post_json(&url, &chat(model)).await;
        assert_eq!(resp.status, 404);
        assert_eq!(
            resp.json(),
            json!({"src": "corral", "error": {"message": "no router for requested model", "type": "invalid_request_error", "param": null, "code": "not_found"}})
        );
    }
    let missing = post_json(&url, &json!({"messages": []})).await;
    assert_eq!(
        (missing.status, missing.json()["error"]["message"].as_str()),
        (404, Some("no model id could be identified"))
    );
    let plain = request(
        "POST",
        &url,
        &[
            ("content-type", "application/json"),
            ("accept", "text/plain"),
        ],
        r#"{"model":"x"}"#,
    )
    .await;
    assert_eq!(plain.text(), "corral: no router for requested model");
    assert!(!std::path::Path::new("/tmp/corral-pwn").exists());
    assert_eq!(h.count_events("a", "spawned"), 0);
    let other = get(&format!("{}/no/such/route", h.url)).await;
    assert_eq!(other.status, 404);
    h.stop().await;
}

/// A known path asked with a method it does not take is 405 with the methods it does take in
/// `Allow`, as llama-swap's mux answers; an unknown path stays 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_405_with_the_methods_allowed() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", ""))).await;
    for (method, path, allowed) in [
        ("POST", "/running", "GET, HEAD"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/api/inflight/x/cancel", "POST"),
        ("DELETE", "/props", "GET, HEAD"),
    ] {
        let r = request(method, &format!("{}{path}", h.url), &[], Bytes::new()).await;
        assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
        assert_eq!(r.header("allow"), Some(allowed), "{method} {path}");
    }
    let r = request(
        "PUT",
        &format!("{}/no/such/route", h.url),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(h.count_events("a", "spawned"), 0);
    h.stop().await;
}

fn multipart(boundary: &str, model: &str, file: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes());
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n--{boundary}--\r\n").as_bytes());
    body
}

/// A multipart upload is routed by its `model` field (even after the file) and reaches the engine byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_is_routed_by_its_model_field_and_the_file_is_exact() {
    let h = Harness::start(&one_model("aliases: [whisper]")).await;
    let file: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let body = multipart("corralBoundary42", "whisper", &file);
    let resp = request(
        "POST",
        &format!("{}/v1/audio/transcriptions", h.url),
        &[(
            "content-type",
            "multipart/form-data; boundary=corralBoundary42",
        )],
        body,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json();
    assert_eq!(v["file_bytes"], file.len());
    assert_eq!(v["file_sha256"], hex(&Sha256::digest(&file)));
    assert_eq!(v["model"], "whisper");
    h.stop().await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `useModelName` rewrites the model sent upstream, in JSON and multipart bodies alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_model_name_rewrites_json_and_multipart() {
    let h = Harness::start(&one_model("useModelName: upstream-name")).await;
    let resp = post_json(
        &format!("{}/v1/chat/completions", h.url),
        &json!({"model": "a", "temperature": 0.5, "messages": []}),
    )
    .await;
    let seen = &resp.json()["fakellm"]["request"];
    assert_eq!(seen["model"], "upstream-name");
    assert_eq!(seen["temperature"], 0.5, "other fields are untouched");
    let file = b"RIFF....WAVEfmt ".to_vec();
    let body = multipart("b0undary", "a", &file);
    let resp = request(
        "POST",
        &format!("{}/v1/audio/transcriptions", h.url),
        &[("content-type", "multipart/form-data; boundary=b0undary")],
        body,
    )
    .await;
    assert_eq!(resp.json()["model"], "upstream-name");
    assert_eq!(resp.json()["file_sha256"], hex(&Sha256::digest(&file)));
    h.stop().await;
}

/// `/upstream/<model>` redirects to the slash form; `/upstream/<model>/<path>` passes through with the
/// rest of the path exactly as sent, choosing the longest model id that prefixes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_passthrough_and_redirect() {
    let yaml = format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [org/m, org]}}\n",
        fake_model("org/m", "", ""),
        fake_model("org", "", "")
    );
    let h = Harness::start(&yaml).await;
    let redirect = get(&format!("{}/upstream/org/m?x=1", h.url)).await;
    assert_eq!(redirect.status, 301);
    assert_eq!(redirect.header("location"), Some("/upstream/org/m/?x=1"));
    let post = post(&format!("{}/upstream/org/m", h.url)).await;
    assert_eq!(post.status, 308);

    let resp = request(
        "PUT",
        &format!("{}/upstream/org/m/some%2Fpath/x?q=a%20b", h.url),
        &[],
        "payload",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let echo = resp.json();
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["path"], "/some%2Fpath/x");
    assert_eq!(echo["query"], "q=a%20b");
    assert_eq!(echo["body_bytes"], 7);
    let slots = get(&format!("{}/upstream/org/slots", h.url)).await;
    assert!(
        slots.json().is_array(),
        "org (not org/m) answered /slots: {}",
        slots.text()
    );
    assert_eq!(
        get(&format!("{}/upstream/unknown/x", h.url)).await.status,
        404
    );
    h.stop().await;
}

/// With apiKeys, every route but /health needs a key, given as Bearer, x-api-key or Basic password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_everything_but_health() {
    let h = Harness::start(&format!("apiKeys: [k-123]\n{}", one_model(""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = chat("a").to_string();
    let denied = request(
        "POST",
        &url,
        &[("content-type", "application/json")],
        body.clone(),
    )
    .await;
    assert_eq!(denied.status, 401);
    assert_eq!(
        denied.header("www-authenticate"),
        Some("Bearer realm=\"corral\"")
    );
    assert_eq!(denied.json()["error"]["type"], "authentication_error");
    let wrong = request(
        "POST",
        &url,
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer k-124"),
        ],
        body.clone(),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(get(&format!("{}/v1/models", h.url)).await.status, 401);
    assert_eq!(get(&format!("{}/running", h.url)).await.status, 401);
    assert_eq!(get(&format!("{}/health", h.url)).await.status, 200);
    use base64::Engine;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("user:k-123")
    );
    for (name, value) in [
        ("authorization", "Bearer k-123"),
        ("x-api-key", "k-123"),
        ("authorization", basic.as_str()),
    ] {
        let ok = request(
            "POST",
            &url,
            &[("content-type", "application/json"), (name, value)],
            body.clone(),
        )
        .await;
        assert_eq!(ok.status, 200, "{name}");
    }
    h.stop().await;
}

/// SSE chunks reach the client one by one, as the engine writes them, with the no-buffering header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_chunks_arrive_one_by_one() {
    let h = Harness::start(&one_model("")).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200); // warm up the model
    let body = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 5, "interval_ms": 200}});
    let (resp, frames) = stream_frames(&url, &body).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    assert_eq!(resp.header("x-accel-buffering"), Some("no"));
    assert!(resp.header("content-length").is_none());
    let needle = br#""content":"tok"#;
    let tokens: Vec<_> = frames
        .iter()
        .filter(|(_, f)| f.windows(needle.len()).any(|w| w == needle))
        .collect();
    assert_eq!(tokens.len(), 5, "each token chunk is its own frame");
    let first = tokens[0].0;
    let last = tokens[4].0;
    assert!(
        last - first >= Duration::from_millis(700),
        "chunks spread over time, not buffered: {first:?}..{last:?}"
    );
    h.stop().await;
}

/// A client that goes away mid-stream closes the upstream request within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_reaches_the_engine() {
    let h = Harness::start(&one_model("")).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    let body = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 100, "interval_ms": 100}});
    let stream = tokio::spawn(async move { stream_frames(&url, &body).await });
    eventually(Duration::from_secs(15), "stream started", || {
        h.count_requests("a", "/v1/chat/completions") >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream.abort();
    let gone = std::time::Instant::now();
    eventually(Duration::from_secs(1), "peer_closed at the engine", || {
        h.count_events("a", "peer_closed") == 1
    })
    .await;
    assert!(gone.elapsed() < Duration::from_secs(1));
    let running = get(&format!("{}/running", h.url)).await.json();
    assert_eq!(
        running["running"][0]["inFlight"], 0,
        "the lease was released"
    );
    h.stop().await;
}

/// Bodies over the limit get 413 before they are read; oversized headers, or more than 100 of
/// them, get 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limits_give_413_and_431() {
    let opts = corral::Options {
        limits: corral::Limits {
            body_bytes: 1024,
            ..Default::default()
        },
        ..Default::default()
    };
    let h = Harness::start_with(&one_model(""), opts).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let big = json!({"model": "a", "messages": [{"role": "user", "content": "x".repeat(4000)}]});
    let resp = post_json(&url, &big).await;
    assert_eq!(resp.status, 413);
    let huge_header = "h".repeat(70 * 1024);
    let resp = request(
        "GET",
        &format!("{}/v1/models", h.url),
        &[("x-big", huge_header.as_str())],
        Bytes::new(),
    )
    .await;
    assert_eq!(resp.status, 431);
    let names: Vec<String> = (0..101).map(|i| format!("x-h{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let models = format!("{}/v1/models", h.url);
    // the client adds a host header of its own
    let resp = request("GET", &models, &many[..98], Bytes::new()).await;
    assert_eq!(resp.status, 200, "99 headers are taken");
    let resp = request("GET", &models, &many, Bytes::new()).await;
    assert_eq!(resp.status, 431, "over 100 headers are refused");
    assert_eq!(h.count_events("a", "spawned"), 0);
    h.stop().await;
}

/// OPTIONS gets permissive CORS; versionless `/v/...` and query-routed GET routes reach the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_versionless_and_query_routes() {
    let h = Harness::start(&one_model("")).await;
    let pre = request(
        "OPTIONS",
        &format!("{}/v1/chat/completions", h.url),
        &[("access-control-request-headers", "x-custom, authorization")],
        "",
    )
    .await;
    assert_eq!(pre.status, 204);
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("x-custom, authorization")
    );
    let v = post_json(&format!("{}/v/chat/completions", h.url), &chat("a")).await;
    assert_eq!(
        v.json()["object"],
        "chat.completion",
        "forwarded as /chat/completions"
    );
    let props = get(&format!("{}/props?model=a", h.url)).await;
    assert_eq!(props.json()["total_slots"], 1);
    h.stop().await;
}

/// Embeddings and rerank are routed like chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_and_rerank_are_routed() {
    let h = Harness::start(&one_model("")).await;
    let e = post_json(
        &format!("{}/v1/embeddings", h.url),
        &json!({"model": "a", "input": ["x", "y"]}),
    )
    .await;
    assert_eq!(e.json()["data"].as_array().unwrap().len(), 2);
    let r = post_json(
        &format!("{}/v1/rerank", h.url),
        &json!({"model": "a", "query": "q", "documents": ["a", "b"]}),
    )
    .await;
    assert_eq!(r.json()["results"].as_array().unwrap().len(), 2);
    h.stop().await;
}

/// h2c with prior knowledge works alongside HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_is_served() {
    use http_body_util::{BodyExt, Full};
    let h = Harness::start(&one_model("")).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("{}/v1/chat/completions", h.url))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat("a").to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("chat.completion"));
    h.stop().await;
}

/// A client that never finishes its request head is cut off at the header-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let yaml = format!("clientTimeouts: {{requestHeader: 1}}\n{}", one_model(""));
    let h = Harness::start(&yaml).await;
    let mut sock = tokio::net::TcpStream::connect(h.url.trim_start_matches("http://"))
        .await
        .unwrap();
    sock.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was closed");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // other clients are unaffected
    assert_eq!(get(&format!("{}/health", h.url)).await.status, 200);
    h.stop().await;
}

/// Requests reuse idle upstream connections: twenty requests on one client connection open no
/// upstream connection beyond the first request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let h = Harness::start(&one_model("")).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let mut conn = BufReader::new(tokio::net::TcpStream::connect(&addr).await.unwrap());
    let body = chat("a").to_string();
    let mut send = async || {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        conn.get_mut()
            .write_all(format!("{head}{body}").as_bytes())
            .await
            .unwrap();
        let (mut status, mut length) = (String::new(), 0usize);
        conn.read_line(&mut status).await.unwrap();
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut answer = vec![0; length];
        conn.read_exact(&mut answer).await.unwrap();
        status
    };
    assert!(send().await.starts_with("HTTP/1.1 200"));
    let opened = h.count_events("a", "connection");
    for _ in 0..20 {
        assert!(send().await.starts_with("HTTP/1.1 200"));
    }
    assert_eq!(h.count_events("a", "connection"), opened);
    h.stop().await;
}

/// An engine that closes keep-alive connections while they sit idle costs no request: the next one
/// goes on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_the_engine_are_not_used() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "--idle-close-ms 50", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..5 {
        let resp = post_json(&url, &chat("a")).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        h.count_events("a", "connection") >= 5,
        "the engine closed them"
    );
    h.stop().await;
}

/// Open TCP connections (established or half-closed by the peer) to a loopback port.
fn connections_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields[2].rsplit(':').next().unwrap_or("");
            u16::from_str_radix(remote_port, 16) == Ok(port) && matches!(fields[3], "01" | "08")
        })
        .count()
}

/// When an engine stops, corral keeps no connection to it: the idle ones close within seconds
/// instead of lingering half-closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_lingers_to_a_stopped_engine() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", "ttl: 1"))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..4 {
        assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    }
    let port = h.events("a")[0]["port"].as_u64().unwrap() as u16;
    assert!(connections_to(port) > 0, "idle connections kept for reuse");
    tokio::time::timeout(Duration::from_secs(10), async {
        while !h.running().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("ttl stops the engine");
    eventually(
        Duration::from_secs(5),
        "no connection to the engine",
        || connections_to(port) == 0,
    )
    .await;
    h.stop().await;
}

/// An engine that dies mid-stream: the client gets the chunks sent so far, then an error event in
/// OpenAI's shape and a cleanly ended response, never `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_engine_breaks_off_ends_with_an_error_event() {
    let h = Harness::start(&one_model("")).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": 10, "interval_ms": 20, "abort_after_chunks": 3}});
    let (resp, frames) = stream_frames(&url, &body).await;
    assert_eq!(resp.status, 200);
    let text = frames_text(&frames);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data:"))
        .map(str::trim)
        .collect();
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error", "{text}");
    assert_eq!(
        last["error"]["code"], 502,
        "a number, as llama.cpp sends: {text}"
    );
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("ended early"));
    assert!(!text.contains("[DONE]"));
    assert!(
        text.contains("chat.completion.chunk"),
        "chunks before the break: {text}"
    );
    h.stop().await;
}

/// `timeouts.streamIdle`: a stream whose engine goes silent is ended with an error event after
/// that long, and its upstream connection closed; a slow but steady stream is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_ends_after_the_idle_limit() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "", "timeouts:\n  streamIdle: 1")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let steady = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": 6, "interval_ms": 400}});
    let (_, frames) = stream_frames(&url, &steady).await;
    assert!(
        frames_text(&frames).contains("[DONE]"),
        "2.4 s, but never 1 s silent"
    );

    let stalled = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": 10, "interval_ms": 10, "stall_after_chunks": 2}});
    let started = std::time::Instant::now();
    let (resp, frames) =
        tokio::time::timeout(Duration::from_secs(10), stream_frames(&url, &stalled))
            .await
            .expect("the silent stream was ended");
    let took = started.elapsed();
    assert_eq!(resp.status, 200);
    let text = frames_text(&frames);
    assert!(
        text.contains("streamIdle") && !text.contains("[DONE]"),
        "{text}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    eventually(
        Duration::from_secs(2),
        "the engine saw the stream closed",
        || h.count_events("a", "peer_closed") == 1,
    )
    .await;
    h.stop().await;
}

/// A client that stops reading its stream is cut off once its writes make no progress for the
/// limit, and the engine sees the request go (it would otherwise hold its slot for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off() {
    use tokio::io::AsyncWriteExt;
    let yaml = format!("clientTimeouts: {{write: 1}}\n{}", one_model(""));
    let h = Harness::start(&yaml).await;
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("a"))
            .await
            .status,
        200
    );
    let body = json!({"model": "a", "stream": true, "messages": [],
        "fakellm": {"chunks": 1000000, "interval_ms": 0}})
    .to_string();
    let addr = h.url.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    // the socket stays open and unread
    eventually(
        Duration::from_secs(20),
        "the engine saw the stream closed",
        || h.count_events("a", "peer_closed") == 1,
    )
    .await;
    drop(sock);
    h.stop().await;
}

/// Two requests in one write (HTTP/1.1 pipelining) get their two answers, in order; a body sent
/// after `Expect: 100-continue` gets the interim 100 first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_and_expect_continue() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start(&one_model("")).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let post = |model: &str, extra: &str| {
        let body = json!({"model": model, "messages": [], "fakellm": {"chunks": 1}}).to_string();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let two = format!("{}{}", post("a", ""), post("nope", "connection: close\r\n"));
    sock.write_all(two.as_bytes()).await.unwrap();
    let mut answers = String::new();
    tokio::time::timeout(Duration::from_secs(15), sock.read_to_string(&mut answers))
        .await
        .expect("both answers, then the close")
        .unwrap();
    let ok = answers.find("HTTP/1.1 200").expect("first answer");
    let not_found = answers.find("HTTP/1.1 404").expect("second answer");
    assert!(ok < not_found, "{answers}");

    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = post("a", "expect: 100-continue\r\nconnection: close\r\n");
    let (head, body) = request.split_at(request.find("\r\n\r\n").unwrap() + 4);
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut interim = [0u8; 25];
    sock.read_exact(&mut interim).await.unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    sock.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    sock.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    h.stop().await;
}
