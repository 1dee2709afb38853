//! The dashboard's data: the activity log kept in SQLite across restarts (`store.path`), captures
//! of request and response bodies (`captureBuffer`), `/api/performance` and `/api/hardware`.

mod support;

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use support::process::spawn_corral_env;
use support::*;

fn with_store(path: &Path) -> String {
    format!(
        "store:\n  path: {}\nmodels:\n{}",
        path.display(),
        fake_model("m", "", "")
    )
}

async fn activity(h: &Harness) -> Value {
    get(&format!("{}/api/metrics/activity?order=asc", h.url))
        .await
        .json()
}

fn ids(page: &Value) -> Vec<u64> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect()
}

async fn chats(h: &Harness, n: usize) {
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..n {
        assert_eq!(post_json(&url, &chat("m")).await.status, 200);
    }
}

/// Rows written before a stop are there after a start on the same file, and new rows continue
/// their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_survives_a_restart_on_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("activity.db");
    let h = Harness::start(&with_store(&db)).await;
    chats(&h, 3).await;
    assert_eq!(ids(&activity(&h).await), [1, 2, 3]);
    h.stop().await;

    let h = Harness::start(&with_store(&db)).await;
    let page = activity(&h).await;
    assert_eq!(ids(&page), [1, 2, 3], "{page}");
    assert_eq!(page["data"][0]["model"], "m");
    assert!(page["data"][0]["tokens"]["output_tokens"].as_u64().unwrap() > 0);
    chats(&h, 1).await;
    assert_eq!(ids(&activity(&h).await), [1, 2, 3, 4]);
    h.stop().await;
}

/// corral started on `yaml` in this process, expected to refuse to start: its error.
async fn refusal(yaml: &str) -> String {
    let config = corral::config::load_str("refused.yaml", yaml, &|_| None)
        .unwrap()
        .config;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let opts = corral::Options {
        state_key: format!("refused-{}", new_marker().replace('=', "-")),
        ..Default::default()
    };
    let (shutdown, abort) = Default::default();
    let run = corral::run(config, listener, Default::default(), opts, shutdown, abort);
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(())) => panic!("corral started"),
        Err(_) => panic!("corral started and ran"),
    }
}

fn store_only(path: &Path) -> String {
    format!("store:\n  path: {}\nmodels: {{}}\n", path.display())
}

/// Random bytes at the store's path: corral refuses to start, names the file, and leaves it as
/// it was, nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_sqlite_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("activity.db");
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&db, &junk).unwrap();
    let said = refusal(&store_only(&db)).await;
    assert!(said.contains(&format!("{db:?}")), "{said}");
    assert!(said.contains("not a usable SQLite database"), "{said}");
    assert_eq!(std::fs::read(&db).unwrap(), junk);
    let moved = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains("corrupt"));
    assert!(!moved);
}

/// A second corral on a store the first holds refuses to start, naming it; the first goes on
/// writing its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_corral_on_one_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("activity.db");
    let h = Harness::start(&with_store(&db)).await;
    chats(&h, 1).await; // the first has started, its store open
    let said = refusal(&store_only(&db)).await;
    assert!(said.contains(&format!("{db:?}")), "{said}");
    assert!(said.contains("in use by another corral"), "{said}");
    chats(&h, 1).await;
    assert_eq!(ids(&activity(&h).await), [1, 2]);
    h.stop().await;
}

fn captures_config(mb: u32) -> String {
    format!("captureBuffer: {mb}\nmodels:\n{}", fake_model("m", "", ""))
}

