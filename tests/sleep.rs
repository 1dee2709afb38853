//! Sleep and wake against the fake engine's imitation of vLLM's sleep mode: a swap puts the idle
//! engine to sleep and keeps its process, the swap back wakes that same process, a failed sleep
//! stops it, a failed wake starts it cold, a busy engine is never put to sleep, and level 1
//! sleepers are charged host memory, which a start that needs it takes back.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::process::*;
use support::*;

const WITHIN: Duration = Duration::from_secs(20);

/// A config of vLLM models served by the fake engine, each `(id, fake flags, extra keys)`, all
/// sleeping (`sleepMode: enable`) unless their keys say otherwise, after `top`.
fn config(snapshot: &std::path::Path, top: &str, models: &[(&str, &str, &str)]) -> String {
    let mut yaml = format!(
        "engines:\n  vllm: {{command: '${{env.ENGINE}} --imitate vllm serve'}}\n{top}models:\n"
    );
    for (id, flags, extra) in models {
        let flags: String = flags
            .split_whitespace()
            .map(|f| format!(", '{f}'"))
            .collect();
        yaml.push_str(&format!(
            "  {id}:\n    engine: vllm\n    source: {}\n    env: [\"${{env.MARKER}}\"]\n    args: [--events-file, '${{env.DIR}}/{id}.events'{flags}]\n",
            snapshot.display()
        ));
        if !extra.contains("sleepMode") {
            yaml.push_str("    sleepMode: enable\n");
        }
        for line in extra.lines().filter(|l| !l.trim().is_empty()) {
            yaml.push_str(&format!("    {line}\n"));
        }
    }
    yaml
}

fn snapshot() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    dir
}

async fn ask(h: &Harness, model: &str) -> Resp {
    post_json(&format!("{}/v1/chat/completions", h.url), &chat(model)).await
}

/// corral over `models` (after no top-level keys), with `a` served and then `b`, whose swap put
/// `a` away; the snapshot folder lives as long as the returned guard.
async fn swapped_a_for_b(models: &[(&str, &str, &str)]) -> (tempfile::TempDir, Harness) {
    let dir = snapshot();
    let h = Harness::start(&config(dir.path(), "", models)).await;
    assert_eq!(ask(&h, "a").await.status, 200);
    assert_eq!(ask(&h, "b").await.status, 200);
    (dir, h)
}

/// Each instance's state as `/running` shows it.
async fn states(h: &Harness) -> Vec<(String, String)> {
    let list = get(&format!("{}/running", h.url)).await.json();
    let mut out: Vec<(String, String)> = list["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let state = m["state"].as_str().unwrap_or_default().to_string();
            (m["model"].as_str().unwrap().to_string(), state)
        })
        .collect();
    out.sort();
    out
}

/// The pids the fake engine of `model` ran as.
fn pids(h: &Harness, model: &str) -> Vec<u64> {
    let mut pids: Vec<u64> = h
        .events(model)
        .iter()
        .filter(|e| e["event"] == "spawned")
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    pids.dedup();
    pids
}

/// The sleep and wake calls `model`'s engine took, as `path status`.
fn sleep_calls(h: &Harness, model: &str) -> Vec<String> {
    h.events(model)
        .iter()
        .filter(|e| e["event"] == "sleep_call")
        .map(|e| format!("{} {}", e["path"].as_str().unwrap(), e["status"]))
        .collect()
}

async fn metrics(h: &Harness) -> String {
    get(&format!("{}/metrics", h.url)).await.text()
}

/// True when `model`'s instances were stopped once for `reason`.
fn stopped_once(text: &str, model: &str, reason: &str) -> bool {
    let (model, reason) = (format!("model=\"{model}\""), format!("reason=\"{reason}\""));
    let labels = [model.as_str(), reason.as_str()];
    has_line(text, "corral_instance_stops_total", &labels, "1")
}

fn has_line(text: &str, name: &str, labels: &[&str], value: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with(name)
            && labels.iter().all(|x| l.contains(x))
            && l.ends_with(&format!(" {value}"))
    })
}

