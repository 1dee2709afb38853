//! Load-aware peers: several corrals serve one model; the front sends each request to the least
//! loaded one, and past one that is down.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use support::*;

/// A corral serving `m` on the fake engine, to be a peer.
async fn peer() -> Harness {
    Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await
}

fn front_config(a: &Harness, b: &Harness) -> String {
    format!(
        "peers:\n  a: {{proxy: '{}', models: [m]}}\n  b: {{proxy: '{}', models: [m]}}\n",
        a.url, b.url
    )
}

fn long(chunks: u32) -> serde_json::Value {
    json!({"model": "m", "stream": true, "messages": [],
           "fakellm": {"chunks": chunks, "interval_ms": 100}})
}

/// Requests that reached a peer's engine.
fn served(h: &Harness) -> usize {
    h.count_requests("m", "/v1/chat/completions")
}

/// Each corral reports what runs and waits per model; the front reads it and sends new work to
/// the peer with less of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_loaded_peer_gets_the_request() {
    let (a, b) = (peer().await, peer().await);
    let front = Harness::start(&front_config(&a, &b)).await;
    let a_chat = format!("{}/v1/chat/completions", a.url);
    assert_eq!(post_json(&a_chat, &chat("m")).await.status, 200, "warm a");

    // two long streams keep a busy, sent to it directly
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let url = a_chat.clone();
            tokio::spawn(async move { stream_frames(&url, &long(40)).await })
        })
        .collect();
    eventually(Duration::from_secs(5), "a reports its two streams", || {
        served(&a) == 3
    })
    .await;
    let report = get(&format!("{}/api/load", a.url)).await.json();
    assert_eq!(report["models"]["m"]["running"], 2, "{report}");
    tokio::time::sleep(Duration::from_millis(1500)).await; // the front reads it

    let front_chat = format!("{}/v1/chat/completions", front.url);
    for _ in 0..2 {
        let r = post_json(&front_chat, &chat("m")).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(served(&b), 2, "both went to the idle peer");
    assert_eq!(served(&a), 3);
    for s in busy {
        s.abort();
    }
    front.stop().await;
    a.stop().await;
    b.stop().await;
}

/// A peer that is down costs no request: one that fails before answering is retried on the
/// other, and the failed peer is held out after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_down_loses_no_request() {
    let (a, b) = (peer().await, peer().await);
    let front = Harness::start(&front_config(&a, &b)).await;
    let front_chat = format!("{}/v1/chat/completions", front.url);
    assert_eq!(post_json(&front_chat, &chat("m")).await.status, 200);
    a.stop().await;
    for i in 0..6 {
        let r = post_json(&front_chat, &chat("m")).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert!(served(&b) >= 6, "b served {}", served(&b));
    front.stop().await;
    b.stop().await;
}

/// A peer reports the requests waiting for a model that is still loading, so a cold peer with a
/// queue does not look idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_report_counts_requests_waiting_for_a_load() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("m", "--loading-ms 2000", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post_json(&url, &chat("m")).await.status })
        })
        .collect();
    let mut report = serde_json::Value::Null;
    for _ in 0..50 {
        report = get(&format!("{}/api/load", h.url)).await.json();
        if report["models"]["m"]["waiting"] == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(report["models"]["m"]["waiting"], 3, "{report}");
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    h.stop().await;
}

/// A peer that claims more work than a number holds: `running` 2^64-1 and `waiting` 1 (a sum
/// that wraps to 0). It answers chats too, and counts its load reports and chats.
struct Liar {
    url: String,
    reports: Arc<AtomicUsize>,
    chats: Arc<AtomicUsize>,
}

async fn liar() -> Liar {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (reports, chats) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let counts = (reports.clone(), chats.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (reports, chats) = counts.clone();
            let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                let body = if req.uri().path() == "/api/load" {
                    reports.fetch_add(1, Ordering::SeqCst);
                    r#"{"models":{"m":{"running":18446744073709551615,"waiting":1}}}"#
                } else {
                    chats.fetch_add(1, Ordering::SeqCst);
                    r#"{"choices":[{"message":{"role":"assistant","content":"lie"}}]}"#
                };
                let resp = http::Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(body.as_bytes())));
                async move { Ok::<_, Infallible>(resp.unwrap()) }
            });
            let io = hyper_util::rt::TokioIo::new(tcp);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, svc));
        }
    });
    Liar {
        url,
        reports,
        chats,
    }
}

/// An absurd load report is clamped, not wrapped to nothing: every request goes to the honest
/// idle peer, none to the one that claims it is swamped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_peer_load_draws_no_traffic_from_an_idle_peer() {
    let (lying, honest) = (liar().await, peer().await);
    let front = Harness::start(&format!(
        "peers:\n  a: {{proxy: '{}', models: [m]}}\n  b: {{proxy: '{}', models: [m]}}\n",
        lying.url, honest.url
    ))
    .await;
    // the second report is asked for once the first one was taken in
    eventually(Duration::from_secs(5), "two load reports read", || {
        lying.reports.load(Ordering::SeqCst) >= 2
    })
    .await;
    let front_chat = format!("{}/v1/chat/completions", front.url);
    for i in 0..10 {
        let r = post_json(&front_chat, &chat("m")).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert_eq!(lying.chats.load(Ordering::SeqCst), 0, "the liar drew none");
    assert_eq!(served(&honest), 10);
    front.stop().await;
    honest.stop().await;
}
