//! Placement by device memory, eviction under pressure, and load deadlines that scale with weights.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const GPU: &str = "devices:\n  - {name: gpu0, capacity: 10GiB, reserve: 512MiB}\n";

fn sized(id: &str, gib: u32, extra: &str) -> String {
    fake_model(id, "", &format!("memory: {{bytes: {gib}GiB}}\n{extra}"))
}

async fn stops(h: &Harness, instance: &str, reason: &str) -> f64 {
    let text = get(&format!("{}/metrics", h.url)).await.text();
    let series = format!(
        r#"corral_instance_stops_total{{instance="{instance}",model="{instance}",reason="{reason}"}} "#
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Two models that fit together both stay loaded with no group configured; a third that does not
/// fit evicts the least recently used idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_recently_used_idle_model_makes_room() {
    let yaml = format!(
        "{GPU}models:\n{}{}{}",
        sized("a", 4, ""),
        sized("b", 4, ""),
        sized("c", 4, "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for m in ["a", "b"] {
        assert_eq!(post_json(&url, &chat(m)).await.status, 200);
    }
    assert_eq!(
        h.running().await,
        ["a", "b"],
        "both fit: no swap without a group"
    );
    assert_eq!(post_json(&url, &chat("a")).await.status, 200); // b is now the least recently used
    assert_eq!(post_json(&url, &chat("c")).await.status, 200);
    assert_eq!(h.running().await, ["a", "c"]);
    assert_eq!(stops(&h, "b", "memory").await, 1.0);
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(
        metrics.contains(&format!(
            "corral_device_memory_charged_bytes{{device=\"gpu0\"}} {}",
            8u64 << 30
        )),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "corral_device_memory_capacity_bytes{{device=\"gpu0\"}} {}",
        (10u64 << 30) - (512 << 20)
    )));
    h.stop().await;
}

/// Two 6 GiB models on a 10 GiB device: `big` serving a stream of `chunks` chunks 100 ms apart,
/// `other` (waiting up to `queue_timeout` s for memory) not started.
async fn big_serving(
    chunks: u32,
    queue_timeout: u32,
) -> (
    Harness,
    String,
    tokio::task::JoinHandle<(Resp, Vec<(Duration, bytes::Bytes)>)>,
) {
    let yaml = format!(
        "{GPU}models:\n{}{}",
        sized("big", 6, ""),
        sized("other", 6, &format!("queueTimeout: {queue_timeout}"))
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "big", "stream": true, "messages": [], "fakellm": {"chunks": chunks, "interval_ms": 100}});
    let stream = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "big serving", || {
        h.count_requests("big", "/v1/chat/completions") == 1
    })
    .await;
    (h, url, stream)
}

/// A model that is serving is never evicted: the start waits, then fails with a 503
/// insufficient_memory naming the holder; the stream is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_model_is_never_evicted() {
    let (h, url, stream) = big_serving(25, 1).await;
    let started = Instant::now();
    let denied = post_json(&url, &chat("other")).await;
    assert_eq!(denied.status, 503, "{}", denied.text());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "it waited for the queue timeout first"
    );
    let err = denied.json()["error"].clone();
    assert_eq!(err["code"], "insufficient_memory");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("held by big (6.00 GiB)"),
        "{err}"
    );
    assert!(denied.header("retry-after").is_some());
    let (_, frames) = stream.await.unwrap();
    let text: String = frames_text(&frames);
    assert!(
        text.contains("[DONE]"),
        "the serving model finished its stream"
    );
    assert_eq!(stops(&h, "big", "memory").await, 0.0);
    // once idle, it can be evicted
    assert_eq!(post_json(&url, &chat("other")).await.status, 200);
    assert_eq!(h.running().await, ["other"]);
    h.stop().await;
}

/// The waiting start goes ahead as soon as the holder becomes idle, within the queue bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_waits_for_the_holder_to_become_idle() {
    let (h, url, stream) = big_serving(10, 10).await;
    assert_eq!(post_json(&url, &chat("other")).await.status, 200);
    assert!(stream.await.unwrap().0.status == 200);
    assert_eq!(stops(&h, "big", "memory").await, 1.0);
    h.stop().await;
}

/// A model that can never fit fails at once, naming the device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_too_big_for_any_device_fails_at_once() {
    let h = Harness::start(&format!("{GPU}models:\n{}", sized("huge", 20, ""))).await;
    let resp = post_json(&format!("{}/v1/chat/completions", h.url), &chat("huge")).await;
    assert_eq!(resp.status, 503);
    assert!(
        resp.text().contains("gpu0 has 9.50 GiB usable"),
        "{}",
        resp.text()
    );
    assert_eq!(h.count_events("huge", "spawned"), 0);
    h.stop().await;
}