/// A swap puts the idle engine to sleep: its process stays, `/running`, `/v1/models` and
/// `/api/models` show it sleeping; the swap back wakes the same process, with no new spawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_sleeps_the_idle_engine_and_the_swap_back_wakes_the_same_process() {
    let (_dir, h) = swapped_a_for_b(&[("a", "--wake-ms 50", ""), ("b", "", "")]).await;
    assert_eq!(sleep_calls(&h, "a"), ["/sleep 200"]);
    let asleep = states(&h).await;
    assert_eq!(
        asleep,
        [
            ("a".into(), "sleeping".into()),
            ("b".into(), "ready".into())
        ]
    );
    let listed = get(&format!("{}/v1/models", h.url)).await.json();
    let a = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "a")
        .unwrap()
        .clone();
    assert_eq!(a["status"]["value"], "sleeping", "{a}");
    let detail = get(&format!("{}/api/models/a", h.url)).await.json();
    assert_eq!(detail["status"], "sleeping", "{detail}");

    let back = ask(&h, "a").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(pids(&h, "a").len(), 1, "woken, not started again");
    assert_eq!(sleep_calls(&h, "a"), ["/sleep 200", "/wake_up 200"]);
    assert_eq!(sleep_calls(&h, "b"), ["/sleep 200"]);
    let text = metrics(&h).await;
    assert!(
        has_line(
            &text,
            "corral_sleeps_total",
            &["model=\"a\"", "result=\"ok\""],
            "1"
        ),
        "{text}"
    );
    assert!(
        has_line(
            &text,
            "corral_wakes_total",
            &["model=\"a\"", "result=\"ok\""],
            "1"
        ),
        "{text}"
    );
    assert!(
        has_line(
            &text,
            "corral_wake_duration_seconds_count",
            &["model=\"a\""],
            "1"
        ),
        "{text}"
    );
    for (how, count) in [("cold", "1"), ("wake", "1")] {
        let how = format!("how=\"{how}\"");
        let labels = ["model=\"a\"", how.as_str()];
        assert!(
            has_line(&text, "corral_swap_duration_seconds_count", &labels, count),
            "{how}: {text}"
        );
    }
    let status = ["model=\"b\"", "status=\"sleeping\""];
    assert!(
        has_line(&text, "corral_model_status", &status, "1"),
        "{text}"
    );
    let lifecycle = get(&format!("{}/api/lifecycle", h.url)).await.text();
    assert!(
        lifecycle.contains("\"slept\"") && lifecycle.contains("\"woke\""),
        "{lifecycle}"
    );

    // a sleeper is stopped by an unload like any running engine
    assert_eq!(get(&format!("{}/unload", h.url)).await.status, 200);
    assert!(states(&h).await.is_empty());
    assert_eq!(h.count_events("b", "sigterm"), 1);
    h.stop().await;
}

/// At level 2 the weights are gone: the wake makes vLLM's three calls, and the engine serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_two_sleeper_wakes_with_its_weights_reloaded() {
    let dir = snapshot();
    let models = [("a", "", "sleepLevel: 2"), ("b", "", "")];
    let h = Harness::start(&config(dir.path(), "", &models)).await;
    for model in ["a", "b", "a"] {
        let resp = ask(&h, model).await;
        assert_eq!(resp.status, 200, "{model}: {}", resp.text());
    }
    assert_eq!(
        sleep_calls(&h, "a"),
        [
            "/sleep 200",
            "/wake_up 200",
            "/collective_rpc 200",
            "/reset_prefix_cache 200"
        ]
    );
    assert_eq!(pids(&h, "a").len(), 1);
    h.stop().await;
}

/// An engine whose sleep fails is stopped instead; the request that wanted the swap is served,
/// and the next request for the engine starts it cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sleep_stops_the_engine() {
    let (_dir, h) =
        swapped_a_for_b(&[("a", "--fail-sleep", ""), ("b", "", "sleepMode: disable")]).await;
    assert_eq!(sleep_calls(&h, "a"), ["/sleep 500"]);
    assert_eq!(states(&h).await, [("b".into(), "ready".into())]);
    let text = metrics(&h).await;
    assert!(stopped_once(&text, "a", "sleep_failed"), "{text}");
    assert!(
        has_line(&text, "corral_sleeps_total", &["result=\"failed\""], "1"),
        "{text}"
    );
    assert_eq!(ask(&h, "a").await.status, 200);
    assert_eq!(pids(&h, "a").len(), 2, "started cold");
    h.stop().await;
}

