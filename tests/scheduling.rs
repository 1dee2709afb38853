//! Starting, swapping, TTL, unload and admission, against the fake engine.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

fn running(models: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = models["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// A model is started by its first request, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_start_lazily_on_first_use() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "--loading-ms 200", "")
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(running(&get(&format!("{}/running", h.url)).await.json()).is_empty());
    assert_eq!(h.count_events("a", "spawned"), 0);
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    assert_eq!(list["data"][0]["status"]["value"], "unloaded");

    let resp = post_json(&format!("{}/v1/chat/completions", h.url), &chat("a")).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["model"], "a");
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["a"]
    );
    assert_eq!(
        get(&format!("{}/v1/models", h.url)).await.json()["data"][0]["status"]["value"],
        "loaded"
    );
    h.stop().await;
}

/// However many requests arrive for a cold model at once, it is spawned once and all are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_first_requests_start_one_process() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "--loading-ms 500", "concurrencyLimit: 100")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { post_json(&url, &chat("a")).await.status }
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(h.count_events("a", "spawned"), 1);
    h.stop().await;
}

/// The implicit default group swaps: one model at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_group_swaps_models() {
    let yaml = format!(
        "models:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["b"]
    );
    assert_eq!(
        h.count_events("a", "sigterm"),
        1,
        "a was stopped gracefully"
    );
    h.stop().await;
}

/// `swap: false` keeps a group's members together; an exclusive group evicts others unless they
/// are persistent; a non-exclusive group evicts nothing outside itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_rules_swap_exclusive_persistent() {
    let yaml = format!(
        "models:\n{}{}{}{}groups:\n  together: {{swap: false, members: [a, b]}}\n  keep: {{persistent: true, exclusive: false, members: [p]}}\n  side: {{exclusive: false, members: [n]}}\n",
        fake_model("a", "", ""),
        fake_model("b", "", ""),
        fake_model("p", "", ""),
        fake_model("n", "", ""),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for m in ["p", "a", "b"] {
        assert_eq!(post_json(&url, &chat(m)).await.status, 200);
    }
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["a", "b", "p"],
        "swap:false keeps a and b; p is persistent"
    );
    assert_eq!(post_json(&url, &chat("n")).await.status, 200);
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["a", "b", "n", "p"],
        "a non-exclusive group evicts nothing outside"
    );
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["a", "b", "p"],
        "the exclusive group evicts n but not persistent p"
    );
    h.stop().await;
}

/// A swap waits for the victim's in-flight stream to finish; the stream is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_eviction_while_a_request_is_in_flight() {
    let yaml = format!(
        "models:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 10, "interval_ms": 100}});
    let stream = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "a serving", || {
        h.count_requests("a", "/v1/chat/completions") >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let b = post_json(&url, &chat("b")).await;
    assert_eq!(b.status, 200);
    let (_, frames) = stream.await.unwrap();
    let text: String = frames_text(&frames);
    assert!(text.contains("data: [DONE]"), "the stream finished: {text}");
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "b waited for a to drain"
    );
    h.stop().await;
}

/// `ttl` unloads a model that has been idle that long, counted from the end of its last request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_unloads_idle_models() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", "ttl: 1"))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 15, "interval_ms": 100}});
    let (_, frames) = stream_frames(&url, &long).await;
    assert!(frames.len() > 5);
    // the 1.5 s stream outlived the TTL: the model must still be up right after it
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["a"]
    );
    eventually(Duration::from_secs(4), "ttl unload", || {
        h.count_events("a", "sigterm") == 1
    })
    .await;
    h.wait_running(&[], Duration::from_secs(2)).await;
    h.stop().await;
}

/// `/unload` and `/api/models/unload/<id>` stop models and return once they have stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_routes_stop_models() {
    let yaml = format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\n",
        fake_model("a", "", "aliases: [alpha]"),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    let one = post(&format!("{}/api/models/unload/alpha", h.url)).await;
    assert_eq!(one.status, 200);
    assert_eq!(
        running(&get(&format!("{}/running", h.url)).await.json()),
        ["b"]
    );
    assert_eq!(
        post(&format!("{}/api/models/unload/nope", h.url))
            .await
            .status,
        404
    );
    let all = get(&format!("{}/unload", h.url)).await;
    assert_eq!((all.status, all.text().as_str()), (200, "OK"));
    assert!(running(&get(&format!("{}/running", h.url)).await.json()).is_empty());
    let api = post(&format!("{}/api/models/unload", h.url)).await;
    assert_eq!(api.json(), json!({"msg": "ok"}));
    h.stop().await;
}

