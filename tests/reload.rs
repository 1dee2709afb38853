//! Reloading the config: SIGHUP and --watch-config, through a symlink too. A model whose process
//! did not change keeps running and serving; a bad config is refused and the old one stays.

mod support;

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use support::process::*;
use support::*;

fn config(port: u16, b_flag: &str, extra_model: &str) -> String {
    format!(
        "startPort: {port}\nmodels:\n{}{}{}groups:\n  all: {{swap: false, members: [a, b{}]}}\n",
        fake_model("a", "", ""),
        fake_model("b", b_flag, ""),
        extra_model,
        if extra_model.is_empty() { "" } else { ", c" }
    )
}

fn spawned(dir: &std::path::Path, model: &str) -> usize {
    read_events(&dir.join(format!("{model}.events")))
        .iter()
        .filter(|e| e["event"] == "spawned")
        .count()
}

/// SIGHUP applies a new config while a stream runs: the unchanged model keeps its process and its
/// stream; the changed one restarts with its new command; a new model appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reload_keeps_unchanged_models_serving() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_range(8);
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config(port, "", "")).unwrap();
    let mut p = spawn_corral_with(dir, &path, state.path(), &[]);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 20, "interval_ms": 100}});
    let stream = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    std::fs::write(
        &path,
        config(port, "--alias changed", &fake_model("c", "", "")),
    )
    .unwrap();
    signal(&p.child, Signal::SIGHUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        post_json(&url, &chat("c")).await.status,
        200,
        "the new model is served"
    );
    let b = post_json(&url, &chat("b")).await;
    assert_eq!(b.status, 200);
    assert_eq!(
        spawned(p.dir.path(), "b"),
        2,
        "b restarted with its new command"
    );
    assert!(read_events(&p.dir.path().join("b.events")).last().is_some());

    let (resp, frames) = stream.await.unwrap();
    assert_eq!(resp.status, 200);
    let text: String = frames_text(&frames);
    assert_eq!(
        text.matches(r#""content":"tok"#).count(),
        20,
        "the stream went on through the reload"
    );
    assert!(text.contains("[DONE]"));
    assert_eq!(spawned(p.dir.path(), "a"), 1, "a kept its process");

    // a broken config is refused and the running one stays
    std::fs::write(&path, "models:\n  a: {cmd: [unclosed\n").unwrap();
    signal(&p.child, Signal::SIGHUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    let metrics = get(&format!("{}/metrics", p.url)).await.text();
    assert!(
        metrics.contains(r#"corral_config_reloads_total{result="failure"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"corral_config_reloads_total{result="success"} 1"#));
    signal(&p.child, Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut p.child, Duration::from_secs(20))
            .await
            .code(),
        Some(0)
    );
    assert_no_survivors(&p.marker, Duration::from_secs(2)).await;
}

/// --watch-config notices a config reached through a symlink that is swapped (the ConfigMap way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_config_follows_a_swapped_symlink() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_range(8);
    let v1 = dir.path().join("v1.yaml");
    let v2 = dir.path().join("v2.yaml");
    std::fs::write(&v1, config(port, "", "")).unwrap();
    std::fs::write(&v2, config(port, "", &fake_model("c", "", ""))).unwrap();
    let link = dir.path().join("config.yaml");
    std::os::unix::fs::symlink(&v1, &link).unwrap();
    let mut p = spawn_corral_with(dir, &link, state.path(), &["-watch-config"]);
    let list = |p: &Proc| {
        let url = format!("{}/v1/models", p.url);
        async move { get(&url).await.json()["data"].as_array().unwrap().len() }
    };
    assert_eq!(list(&p).await, 2);
    // swap the link atomically, as kubelet does
    let tmp = p.dir.path().join("config.yaml.tmp");
    std::os::unix::fs::symlink(&v2, &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    let mut seen = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        seen = list(&p).await;
        if seen == 3 {
            break;
        }
    }
    assert_eq!(seen, 3, "the swapped config was applied");
    signal(&p.child, Signal::SIGTERM);
    wait_exit(&mut p.child, Duration::from_secs(20)).await;
}

/// What a request that waits out a reload gets, within `limit`; fails the test if it is still
/// waiting then.
async fn answered_within(limit: Duration, waiting: tokio::task::JoinHandle<Resp>) -> Resp {
    tokio::time::timeout(limit, waiting)
        .await
        .expect("the request was still waiting")
        .unwrap()
}

/// The pool `p` of two replicas on the fake engine with `flags`, both started at once.
fn pool(port: u16, flags: &str) -> String {
    let extra = "replicas: 2\nstartReplicas: all";
    format!(
        "startPort: {port}\nmodels:\n{}",
        fake_model("p", flags, extra)
    )
}

/// corral serving a config file that a test rewrites and reloads with SIGHUP.
struct Reloaded {
    p: Proc,
    path: std::path::PathBuf,
    url: String,
    _state: tempfile::TempDir,
}

impl Reloaded {
    /// corral on the config `yaml`.
    fn start(yaml: &str) -> Reloaded {
        let state = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let p = spawn_corral_with(dir, &path, state.path(), &[]);
        let url = format!("{}/v1/chat/completions", p.url);
        Reloaded {
            p,
            path,
            url,
            _state: state,
        }
    }

    /// The config rewritten and reloaded.
    fn reload(&self, yaml: &str) {
        std::fs::write(&self.path, yaml).unwrap();
        signal(&self.p.child, Signal::SIGHUP);
    }

    /// Stops corral, which must not have panicked, and checks that nothing it ran is left.
    async fn stop(mut self) {
        let log = std::fs::read_to_string(self.p.dir.path().join("corral.stderr"));
        assert!(!log.unwrap_or_default().contains("panicked"));
        signal(&self.p.child, Signal::SIGTERM);
        wait_exit(&mut self.p.child, Duration::from_secs(20)).await;
        assert_no_survivors(&self.p.marker, Duration::from_secs(2)).await;
    }
}

/// A request for a model a reload changed, arriving while the old process still streams, waits
/// for that stream to end and is then served by the new process; its place is kept through the
/// replacement, so the requests after it are served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_changed_busy_model_is_served_by_its_new_process() {
    let port = free_port_range(8);
    let r = Reloaded::start(&config(port, "", ""));
    let url = r.url.clone();
    let long = json!({"model": "b", "stream": true, "messages": [], "fakellm": {"chunks": 10, "interval_ms": 100}});
    let stream = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.reload(&config(port, "--alias changed", ""));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let waiting = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &chat("b")).await }
    });
    let resp = answered_within(Duration::from_secs(15), waiting).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let (streamed, frames) = stream.await.unwrap();
    assert_eq!(streamed.status, 200);
    assert_eq!(
        frames_text(&frames).matches(r#""content":"tok"#).count(),
        10
    );
    assert_eq!(
        spawned(r.p.dir.path(), "b"),
        2,
        "b restarted with its new command"
    );
    for _ in 0..3 {
        assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    }
    r.stop().await;
}

