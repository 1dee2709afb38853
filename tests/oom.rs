//! An engine that runs out of device memory although placed: its charge is raised by what it
//! asked for, idle holders are evicted to make that room, and the start is tried once more; a
//! second failure is `insufficient_memory` with the figures.

mod support;

use support::*;

fn config(big_flags: &str) -> String {
    format!(
        "devices:\n  - {{name: gpu0, capacity: 10GiB}}\ngroups:\n  both: {{swap: false, members: [idle, big]}}\nmodels:\n{}{}",
        fake_model("idle", "", "memory: 6GiB"),
        fake_model("big", big_flags, "memory: 3GiB"),
    )
}

fn stops(metrics: &str, model: &str, reason: &str) -> usize {
    let prefix = format!("corral_instance_stops_total{{instance=\"{model}\",model=\"{model}\",reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The engine's last words, which the first failure's event carries, have its secret masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_raises_the_charge_evicts_an_idle_model_and_starts_again() {
    let h = Harness::start(&config(
        "--fail-oom-once ${env.DIR}/big.oom --api-key ${env.ENGINE_SECRET}",
    ))
    .await;
    let chat_url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&chat_url, &chat("idle")).await.status, 200);
    let answer = post_json(&chat_url, &chat("big")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(h.path("big.oom").exists(), "the first start failed");
    assert_eq!(h.running().await, ["big"]);
    let state = get(&format!("{}/api/state", h.url)).await.json();
    let big = state["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "big")
        .unwrap()
        .clone();
    // 3 GiB charged, plus the 2048 MiB the engine's allocation asked for
    assert_eq!(big["memory"], 5u64 << 30, "{big}");
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert_eq!(stops(&metrics, "idle", "memory"), 1, "{metrics}");
    let events = get(&format!("{}/api/lifecycle", h.url)).await.text();
    assert!(events.contains("starting again with"), "{events}");
    assert!(!events.contains(ENGINE_SECRET), "{events}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_out_of_memory_is_insufficient_memory_with_the_figures() {
    let h = Harness::start(&config("--fail-oom")).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("big")).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    let text = answer.text();
    assert!(text.contains("insufficient_memory"), "{text}");
    assert!(text.contains("with 5.00 GiB charged"), "{text}");
    assert!(text.contains("out of GPU memory"), "{text}");
    h.stop().await;
}