/// An engine whose wake fails is stopped and started cold, and the request waiting for it is
/// served by the new process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wake_starts_the_engine_cold() {
    let (_dir, h) = swapped_a_for_b(&[("a", "--fail-wake", ""), ("b", "", "")]).await;
    let back = ask(&h, "a").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(
        pids(&h, "a").len(),
        2,
        "a new process after the failed wake"
    );
    assert_eq!(sleep_calls(&h, "a"), ["/sleep 200", "/wake_up 500"]);
    let text = metrics(&h).await;
    assert!(
        has_line(
            &text,
            "corral_wakes_total",
            &["model=\"a\"", "result=\"failed\""],
            "1"
        ),
        "{text}"
    );
    assert!(stopped_once(&text, "a", "wake_failed"), "{text}");
    h.stop().await;
}

/// A swap waits for the engine's request in flight; only then is the engine put to sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_engine_is_never_put_to_sleep() {
    let dir = snapshot();
    let models = [("a", "--response-delay-ms 600", ""), ("b", "", "")];
    let h = Harness::start(&config(dir.path(), "", &models)).await;
    assert_eq!(ask(&h, "a").await.status, 200);
    let url = h.url.clone();
    let slow =
        tokio::spawn(
            async move { post_json(&format!("{url}/v1/chat/completions"), &chat("a")).await },
        );
    let requests = |h: &Harness| h.count_requests("a", "/v1/chat/completions");
    eventually(WITHIN, "a's second request", || requests(&h) == 2).await;
    assert_eq!(ask(&h, "b").await.status, 200);
    assert_eq!(
        slow.await.unwrap().status,
        200,
        "served whole, not cut by a sleep"
    );
    let events = h.events("a");
    let position = |what: &dyn Fn(&Value) -> bool| events.iter().rposition(what).unwrap();
    let served = position(&|e| e["event"] == "done" && e["path"] == "/v1/chat/completions");
    let slept = position(&|e| e["event"] == "sleep_call");
    assert!(served < slept, "slept only once idle: {events:?}");
    h.stop().await;
}

/// Memory pressure outside a swap group puts the idle engine to sleep: its device charge drops to
/// a residue and the other model fits beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_sleeps_an_idle_engine_down_to_its_residue() {
    let dir = snapshot();
    let top = "devices:\n  - {name: gpu0, capacity: 10GiB}\ngroups:\n  all: {swap: false, exclusive: false, members: [a, b]}\n";
    let models = [("a", "", "memory: 6GiB"), ("b", "", "memory: 6GiB")];
    let h = Harness::start(&config(dir.path(), top, &models)).await;
    assert_eq!(ask(&h, "a").await.status, 200);
    assert_eq!(ask(&h, "b").await.status, 200);
    assert_eq!(
        states(&h).await,
        [
            ("a".into(), "sleeping".into()),
            ("b".into(), "ready".into())
        ]
    );
    assert_eq!(pids(&h, "a").len(), 1);
    h.stop().await;
}

/// Level 1 sleepers hold their weights in host memory: with room for one, the older sleeper is
/// stopped when the next swap needs that room for its own sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_memory_is_charged_to_level_one_sleepers_and_the_oldest_makes_room() {
    let dir = snapshot();
    let top = "hostMemory: 1536MiB\n";
    let models = [
        ("a", "", "memory: 1GiB"),
        ("b", "", "memory: 1GiB"),
        ("c", "", "memory: 1GiB"),
    ];
    let h = Harness::start(&config(dir.path(), top, &models)).await;
    for model in ["a", "b", "c"] {
        assert_eq!(ask(&h, model).await.status, 200, "{model}");
    }
    assert_eq!(
        states(&h).await,
        [
            ("b".into(), "sleeping".into()),
            ("c".into(), "ready".into())
        ]
    );
    let text = metrics(&h).await;
    assert!(stopped_once(&text, "a", "memory"), "{text}");
    h.stop().await;
}