/// A request waiting for a model that is still loading when a reload removes it gets an answer
/// once the model is stopped, rather than waiting on a model nothing will ever serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_removed_model_is_answered() {
    let models =
        |port: u16, b: &str| format!("startPort: {port}\nmodels:\n{}{b}", fake_model("a", "", ""));
    let port = free_port_range(8);
    let r = Reloaded::start(&models(port, &fake_model("b", "--loading-ms 1500", "")));
    let url = r.url.clone();
    let waiting = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &chat("b")).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.reload(&models(port, ""));

    let resp = answered_within(Duration::from_secs(10), waiting).await;
    assert!(resp.status >= 400, "{} {}", resp.status, resp.text());
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    r.stop().await;
}

/// A pool kept busy while a reload changes its command is replaced member by member: one at a
/// time takes no new requests, finishes its own and restarts while the other serves, so the
/// change takes effect though the pool is never idle, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_is_replaced_member_by_member() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let port = free_port_range(8);
    let r = Reloaded::start(&pool(port, "-np 2"));
    let url = r.url.clone();
    assert_eq!(post_json(&url, &chat("p")).await.status, 200);
    let events = r.p.dir.path().to_path_buf();
    eventually(Duration::from_secs(15), "both replicas up", || {
        spawned(&events, "p") == 2
    })
    .await;

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let busy = json!({"model": "p", "stream": true, "messages": [], "fakellm": {"chunks": 4, "interval_ms": 50}});
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (url, busy, stop) = (url.clone(), busy.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    statuses.push(stream_frames(&url, &busy).await.0.status);
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.reload(&pool(port, "-np 2 --alias changed"));
    eventually(Duration::from_secs(30), "both replicas restarted", || {
        spawned(&events, "p") == 4
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let statuses = client.await.unwrap();
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
    r.stop().await;
}

/// A request waiting for a pool whose replicas still load when a reload changes them is served by
/// their successors: the starts the reload called off are not the replicas failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_loading_pool_outlives_its_reload() {
    let port = free_port_range(8);
    let r = Reloaded::start(&pool(port, "--loading-ms 1000"));
    let url = r.url.clone();
    let waiting = tokio::spawn(async move { post_json(&url, &chat("p")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.reload(&pool(port, "--loading-ms 1000 --alias changed"));
    let resp = answered_within(Duration::from_secs(15), waiting).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    r.stop().await;
}

/// Engines of `model` told to stop (SIGTERM).
fn stopped(dir: &std::path::Path, model: &str) -> usize {
    read_events(&dir.join(format!("{model}.events")))
        .iter()
        .filter(|e| e["event"] == "sigterm")
        .count()
}

/// True when no change of ready replicas after the first left the pool with none.
fn never_none(scaled: &[(u64, u64)]) -> bool {
    !scaled.iter().skip(1).any(|&(_, to)| to == 0)
}

/// The pool `p`'s ready replicas as its `nodes_scaled` events told them, `(from, to)`, once
/// `settled` says they are all there, or when one leaves it with none, or after 15 s. Changes
/// that follow each other closely may be told as one, so a test asserts what no merging hides.
async fn ready_replicas(r: &Reloaded, settled: impl Fn(&[(u64, u64)]) -> bool) -> Vec<(u64, u64)> {
    let lifecycle = format!("{}/api/lifecycle", r.p.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let scaled: Vec<(u64, u64)> = get(&lifecycle).await.json()["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "nodes_scaled" && e["model"] == "p")
            .map(|e| (e["from"].as_u64().unwrap(), e["to"].as_u64().unwrap()))
            .collect();
        let none = !never_none(&scaled);
        if settled(&scaled) || none || std::time::Instant::now() > deadline {
            return scaled;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A lightly used pool that a reload changes starts another replica before its one ready replica
/// stops for the change: the pool is never without a ready replica, though no request asks for
/// one, where its replica used to stop at its first idle moment and the next request waited for
/// a load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_pool_keeps_a_ready_replica_through_its_reload() {
    let port = free_port_range(8);
    let light = |flags: &str| {
        format!(
            "startPort: {port}\nmodels:\n{}",
            fake_model("p", flags, "replicas: 2")
        )
    };
    let r = Reloaded::start(&light("-np 2"));
    assert_eq!(post_json(&r.url, &chat("p")).await.status, 200);
    assert_eq!(spawned(r.p.dir.path(), "p"), 1, "one replica serves");
    r.reload(&light("-np 2 --loading-ms 500 --alias changed"));

    let dir = r.p.dir.path().to_path_buf();
    let replaced = || spawned(&dir, "p") == 2 && stopped(&dir, "p") == 1;
    let scaled = ready_replicas(&r, |_| replaced()).await;
    assert!(
        replaced(),
        "the other replica started, then the old one stopped"
    );
    assert!(never_none(&scaled), "ready replicas: {scaled:?}");
    assert_eq!(post_json(&r.url, &chat("p")).await.status, 200);
    r.stop().await;
}

/// An idle pool of two ready replicas that a reload changes restarts them one after the other:
/// the second serves until the first is back, where both used to stop at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_is_restarted_one_replica_at_a_time() {
    let port = free_port_range(8);
    let r = Reloaded::start(&pool(port, "-np 2"));
    assert_eq!(post_json(&r.url, &chat("p")).await.status, 200);
    let started = ready_replicas(&r, |s| s.last().map(|s| s.1) == Some(2)).await;
    assert_eq!(started.last().map(|s| s.1), Some(2), "{started:?}");
    r.reload(&pool(port, "-np 2 --loading-ms 500 --alias changed"));

    let dir = r.p.dir.path().to_path_buf();
    let restarted = || spawned(&dir, "p") == 3 && stopped(&dir, "p") == 2;
    let scaled = ready_replicas(&r, |_| restarted()).await;
    assert!(restarted(), "one replica restarted, then the other stopped");
    assert!(never_none(&scaled), "ready replicas: {scaled:?}");
    assert_eq!(post_json(&r.url, &chat("p")).await.status, 200);
    r.stop().await;
}

/// A GET whose answer streams; the task reads it to its end.
async fn streaming(url: &str) -> tokio::task::JoinHandle<()> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let req = http::Request::get(url)
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    let mut body = resp.into_body();
    tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} })
}

/// Streams opened before a reload (`/api/events`, `/logs/stream`) end with it, so none goes on
/// under the keys, masks and config it began with: a client opens them again under the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_at_a_reload() {
    let port = free_port_range(8);
    let r = Reloaded::start(&config(port, "", ""));
    let events = streaming(&format!("{}/api/events", r.p.url)).await;
    let logs = streaming(&format!("{}/logs/stream", r.p.url)).await;
    r.reload(&config(port, "--alias changed", ""));
    for stream in [events, logs] {
        tokio::time::timeout(Duration::from_secs(10), stream)
            .await
            .expect("the stream ended")
            .unwrap();
    }
    let again = streaming(&format!("{}/api/events", r.p.url)).await;
    assert!(!again.is_finished());
    again.abort();
    r.stop().await;
}

/// The gauges of what a reload removed (a model, a replica past the new count) go with it, where
/// they stood at their last values before; the counters stay, as counters must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_removes_the_gauges_of_what_it_removed() {
    const GAUGES: [&str; 12] = [
        "corral_in_flight_requests{",
        "corral_slots{",
        "corral_slots_free{",
        "corral_instance_state{",
        "corral_model_status{",
        "corral_instance_consecutive_failures{",
        "corral_instance_circuit_open{",
        "corral_instance_memory_estimate_bytes{",
        "corral_instance_memory_measured_bytes{",
        "corral_model_requests_waiting{",
        "corral_model_requests_running{",
        "corral_model_kv_cache_usage_ratio{",
    ];
    let port = free_port_range(8);
    let config = |replicas: u32, with_a: bool| {
        let a = if with_a {
            fake_model("a", "", "")
        } else {
            String::new()
        };
        let p = fake_model(
            "p",
            "",
            &format!("replicas: {replicas}\nstartReplicas: all"),
        );
        format!("startPort: {port}\nmodels:\n{a}{p}")
    };
    let r = Reloaded::start(&config(3, true));
    assert_eq!(post_json(&r.url, &chat("a")).await.status, 200);
    assert_eq!(post_json(&r.url, &chat("p")).await.status, 200);
    let metrics = format!("{}/metrics", r.p.url);
    let removed = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| GAUGES.iter().any(|g| l.starts_with(g)))
            .filter(|l| l.contains(r#"model="a""#) || l.contains(r#"instance="p-2""#))
            .map(String::from)
            .collect()
    };
    let before = get(&metrics).await.text();
    assert!(before.contains(r#"corral_instance_state{instance="a",model="a",state="ready"}"#));
    assert!(before.contains(r#"corral_model_status{model="a",status="active"}"#));
    assert!(before.contains(r#"corral_slots{instance="p-2",model="p"}"#));

    r.reload(&config(2, false));
    let mut left = removed(&before);
    for _ in 0..100 {
        left = removed(&get(&metrics).await.text());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "left standing: {left:#?}");
    let after = get(&metrics).await.text();
    assert!(after.contains(r#"corral_slots{instance="p-1",model="p"}"#));
    assert!(
        after
            .lines()
            .any(|l| l.starts_with("corral_requests_total{") && l.contains(r#"model="a""#)),
        "the removed model's request counts stay"
    );
    r.stop().await;
}