/// With `captureBuffer: 1` a chat's capture holds its request and response bodies (the key
/// masked); a request larger than the budget is cut and marked, and pushes older captures out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_hold_the_bodies_within_the_budget() {
    let h = Harness::start(&captures_config(1)).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let sent = chat("m").to_string();
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer client-secret"),
    ];
    let answer = request("POST", &url, &headers, sent.clone()).await;
    assert_eq!(answer.status, 200);
    let row = &activity(&h).await["data"][0];
    assert_eq!(row["has_capture"], true, "{row}");
    let capture = get(&format!("{}/api/captures/{}", h.url, row["id"]))
        .await
        .json();
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    assert_eq!(b64(&capture["req_body"]), sent.as_bytes());
    assert_eq!(b64(&capture["resp_body"]), answer.body.to_vec());
    assert_eq!(capture["req_path"], "/v1/chat/completions");
    assert_eq!(capture["req_headers"]["Authorization"], "[REDACTED]");
    assert!(
        capture["resp_headers"]["Content-Type"].is_string(),
        "{capture}"
    );

    let big = "x".repeat(3 << 19); // 1.5 MiB of prompt
    let body = json!({"model": "m", "messages": [{"role": "user", "content": big}]});
    assert_eq!(post_json(&url, &body).await.status, 200);
    let rows = activity(&h).await;
    let newest = &rows["data"][1];
    let capture = get(&format!("{}/api/captures/{}", h.url, newest["id"]))
        .await
        .json();
    assert_eq!(capture["req_body_truncated"], true);
    assert!(b64(&capture["req_body"]).len() < 1 << 20);
    let first = get(&format!("{}/api/captures/{}", h.url, row["id"])).await;
    assert_eq!(first.status, 404, "the first capture made room");
    assert_eq!(get(&format!("{}/api/captures/x", h.url)).await.status, 400);
    h.stop().await;
}

/// `captureBuffer: 0` keeps nothing: rows say so and the capture route answers 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_off_answer_404() {
    let h = Harness::start(&captures_config(0)).await;
    chats(&h, 1).await;
    let row = &activity(&h).await["data"][0];
    assert_eq!(row["has_capture"], false);
    let resp = get(&format!("{}/api/captures/{}", h.url, row["id"])).await;
    assert_eq!(resp.status, 404);
    h.stop().await;
}

/// After some requests the model has a series with them counted; the system samples carry the
/// machine's memory; `after` filters and a bad `after` is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn performance_counts_requests_per_model() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    chats(&h, 3).await;
    let url = format!("{}/api/performance", h.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let perf = loop {
        let perf = get(&url).await.json();
        let counted: u64 = perf["models"]["m"]
            .as_array()
            .map(|s| s.iter().map(|x| x["requests"].as_u64().unwrap()).sum())
            .unwrap_or(0);
        if counted == 3 {
            break perf;
        }
        assert!(std::time::Instant::now() < deadline, "{perf}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(perf["enabled"], true);
    let sample = perf["models"]["m"].as_array().unwrap().last().unwrap();
    assert!(
        sample["requests_per_second"].as_f64().unwrap() > 0.0,
        "{sample}"
    );
    assert!(sample["ttft_p50_ms"].is_u64(), "{sample}");
    let system = &perf["sys_stats"][0];
    assert!(system["mem_total_mb"].as_u64().unwrap() > 0, "{system}");
    let later = get(&format!("{url}?after=2999-01-01T00:00:00Z"))
        .await
        .json();
    assert_eq!(later["sys_stats"], json!([]));
    assert_eq!(get(&format!("{url}?after=soon")).await.status, 400);
    h.stop().await;
}

/// `performance.disabled: true` answers 503 `{"enabled": false}`, as llama-swap does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn performance_disabled_is_503() {
    let yaml = format!(
        "performance:\n  disabled: true\nmodels:\n{}",
        fake_model("m", "", "")
    );
    let h = Harness::start(&yaml).await;
    let resp = get(&format!("{}/api/performance", h.url)).await;
    assert_eq!((resp.status, resp.json()), (503, json!({"enabled": false})));
    h.stop().await;
}

/// `/api/hardware` has the CPU's cores and the memory; without nvidia-smi the GPUs are the
/// config's devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardware_reports_cpu_memory_and_devices() {
    let yaml = format!(
        "devices:\n  - {{name: gpu0, capacity: 8GiB}}\nmodels:\n{}",
        fake_model("m", "", "")
    );
    let h = Harness::start(&yaml).await;
    let hw = get(&format!("{}/api/hardware", h.url)).await.json();
    assert!(hw["cpu"]["cores"].as_u64().unwrap() > 0, "{hw}");
    assert!(hw["memory"]["capacity_bytes"].as_u64().unwrap() > 0, "{hw}");
    assert_eq!(hw["corral"]["version"], env!("CARGO_PKG_VERSION"));
    let accelerators = hw["accelerators"].as_array().unwrap();
    assert!(!accelerators.is_empty(), "{hw}");
    if accelerators[0]["source"] == "config" {
        assert_eq!(accelerators[0]["name"], "gpu0");
        assert_eq!(accelerators[0]["memory_total_bytes"], 8u64 << 30);
    }
    h.stop().await;
}