/// A start that needs host memory (`memory.host`) stops a level-1 sleeper holding it, oldest
/// first, where `hostMemory` has no room for both; with room, the sleeper stays; a start the limit
/// could never hold is refused with what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_needs_host_memory_stops_a_sleeper_for_it() {
    let dir = snapshot();
    let models = [
        ("a", "", "memory: 1GiB"),
        (
            "cpu",
            "",
            "sleepMode: disable\nmemory: {bytes: 64MiB, host: 1GiB}",
        ),
        (
            "huge",
            "",
            "sleepMode: disable\nmemory: {bytes: 64MiB, host: 8GiB}",
        ),
    ];
    for (limit, a_after) in [("1536MiB", None), ("4GiB", Some("sleeping"))] {
        let top = format!("hostMemory: {limit}\n");
        let h = Harness::start(&config(dir.path(), &top, &models)).await;
        assert_eq!(ask(&h, "a").await.status, 200);
        assert_eq!(ask(&h, "cpu").await.status, 200, "{limit}");
        let mut want = vec![("cpu".to_string(), "ready".to_string())];
        if let Some(state) = a_after {
            want.insert(0, ("a".into(), state.into()));
        }
        assert_eq!(states(&h).await, want, "hostMemory {limit}");
        let text = metrics(&h).await;
        let a_stopped = stopped_once(&text, "a", "memory");
        assert_eq!(a_stopped, a_after.is_none(), "hostMemory {limit}: {text}");
        // the CPU model's 1 GiB, and the sleeper's weights while it sleeps
        let charged = if a_after.is_some() {
            2u64 << 30
        } else {
            1 << 30
        };
        assert!(
            has_line(
                &text,
                "corral_host_memory_charged_bytes",
                &[],
                &charged.to_string()
            ),
            "{text}"
        );
        let state = get(&format!("{}/api/state", h.url)).await.json();
        let host = &state["host"];
        assert_eq!(host["charged"].as_u64(), Some(charged), "{host}");
        let cpu = state["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == "cpu")
            .cloned()
            .unwrap();
        assert_eq!(cpu["host"].as_u64(), Some(1 << 30), "{cpu}");
        let huge = ask(&h, "huge").await;
        assert_eq!(huge.status, 503, "{}", huge.text());
        let why = huge.text();
        assert!(
            why.contains("8.00 GiB of host memory") && why.contains("hostMemory is"),
            "{why}"
        );
        h.stop().await;
    }
}

/// A pool replica that memory pressure would stop sleeps instead, and the pool's next request
/// wakes that same process before it starts any replica cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replica_sleeps_under_pressure_and_is_woken_before_a_cold_start() {
    let dir = snapshot();
    let top = "devices:\n  - {name: cuda0, capacity: 24GiB, reserve: 0}\n";
    let models = [
        ("chat", "", "replicas: 2\nmemory: 10GiB"),
        ("big", "", "sleepMode: disable\nmemory: 20GiB"),
    ];
    let h = Harness::start(&config(dir.path(), top, &models)).await;
    assert_eq!(ask(&h, "chat").await.status, 200);
    assert_eq!(ask(&h, "big").await.status, 200);
    let slept = states(&h).await;
    let chat: Vec<&(String, String)> = slept.iter().filter(|(m, _)| m != "big").collect();
    assert_eq!(chat.len(), 1, "one replica ran: {slept:?}");
    assert_eq!(chat[0].1, "sleeping", "{slept:?}");
    assert_eq!(sleep_calls(&h, "chat"), ["/sleep 200"]);

    let back = ask(&h, "chat").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(pids(&h, "chat").len(), 1, "woken, no replica started cold");
    assert_eq!(sleep_calls(&h, "chat"), ["/sleep 200", "/wake_up 200"]);
    let text = metrics(&h).await;
    assert!(stopped_once(&text, "big", "memory"), "{text}");
    h.stop().await;
}

/// `corral check` warns about a vLLM command that enables sleep without the flag and the
/// environment vLLM's sleep routes need, and refuses a sleep key it cannot read.
#[test]
fn check_warns_about_a_vllm_command_without_sleep_mode_and_refuses_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    let check = |yaml: &str| {
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new(CORRAL)
            .args(["check", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let vllm = "models:\n  m:\n    cmd: vllm serve /m --port ${PORT}\n    sleepMode: enable\n    sleepEndpoints: [{endpoint: /sleep}]\n    wakeEndpoints: [{endpoint: /wake_up}]\n";
    let (ok, text) = check(vllm);
    assert!(ok, "{text}");
    assert!(
        text.contains("--enable-sleep-mode") && text.contains("VLLM_SERVER_DEV_MODE=1"),
        "{text}"
    );
    let (ok, text) = check("models:\n  m:\n    cmd: srv --port ${PORT}\n    sleepMode: enable\n");
    assert!(!ok, "{text}");
    assert!(text.contains("models.m.sleepMode"), "{text}");
}

/// A wake that passes `wakeTimeout` is given up: the engine is stopped and started cold, and the
/// request waiting for it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_past_its_deadline_starts_the_engine_cold() {
    let (_dir, h) =
        swapped_a_for_b(&[("a", "--wake-ms 5000", "wakeTimeout: 1"), ("b", "", "")]).await;
    let began = std::time::Instant::now();
    let back = ask(&h, "a").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "not held for the slow wake"
    );
    assert_eq!(pids(&h, "a").len(), 2, "started cold");
    let text = metrics(&h).await;
    assert!(
        has_line(
            &text,
            "corral_wakes_total",
            &["model=\"a\"", "result=\"failed\""],
            "1"
        ),
        "{text}"
    );
    h.stop().await;
}

