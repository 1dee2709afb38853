//! `/metrics`: valid exposition, exact counts, bounded labels, and a real Prometheus scraping it.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::*;

/// Finds a tool, or says why the test cannot run: under CI its absence is a failure.
fn tool(name: &str) -> Option<String> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
            .map(|p| p.display().to_string())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed: scripts/test.sh installs it (Debian package prometheus)"
        );
        eprintln!("SKIPPED: {name} is not installed (Debian package prometheus)");
    }
    found
}

async fn scrape(h: &Harness) -> String {
    let resp = get(&format!("{}/metrics", h.url)).await;
    assert_eq!(resp.status, 200);
    resp.text()
}

/// The value of one series, by its exact name and labels as rendered.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
        .collect()
}

fn two_models() -> String {
    format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\n",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    )
}

/// promtool accepts the exposition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_output() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let h = Harness::start(&two_models()).await;
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("a"))
            .await
            .status,
        200
    );
    let text = scrape(&h).await;
    let path = h.path("metrics.txt");
    std::fs::write(&path, &text).unwrap();
    let out = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&path).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    h.stop().await;
}

/// Traffic through two models moves the counters, histograms and gauges by exactly what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_exactly_the_traffic() {
    let h = Harness::start(&two_models()).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let before = scrape(&h).await;
    for _ in 0..3 {
        let r = post_json(&url, &json!({"model": "a", "messages": [{"role": "user", "content": "12345678"}], "fakellm": {"chunks": 4}})).await;
        assert_eq!(r.status, 200);
    }
    let streaming = json!({"model": "b", "stream": true, "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "abcd"}], "fakellm": {"chunks": 6, "interval_ms": 5}});
    for _ in 0..2 {
        assert_eq!(stream_frames(&url, &streaming).await.0.status, 200);
    }
    assert_eq!(
        post_json(
            &format!("{}/v1/embeddings", h.url),
            &json!({"model": "b", "input": "x"})
        )
        .await
        .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = scrape(&h).await;
    let delta = |s: &str| value(&after, s) - value(&before, s);
    assert_eq!(
        delta(r#"corral_requests_total{model="a",route="/v1/chat/completions",status="2xx"}"#),
        3.0,
        "{after}"
    );
    assert_eq!(
        delta(r#"corral_requests_total{model="b",route="/v1/chat/completions",status="2xx"}"#),
        2.0
    );
    assert_eq!(
        delta(r#"corral_requests_total{model="b",route="/v1/embeddings",status="2xx"}"#),
        1.0
    );
    // the fake engine reports prompt tokens as ceil(bytes/4) and one completion token per chunk
    assert_eq!(delta(r#"corral_prompt_tokens_total{model="a"}"#), 6.0);
    assert_eq!(delta(r#"corral_completion_tokens_total{model="a"}"#), 12.0);
    assert_eq!(
        delta(r#"corral_completion_tokens_total{model="b"}"#),
        12.0,
        "tokens read from the SSE stream"
    );
    assert_eq!(
        delta(r#"corral_request_duration_seconds_count{model="a",route="/v1/chat/completions"}"#),
        3.0
    );
    assert_eq!(
        delta(r#"corral_time_to_first_byte_seconds_count{model="b",route="/v1/chat/completions"}"#),
        2.0
    );
    assert_eq!(
        value(
            &after,
            r#"corral_instance_starts_total{instance="a",model="a",result="ready"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            r#"corral_instance_state{instance="a",model="a",state="ready"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            r#"corral_instance_state{instance="a",model="a",state="stopped"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &after,
            r#"corral_in_flight_requests{instance="a",model="a"}"#
        ),
        0.0
    );
    assert_eq!(
        value(&after, r#"corral_load_duration_seconds_count{model="a"}"#),
        1.0
    );

    // an unload shows as a stop with its reason
    assert_eq!(
        post(&format!("{}/api/models/unload/a", h.url)).await.status,
        200
    );
    let unloaded = scrape(&h).await;
    assert_eq!(
        value(
            &unloaded,
            r#"corral_instance_stops_total{instance="a",model="a",reason="unload"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &unloaded,
            r#"corral_instance_state{instance="a",model="a",state="stopped"}"#
        ),
        1.0
    );
    h.stop().await;
}

/// In-flight gauges show a request while it streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_gauge_follows_a_stream() {
    let h = Harness::start(&two_models()).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 10, "interval_ms": 100}});
    let stream = tokio::spawn(async move { stream_frames(&url, &body).await });
    eventually(Duration::from_secs(15), "streaming", || {
        h.count_requests("a", "/v1/chat/completions") == 1
    })
    .await;
    let during = scrape(&h).await;
    assert_eq!(
        value(
            &during,
            r#"corral_in_flight_requests{instance="a",model="a"}"#
        ),
        1.0
    );
    stream.await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        value(
            &scrape(&h).await,
            r#"corral_in_flight_requests{instance="a",model="a"}"#
        ),
        0.0
    );
    h.stop().await;
}

/// 10,000 requests for unknown models add no series: names that are not configured never become labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_never_become_labels() {
    let h = Harness::start(&two_models()).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let before = scrape(&h).await;
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let url = url.clone();
            tokio::spawn(async move {
                for i in 0..2500 {
                    let r = post_json(&url, &json!({"model": format!("nope-{t}-{i}")})).await;
                    assert_eq!(r.status, 404);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = scrape(&h).await;
    let new: Vec<_> = series(&after)
        .difference(&series(&before))
        .cloned()
        .collect();
    assert!(new.is_empty(), "new series: {new:?}");
    assert_eq!(
        value(&after, "corral_unknown_model_requests_total")
            - value(&before, "corral_unknown_model_requests_total"),
        10_000.0
    );
    h.stop().await;
}

/// A real Prometheus server scrapes corral on loopback and finds a corral series through its API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_corral() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let h = Harness::start(&two_models()).await;
    let target = h.url.trim_start_matches("http://").to_string();
    let port = free_port_range(1);
    let config = h.path("prometheus.yml");
    std::fs::write(&config, format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: corral\n    static_configs: [{{targets: ['{target}']}}]\n")).unwrap();
    let mut server = std::process::Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", h.path("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(h.path("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    let query = format!("http://127.0.0.1:{port}/api/v1/query?query=corral_build_info");
    let mut found = None;
    for _ in 0..150 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(Ok(resp)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::spawn({
                let q = query.clone();
                async move { get(&q).await }
            }),
        )
        .await
        else {
            continue;
        };
        if resp.status == 200
            && resp.json()["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        {
            found = Some(resp.json());
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let found = found.unwrap_or_else(|| {
        panic!(
            "prometheus never found corral_build_info: {}",
            std::fs::read_to_string(h.path("prometheus.log")).unwrap_or_default()
        )
    });
    assert_eq!(found["data"]["result"][0]["metric"]["job"], "corral");
    h.stop().await;
}

/// The gauges an inference gateway's endpoint picker reads: with a pool of two one-slot replicas
/// serving two streams and two more requests queued, corral reports 2 running, 2 waiting and a full
/// KV cache, for the pod and for the pool, and the same under vLLM's names when asked to (KV-cache
/// use under both names vLLM has used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_pickers_gauges_follow_queued_and_running_work() {
    let yaml = format!(
        "vllmMetricNames: true\nmodels:\n{}",
        fake_model("p", "", "replicas: 2\nstartReplicas: all")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("p")).await.status, 200, "warm up");
    h.wait_ready(&["p-0", "p-1"], Duration::from_secs(15)).await;
    let long = json!({"model": "p", "stream": true, "messages": [], "fakellm": {"chunks": 20, "interval_ms": 100}});
    let streams: Vec<_> = (0..4)
        .map(|_| {
            let (url, body) = (url.clone(), long.clone());
            tokio::spawn(async move { stream_frames(&url, &body).await })
        })
        .collect();
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(&h).await;
        if value(&text, "corral_requests_waiting") == 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (name, want) in [
        ("corral_requests_waiting", 2.0),
        ("corral_requests_running", 2.0),
        ("corral_kv_cache_usage_ratio", 1.0),
        (r#"corral_model_requests_waiting{model="p"}"#, 2.0),
        (r#"corral_model_requests_running{model="p"}"#, 2.0),
        (r#"corral_model_kv_cache_usage_ratio{model="p"}"#, 1.0),
        ("vllm:num_requests_waiting", 2.0),
        ("vllm:num_requests_running", 2.0),
        ("vllm:kv_cache_usage_perc", 1.0),
        ("vllm:gpu_cache_usage_perc", 1.0),
    ] {
        assert_eq!(value(&text, name), want, "{name} in:\n{text}");
    }
    for family in [
        "corral_requests_waiting",
        "corral_kv_cache_usage_ratio",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
    ] {
        assert!(text.contains(&format!("# TYPE {family} gauge")), "{family}");
    }
    for s in streams {
        s.await.unwrap();
    }
    let idle = scrape(&h).await;
    assert_eq!(value(&idle, "corral_requests_running"), 0.0);
    assert_eq!(value(&idle, "corral_kv_cache_usage_ratio"), 0.0);
    h.stop().await;
}

/// Without `vllmMetricNames`, nothing appears under vLLM's names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_names_only_when_asked_for() {
    let h = Harness::start(&two_models()).await;
    let text = scrape(&h).await;
    assert!(text.contains("corral_requests_waiting"), "{text}");
    assert!(!text.contains("vllm:"), "{text}");
    h.stop().await;
}
