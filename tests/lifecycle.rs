//! Each model's lifecycle status (`inactive`, `deploying`, `active`, `error`, ...) in
//! `GET /api/models/<id>`, `/v1/models` and the metrics, and the events that tell of each change.

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::*;

fn config() -> String {
    let broken = "  broken:\n    cmd: /nonexistent/engine --port ${PORT}\n";
    let together = "groups:\n  both: {swap: false, members: [a, broken]}\n";
    format!(
        "{together}models:\n{}{broken}",
        fake_model("a", "--loading-ms 400", "")
    )
}

/// Reads `/api/events` frames (decoding llama-swap's double encoding) until `done` holds for the
/// events read so far.
async fn events_until(
    body: &mut hyper::body::Incoming,
    seen: &mut Vec<Value>,
    done: impl Fn(&[Value]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while !done(seen) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("events in time; saw {seen:#?}"))
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let Some(data) = block.trim_end().strip_prefix("event:message\ndata:") else {
                continue;
            };
            let outer: Value = serde_json::from_str(data).unwrap();
            let mut inner: Value = serde_json::from_str(outer["data"].as_str().unwrap()).unwrap();
            if inner.is_object() {
                inner["frame"] = outer["type"].clone();
                seen.push(inner);
            }
        }
    }
}

/// The body of `/api/events`, as it streams.
async fn events(h: &Harness) -> hyper::body::Incoming {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let events = client
        .get(format!("{}/api/events", h.url).parse().unwrap())
        .await
        .unwrap();
    events.into_body()
}

fn moves(seen: &[Value], model: &str) -> Vec<(String, String)> {
    seen.iter()
        .filter(|e| e["frame"] == "status_changed" && e["model"] == model)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("from"), s("to"))
        })
        .collect()
}

fn has(seen: &[Value], frame: &str, model: &str) -> bool {
    seen.iter()
        .any(|e| e["frame"] == frame && e["model"] == model)
}

fn status_metric(metrics: &str, model: &str, status: &str) -> Option<String> {
    let series = format!("corral_model_status{{model=\"{model}\",status=\"{status}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_move_with_the_instances_and_each_move_is_an_event() {
    let h = Harness::start(&config()).await;
    let detail = get(&format!("{}/api/models/a", h.url)).await.json();
    assert_eq!(detail["status"], "inactive", "{detail}");
    let mut body = events(&h).await;
    let mut seen = Vec::new();

    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("a")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    events_until(&mut body, &mut seen, |s| {
        moves(s, "a").last().is_some_and(|(_, to)| to == "active")
    })
    .await;
    assert_eq!(
        moves(&seen, "a"),
        [
            ("inactive".to_string(), "deploying".to_string()),
            ("deploying".to_string(), "active".to_string())
        ]
    );
    assert!(has(&seen, "launched", "a"), "{seen:#?}");
    let detail = get(&format!("{}/api/models/a", h.url)).await.json();
    assert_eq!(detail["status"], "active", "{detail}");
    assert!(detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "launched"));
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    let a = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "a")
        .unwrap()
        .clone();
    assert_eq!(
        (&a["status"]["value"], &a["status"]["lifecycle"]),
        (&json!("loaded"), &json!("active")),
        "{a}"
    );
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert_eq!(status_metric(&metrics, "a", "active").as_deref(), Some("1"));
    assert_eq!(
        status_metric(&metrics, "a", "inactive").as_deref(),
        Some("0")
    );

    let failed = post_json(&format!("{}/v1/chat/completions", h.url), &chat("broken")).await;
    assert!(failed.status >= 500, "{}", failed.text());
    events_until(&mut body, &mut seen, |s| {
        has(s, "error", "broken") && moves(s, "broken").iter().any(|(_, to)| to == "error")
    })
    .await;
    let detail = get(&format!("{}/api/models/broken", h.url)).await.json();
    assert_eq!(detail["status"], "error", "{detail}");
    let reason = detail["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("/nonexistent/engine"), "{detail}");

    assert_eq!(
        post(&format!("{}/api/models/unload/a", h.url)).await.status,
        200
    );
    events_until(&mut body, &mut seen, |s| {
        moves(s, "a").last().is_some_and(|(_, to)| to == "inactive") && has(s, "destroyed", "a")
    })
    .await;
    let destroyed = seen
        .iter()
        .find(|e| e["frame"] == "destroyed" && e["model"] == "a")
        .expect("a destroyed event");
    assert_eq!(destroyed["reason"], "unload");
    assert_eq!(
        get(&format!("{}/api/models/nothing", h.url)).await.status,
        404
    );
    h.stop().await;
}

/// An engine launched and then stopped before it was ready (unloaded while it loads) is told of
/// as destroyed, with the reason, as one stopped after it served is: every `launched` has its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_stopped_while_it_loads_is_destroyed() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("slow", "--loading-ms 5000", "")
    ))
    .await;
    let mut body = events(&h).await;
    let mut seen = Vec::new();
    let url = format!("{}/v1/chat/completions", h.url);
    let waiting = tokio::spawn(async move { post_json(&url, &chat("slow")).await });
    events_until(&mut body, &mut seen, |s| has(s, "launched", "slow")).await;
    assert_eq!(
        post(&format!("{}/api/models/unload/slow", h.url))
            .await
            .status,
        200
    );
    events_until(&mut body, &mut seen, |s| has(s, "destroyed", "slow")).await;
    let destroyed = seen
        .iter()
        .find(|e| e["frame"] == "destroyed" && e["model"] == "slow")
        .unwrap();
    assert_eq!(destroyed["reason"], "unload", "{destroyed}");
    assert!(waiting.await.unwrap().status >= 400);
    h.stop().await;
}