/// Polls `/v1/models` until `model`'s router status reads `want`.
async fn router_status_becomes(h: &Harness, model: &str, want: &str) {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let listed = get(&format!("{}/v1/models", h.url)).await.json();
        let entry = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == model)
            .cloned();
        let status = entry.as_ref().map(|m| m["status"]["value"].clone());
        if status.as_ref().and_then(Value::as_str) == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{model} never {want}: {entry:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// llama-server's own idle sleep (`--sleep-idle-seconds`) is read from its `/props` and shown:
/// `sleeping` in the router's status and `engineSleeping` in `/running`, while the process serves
/// on and wakes by itself at the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_servers_own_idle_sleep_is_shown() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("a", "--sleep-idle-seconds 1 --wake-ms 50", "")
    ))
    .await;
    assert_eq!(ask(&h, "a").await.status, 200);
    router_status_becomes(&h, "a", "sleeping").await;
    let running = get(&format!("{}/running", h.url)).await.json();
    assert_eq!(running["running"][0]["engineSleeping"], true, "{running}");
    assert_eq!(running["running"][0]["state"], "ready", "{running}");
    assert_eq!(ask(&h, "a").await.status, 200);
    assert_eq!(h.count_events("a", "woke"), 1);
    router_status_becomes(&h, "a", "loaded").await;
    h.stop().await;
}

/// A sleeper is stopped once its `ttl` ends, as an idle ready engine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeper_is_stopped_when_its_ttl_ends() {
    let (_dir, h) = swapped_a_for_b(&[("a", "", "ttl: 1"), ("b", "", "")]).await;
    assert_eq!(sleep_calls(&h, "a"), ["/sleep 200"]);
    eventually(WITHIN, "a stopped at its ttl", || {
        h.count_events("a", "sigterm") == 1
    })
    .await;
    let text = metrics(&h).await;
    assert!(stopped_once(&text, "a", "ttl"), "{text}");
    h.stop().await;
}

/// A `cmd` model running vLLM's imitation with its sleep routes on; `sleep` adds its calls.
fn vllm_cmd(port: u16, sleep: bool) -> String {
    let calls =
        "    sleepEndpoints: [{endpoint: /sleep}]\n    wakeEndpoints: [{endpoint: /wake_up}]\n";
    format!(
        "startPort: {port}\nmodels:\n  a:\n    cmd: ${{env.ENGINE}} --imitate vllm serve /m --port ${{PORT}} --enable-sleep-mode --events-file ${{env.DIR}}/a.events\n    env: [\"${{env.MARKER}}\", VLLM_SERVER_DEV_MODE=1]\n{}{}",
        if sleep { calls } else { "" },
        fake_model("b", "", "")
    )
}

/// A reload that gives a running model its sleep calls (its command unchanged, so its process
/// stays) takes effect at its next swap: the calls are read when the sleep is asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_calls_a_reload_added_are_used_by_the_running_engine() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_range(8);
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, vllm_cmd(port, false)).unwrap();
    let p = spawn_corral_with(dir, &path, state.path(), &[]);
    let chat_url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&chat_url, &chat("a")).await.status, 200);
    std::fs::write(&path, vllm_cmd(port, true)).unwrap();
    signal(&p.child, nix::sys::signal::Signal::SIGHUP);
    let reloaded = |text: &str| has_line(text, "corral_config_reloads_total", &["success"], "1");
    let deadline = std::time::Instant::now() + WITHIN;
    while !reloaded(&get(&format!("{}/metrics", p.url)).await.text()) {
        assert!(std::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = chat("b");
    let swap = tokio::time::timeout(WITHIN, post_json(&chat_url, &b));
    assert_eq!(swap.await.expect("the swap went through").status, 200);
    let events = read_events(&p.dir.path().join("a.events"));
    let calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "sleep_call")
        .collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(calls[0]["path"], "/sleep");
}