/// After loading, the engine's own allocation report replaces the estimate in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_report_replaces_the_estimate() {
    let flags = "--buffer-report --report-device CUDA0 --report-model-mib 1000 --report-kv-mib 200 --report-compute-mib 100";
    let yaml = format!(
        "{GPU}models:\n{}",
        fake_model("a", flags, "memory: {bytes: 4GiB}")
    );
    let h = Harness::start(&yaml).await;
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("a"))
            .await
            .status,
        200
    );
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    let reported = 1300u64 << 20;
    assert!(
        metrics.contains(&format!(
            "corral_instance_memory_measured_bytes{{instance=\"a\",model=\"a\"}} {reported}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "corral_device_memory_charged_bytes{{device=\"gpu0\"}} {reported}"
    )));

    // started again, it reports again: its own report counts, not the sum of both in its log
    assert_eq!(
        post(&format!("{}/api/models/unload/a", h.url)).await.status,
        200
    );
    for _ in 0..200 {
        if h.running().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h.running().await.is_empty(), "a stopped");
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("a"))
            .await
            .status,
        200
    );
    assert_eq!(h.count_events("a", "spawned"), 2);
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(
        metrics.contains(&format!(
            "corral_instance_memory_measured_bytes{{instance=\"a\",model=\"a\"}} {reported}"
        )),
        "{metrics}"
    );
    h.stop().await;
}

/// The load deadline grows with the weights: a 40 GiB (sparse) file gets 40 GiB / 150 MiB/s.
#[test]
fn the_load_deadline_scales_with_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("big.gguf");
    std::fs::File::create(&weights)
        .unwrap()
        .set_len(40 << 30)
        .unwrap();
    let small = dir.path().join("small.gguf");
    std::fs::File::create(&small)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "models:\n  big: {{cmd: 'llama-server -m {} --port ${{PORT}}'}}\n  small: {{cmd: 'llama-server -m {} --port ${{PORT}}'}}\n  fixed: {{cmd: 'llama-server -m {} --port ${{PORT}}', loadTimeout: 900}}\n",
            weights.display(),
            small.display(),
            weights.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(CORRAL)
        .args(["check", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |model: &str| {
        text.split(&format!("model {model}\n"))
            .nth(1)
            .unwrap()
            .lines()
            .find(|l| l.contains("deadline"))
            .unwrap()
            .to_string()
    };
    assert!(
        line("big").contains("deadline 273s (weights 40.00 GiB)"),
        "{}",
        line("big")
    );
    assert!(
        line("small").contains("deadline 120s"),
        "the health check timeout is the floor: {}",
        line("small")
    );
    assert!(
        line("fixed").contains("deadline 900s"),
        "loadTimeout wins: {}",
        line("fixed")
    );
}

/// A load past its deadline survives while it prints progress, and is killed once it goes quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_keeps_a_slow_load_alive() {
    let yaml = format!(
        "loadStallTimeout: 1\nmodels:\n{}{}groups:\n  g: {{swap: false, members: [talking, silent]}}\n",
        fake_model("talking", "--loading-ms 3000 --progress-ms 200", "loadTimeout: 1"),
        fake_model("silent", "--loading-ms 5000", "loadTimeout: 1"),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let started = Instant::now();
    let (t, s) = (chat("talking"), chat("silent"));
    let (talking, silent) = tokio::join!(post_json(&url, &t), post_json(&url, &s));
    assert_eq!(talking.status, 200, "{}", talking.text());
    assert!(started.elapsed() >= Duration::from_millis(2900));
    assert_eq!(silent.status, 500);
    assert!(
        silent.text().contains("no sign of progress"),
        "{}",
        silent.text()
    );
    h.stop().await;
}

/// `corral check` shows where each model would be placed on its own: one device, a split in
/// proportion to the room, a pinned split, or why it never fits; and the host memory a model
/// keeps on the CPU.
#[test]
fn check_shows_where_each_model_would_be_placed() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "devices:\n  - {name: g0, capacity: 24GiB}\n  - {name: g1, capacity: 24GiB}\nmodels:\n  one: {cmd: 'srv --port ${PORT}', memory: 12GiB}\n  split: {cmd: 'srv --port ${PORT}', memory: 30GiB}\n  pinned: {cmd: 'srv --port ${PORT}', memory: {bytes: 8GiB, host: 3GiB, devices: [g0, g1]}}\n  huge: {cmd: 'srv --port ${PORT}', memory: 60GiB}\n",
    )
    .unwrap();
    let out = std::process::Command::new(CORRAL)
        .args(["check", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |model: &str, key: &str| {
        text.split(&format!("model {model}\n"))
            .nth(1)
            .unwrap()
            .lines()
            .take_while(|l| !l.starts_with("model "))
            .map(str::trim)
            .find(|l| l.starts_with(key))
            .map(str::to_string)
    };
    let placed = |model: &str| line(model, "placed:").unwrap();
    assert_eq!(
        line("pinned", "host:").as_deref(),
        Some("host:       3.00 GiB")
    );
    assert_eq!(
        line("one", "host:"),
        None,
        "no host part given or estimated"
    );
    assert_eq!(placed("one"), "placed:     g0 12.00 GiB");
    assert_eq!(placed("split"), "placed:     g0 15.00 GiB + g1 15.00 GiB");
    assert_eq!(placed("pinned"), "placed:     g0 4.00 GiB + g1 4.00 GiB");
    assert!(
        placed("huge").starts_with("placed:     never fits: "),
        "{}",
        placed("huge")
    );
}
