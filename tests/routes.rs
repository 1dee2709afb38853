//! Every route, with odd paths and every method: each gets an answer, none takes a connection down.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

const ROUTES: &[&str] = &[
    "",
    "/health",
    "/v1/models",
    "/models",
    "/running",
    "/unload",
    "/logs",
    "/logs/stream",
    "/metrics",
    "/api/events",
    "/api/profiles",
    "/api/profiles/active",
    "/api/version",
    "/api/metrics/activity",
    "/api/metrics/stats",
    "/api/models/unload",
    "/api/models/load",
    "/api/models",
    "/api/lifecycle",
    "/api/inflight",
    "/upstream",
    "/upstream/a",
    "/v1/chat/completions",
    "/v/chat/completions",
    "/props",
    "/ui",
];

/// What follows a route: empty ids, the literal `cancel`, trailing slashes, percent-encoding.
const TAILS: &[&str] = &[
    "",
    "/",
    "//",
    "/cancel",
    "/cancel/",
    "//cancel",
    "/cancel/cancel",
    "/a",
    "/a/",
    "/a/cancel",
    "/%2F",
    "/%2Fcancel",
    "/%ff",
    "/%00",
    "/%",
    "/-1/cancel",
    "/18446744073709551616/cancel",
    "/1/cancel?x=%",
    "/é",
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// The status of the answer's head, or why none came (a panic closes the connection unanswered).
async fn answer(method: &str, uri: Uri) -> Result<u16, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(uri)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    // streams (events, logs) never end: the head is the answer
    match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(resp)) => Ok(resp.status().as_u16()),
        Ok(Err(e)) => Err(format!("no answer: {e:?}")),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_paths_on_every_route_never_panic() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", ""))).await;
    let mut failures = Vec::new();
    let mut asked = 0;
    for route in ROUTES {
        for tail in TAILS {
            let Ok(uri) = format!("{}{route}{tail}", h.url).parse::<Uri>() else {
                continue; // not a request a client can send
            };
            for method in METHODS {
                asked += 1;
                if let Err(why) = answer(method, uri.clone()).await {
                    failures.push(format!("{method} {uri}: {why}"));
                }
            }
        }
    }
    assert!(asked > 1000, "only {asked} requests were sent");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(get(&format!("{}/health", h.url)).await.status, 200);
    h.stop().await;
}

/// `logToStdout: http` writes one access line per request into `/logs` (and to stdout); without
/// `http`, none is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_stream_logs_one_line_per_request() {
    let h = Harness::start("logToStdout: proxy,http\nmodels: {}\n").await;
    assert_eq!(get(&format!("{}/running", h.url)).await.status, 200);
    let line = "\"GET /running HTTP/1.1\" 200 ";
    let logs = format!("{}/logs", h.url);
    let mut seen = String::new();
    for _ in 0..100 {
        seen = get(&logs).await.text();
        if seen.contains(line) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        seen.contains(&format!("Request 127.0.0.1 {line}")),
        "{seen}"
    );
    h.stop().await;

    let quiet = Harness::start("models: {}\n").await;
    assert_eq!(get(&format!("{}/running", quiet.url)).await.status, 200);
    let logs = get(&format!("{}/logs", quiet.url)).await.text();
    assert!(!logs.contains("Request "), "{logs}");
    quiet.stop().await;
}