/// `concurrencyLimit` counts waiting plus in-flight requests; beyond it, 429 with Retry-After: 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_answers_429() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "", "concurrencyLimit: 1")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 5, "interval_ms": 100}});
    let first = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "first in flight", || {
        h.count_requests("a", "/v1/chat/completions") >= 1
    })
    .await;
    let second = post_json(&url, &chat("a")).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.header("retry-after"), Some("1"));
    assert_eq!(second.json()["error"]["code"], "concurrency_limit");
    assert_eq!(first.await.unwrap().0.status, 200);
    assert_eq!(
        post_json(&url, &chat("a")).await.status,
        200,
        "the slot is free again"
    );
    h.stop().await;
}

/// `globalConcurrencyLimit` bounds model requests across all models: past it, 429 at once (the
/// other model is not started); `/upstream` and the management routes are not counted; the
/// place is given back when the answer's body ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_concurrency_limit_answers_429_across_models() {
    let h = Harness::start(&format!(
        "globalConcurrencyLimit: 1\nmodels:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\n",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 10, "interval_ms": 100}});
    let first = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "first in flight", || {
        h.count_requests("a", "/v1/chat/completions") >= 1
    })
    .await;
    let refused = post_json(&url, &chat("b")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.json()["error"]["code"], "concurrency_limit");
    assert_eq!(refused.json()["error"]["message"], "Too many requests");
    assert!(h.events("b").is_empty(), "b was never started");
    let passthrough = get(&format!("{}/upstream/a/props", h.url)).await;
    assert_eq!(passthrough.status, 200, "/upstream is not counted");
    assert_eq!(get(&format!("{}/running", h.url)).await.status, 200);
    assert_eq!(first.await.unwrap().0.status, 200);
    assert_eq!(
        post_json(&url, &chat("b")).await.status,
        200,
        "the place is free again"
    );
    h.stop().await;
}

/// While `busy` streams, requests for `first` then `second` wait to swap in; returns when each
/// one's engine was spawned.
async fn swap_order(yaml: &str, first: &str, second: &str) -> (f64, f64) {
    let h = Harness::start(yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "busy", "stream": true, "messages": [], "fakellm": {"chunks": 8, "interval_ms": 100}});
    let stream = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "busy serving", || {
        h.count_requests("busy", "/v1/chat/completions") == 1
    })
    .await;
    let one = tokio::spawn({
        let (url, body) = (url.clone(), chat(first));
        async move { post_json(&url, &body).await.status }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let two = tokio::spawn({
        let (url, body) = (url.clone(), chat(second));
        async move { post_json(&url, &body).await.status }
    });
    stream.await.unwrap();
    assert_eq!(one.await.unwrap(), 200);
    assert_eq!(two.await.unwrap(), 200);
    let spawned_at = |m: &str| {
        h.events(m)
            .iter()
            .find(|e| e["event"] == "spawned")
            .unwrap()["t_ms"]
            .as_f64()
            .unwrap()
    };
    let times = (spawned_at(first), spawned_at(second));
    h.stop().await;
    times
}

/// `fifo.priority`: when a busy model drains, the waiting request with the higher priority swaps
/// in first, though it arrived later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_decides_which_waiting_swap_goes_first() {
    let yaml = format!(
        "routing:\n  scheduler:\n    use: fifo\n    settings:\n      fifo:\n        priority: {{urgent: 10}}\nmodels:\n{}{}{}",
        fake_model("busy", "", ""),
        fake_model("urgent", "", ""),
        fake_model("later", "", ""),
    );
    let (later, urgent) = swap_order(&yaml, "later", "urgent").await;
    assert!(urgent < later, "the higher priority went first");
}

/// Without priorities, the request that waited longest swaps in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_swaps_go_in_arrival_order() {
    let yaml = format!(
        "models:\n{}{}{}",
        fake_model("busy", "", ""),
        fake_model("first", "", ""),
        fake_model("second", "", "")
    );
    let (first, second) = swap_order(&yaml, "first", "second").await;
    assert!(first < second);
}