/// With nvidia-smi (a fake one here) the GPUs come from it, in `/api/hardware` and as samples in
/// `/api/performance`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_come_from_nvidia_smi() {
    let dir = tempfile::tempdir().unwrap();
    let smi = executable(
        &dir.path().join("nvidia-smi"),
        "#!/bin/sh\necho '0, GPU-fake-0, Fake GPU 24G, 41, 55, 12, 2048, 24576, 120.5'\n",
    );
    let config = dir.path().join("config.yaml");
    let yaml = format!(
        "startPort: {}\nmodels:\n{}",
        free_port_range(4),
        fake_model("m", "", "")
    );
    std::fs::write(&config, yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let env = [("CORRAL_NVIDIA_SMI", smi.as_str())];
    let p = spawn_corral_env(dir, &config, state.path(), &[], &env);
    let hw = get(&format!("{}/api/hardware", p.url)).await.json();
    let gpu = &hw["accelerators"][0];
    assert_eq!(
        (gpu["name"].as_str(), gpu["source"].as_str()),
        (Some("Fake GPU 24G"), Some("nvidia-smi"))
    );
    assert_eq!(gpu["memory_total_bytes"], 24576u64 << 20);
    assert_eq!(gpu["memory_used_bytes"], 2048u64 << 20);
    let url = format!("{}/api/performance", p.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let perf = loop {
        let perf = get(&url).await.json();
        if perf["gpu_stats"][0].is_object() {
            break perf;
        }
        assert!(std::time::Instant::now() < deadline, "{perf}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let sample = &perf["gpu_stats"][0];
    assert_eq!(
        (sample["uuid"].as_str(), sample["gpu_util_pct"].as_f64()),
        (Some("GPU-fake-0"), Some(55.0))
    );
}

/// A burst of `/api/hardware` requests shares one nvidia-smi, rather than start one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_hardware_requests_runs_nvidia_smi_once() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let smi = executable(
        &dir.path().join("nvidia-smi"),
        &format!(
            "#!/bin/sh\necho run >> {}\nsleep 0.2\necho '0, GPU-fake-0, Fake GPU 24G, 41, 55, 12, 2048, 24576, 120.5'\n",
            runs.display()
        ),
    );
    let config = dir.path().join("config.yaml");
    let yaml = format!("models:\n{}", fake_model("m", "", ""));
    std::fs::write(&config, yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let env = [("CORRAL_NVIDIA_SMI", smi.as_str())];
    let p = spawn_corral_env(dir, &config, state.path(), &[], &env);
    let url = format!("{}/api/hardware", p.url);
    let ran = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = ran();
    let burst = (0..16).map(|_| get(&url));
    for hw in futures_util::future::join_all(burst).await {
        assert_eq!(hw.json()["accelerators"][0]["source"], "nvidia-smi");
    }
    // the sampler may take its own reading in the meantime
    assert!(
        ran() - before <= 2,
        "{} runs for 16 requests",
        ran() - before
    );
}
