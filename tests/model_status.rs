//! `/api/events` model status as llama-swap fills it after v250: `loadingProgress` and
//! `loadingMessage` while a model starts and its engine reports them through its health check,
//! `readySince` and `uptimeMs` once it is ready.

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;
use support::*;

/// The `/api/events` body, as it streams.
async fn events(h: &Harness) -> hyper::body::Incoming {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let url = format!("{}/api/events", h.url).parse().unwrap();
    client.get(url).await.unwrap().into_body()
}

/// Reads `modelStatus` frames until one shows `model` in `state`; returns that model's entry in
/// every frame read, in order.
async fn statuses_until(body: &mut hyper::body::Incoming, model: &str, state: &str) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (mut text, mut seen) = (String::new(), Vec::<Value>::new());
    while seen.last().is_none_or(|s| s["state"] != state) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("{model} {state} in time; saw {seen:#?}"))
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let Some(data) = block.trim_end().strip_prefix("event:message\ndata:") else {
                continue;
            };
            let outer: Value = serde_json::from_str(data).unwrap();
            if outer["type"] != "modelStatus" {
                continue;
            }
            let list: Value = serde_json::from_str(outer["data"].as_str().unwrap()).unwrap();
            let entry = list.as_array().unwrap().iter().find(|m| m["id"] == model);
            seen.push(entry.cloned().expect("the model is listed"));
        }
    }
    seen
}

/// `2026-11-30T09:10:00Z`: RFC 3339 in UTC, to the second, as Go's `time.RFC3339` writes it.
fn is_rfc3339_utc(s: &str) -> bool {
    let digits = |r: std::ops::Range<usize>| s[r].bytes().all(|b| b.is_ascii_digit());
    s.len() == 20
        && digits(0..4)
        && digits(5..7)
        && digits(8..10)
        && digits(11..13)
        && digits(14..16)
        && digits(17..19)
        && &s[4..5] == "-"
        && &s[10..11] == "T"
        && s.ends_with('Z')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_model_shows_its_progress_and_a_ready_one_since_when() {
    let flags = "--loading-ms 1500 --progress-ms 300 --health-progress";
    let h = Harness::start(&format!("models:\n{}", fake_model("slow", flags, ""))).await;
    let mut body = events(&h).await;
    let before = statuses_until(&mut body, "slow", "stopped").await;
    let first = &before[0];
    for absent in [
        "readySince",
        "uptimeMs",
        "loadingProgress",
        "loadingMessage",
    ] {
        assert!(
            first.get(absent).is_none(),
            "a stopped model has no {absent}: {first}"
        );
    }
    let url = format!("{}/v1/chat/completions", h.url);
    let answer = tokio::spawn(async move { post_json(&url, &chat("slow")).await });
    let seen = statuses_until(&mut body, "slow", "ready").await;
    assert_eq!(answer.await.unwrap().status, 200);
    let reports: Vec<f64> = seen
        .iter()
        .filter(|s| s["state"] == "starting")
        .filter_map(|s| s["loadingProgress"].as_f64())
        .collect();
    assert!(reports.len() >= 2, "each new report is told: {seen:#?}");
    assert!(reports.windows(2).all(|w| w[0] < w[1]) && reports.iter().all(|p| *p < 1.0));
    let starting = seen
        .iter()
        .find(|s| s.get("loadingProgress").is_some())
        .unwrap();
    assert_eq!(starting["loadingMessage"], "loading tensors");

    let ready = seen.last().unwrap();
    let since = ready["readySince"].as_str().expect("readySince");
    assert!(is_rfc3339_utc(since), "{since}");
    let uptime = ready["uptimeMs"].as_u64().expect("uptimeMs");
    assert!((1..5000).contains(&uptime), "{uptime}");
    assert!(ready.get("loadingProgress").is_none() && ready.get("loadingMessage").is_none());
    h.stop().await;
}
