//! Pools of replicas: balancing by free slots, queue bounds, failures.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

fn long(model: &str, chunks: u32) -> serde_json::Value {
    json!({"model": model, "stream": true, "messages": [], "fakellm": {"chunks": chunks, "interval_ms": 100}})
}

/// Waits until `/metrics` counts one stop of `instance` for `reason`.
async fn wait_for_stop(h: &Harness, instance: &str, reason: &str) {
    let series = format!(
        r#"corral_instance_stops_total{{instance="{instance}",model="{instance}",reason="{reason}"}} 1"#
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = get(&format!("{}/metrics", h.url)).await.text();
        if text.lines().any(|l| l == series) {
            return;
        }
        assert!(Instant::now() < deadline, "no {series} in\n{text}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Requests that reached each replica (by the port the fake engine answers from).
fn per_replica(h: &Harness, events: &str) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for e in h
        .events(events)
        .iter()
        .filter(|e| e["event"] == "request" && e["path"] == "/v1/chat/completions")
    {
        *out.entry(e["port"].as_u64().unwrap()).or_default() += 1;
    }
    out
}

fn replicated(id: &str, n: u32, flags: &str, extra: &str) -> String {
    fake_model(id, flags, &format!("replicas: {n}\n{extra}"))
}

/// corral with the pool `chat` of two replicas (`startReplicas: all` in `extra`), warmed up with
/// one request and both ready; and the chat URL.
async fn warm_pair(flags: &str, extra: &str) -> (Harness, String) {
    let h = Harness::start(&format!("models:\n{}", replicated("chat", 2, flags, extra))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("chat")).await.status, 200, "warm up");
    h.wait_ready(&["chat-0", "chat-1"], Duration::from_secs(15))
        .await;
    (h, url)
}

/// A burst of 2×slots requests across 2 replicas puts exactly `slots` on each, and none waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_fills_each_replica_to_its_slots() {
    let (h, url) = warm_pair("-np 3", "startReplicas: all").await;
    let before = per_replica(&h, "chat");
    let burst: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { stream_frames(&url, &long("chat", 8)).await.0.status }
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), 200);
    }
    let after = per_replica(&h, "chat");
    let added: Vec<usize> = after
        .iter()
        .map(|(port, n)| n - before.get(port).copied().unwrap_or(0))
        .collect();
    assert_eq!(
        added,
        [3, 3],
        "exactly the slots on each replica: {after:?}"
    );
    let max_active = h
        .events("chat")
        .iter()
        .filter(|e| e["path"] == "/v1/chat/completions")
        .filter_map(|e| e["active"].as_u64())
        .max();
    assert_eq!(max_active, Some(3), "no replica was oversubscribed");
    h.stop().await;
}

/// A cold pool starts one replica for the first request, and the next as load needs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_pool_grows_with_load() {
    let h = Harness::start(&format!("models:\n{}", replicated("chat", 2, "-np 1", ""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("chat")).await.status, 200);
    assert_eq!(h.running().await, ["chat-0"], "one replica for one request");
    let first = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long("chat", 10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = post_json(&url, &chat("chat")).await;
    assert_eq!(second.status, 200);
    assert_eq!(
        h.running().await,
        ["chat-0", "chat-1"],
        "the second replica started for the waiting request"
    );
    assert_eq!(first.await.unwrap().0.status, 200);
    h.stop().await;
}

/// Past the queue depth, 429; past the queue wait, 503; both with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_bounds_give_429_and_503() {
    let (h, url) = warm_pair(
        "-np 1",
        "startReplicas: all\nqueueDepth: 1\nqueueTimeout: 1",
    )
    .await;
    // one long request at a time, each placed before the next is sent, so that both replicas are
    // known busy before the queue is tried
    let mut busy = Vec::new();
    for placed in 1..=2 {
        let url = url.clone();
        busy.push(tokio::spawn(async move {
            stream_frames(&url, &long("chat", 30)).await.0.status
        }));
        eventually(Duration::from_secs(15), "a replica busy", || {
            let now = per_replica(&h, "chat");
            now.values().sum::<usize>() == 1 + placed
        })
        .await;
    }
    assert_eq!(per_replica(&h, "chat").len(), 2, "both replicas busy");
    let queued = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &chat("chat")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rejected = post_json(&url, &chat("chat")).await;
    assert_eq!(rejected.status, 429, "{}", rejected.text());
    assert_eq!(rejected.header("retry-after"), Some("1"));
    let timed_out = queued.await.unwrap();
    assert_eq!(timed_out.status, 503, "{}", timed_out.text());
    assert!(timed_out.header("retry-after").is_some());
    assert!(timed_out
        .text()
        .contains("no replica of chat had a free slot within 1s"));
    for b in busy {
        assert_eq!(b.await.unwrap(), 200);
    }
    h.stop().await;
}

/// `chat-1` reaches replica 1 alone; replica 0 is never started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_id_reaches_only_that_replica() {
    let h = Harness::start(&format!("models:\n{}", replicated("chat", 2, "", ""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..3 {
        let resp = post_json(&url, &chat("chat-1")).await;
        assert_eq!(resp.status, 200);
    }
    assert_eq!(h.running().await, ["chat-1"]);
    let ports = per_replica(&h, "chat");
    assert_eq!(ports.len(), 1);
    let models = get(&format!("{}/v1/models", h.url)).await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["chat", "chat-0", "chat-1"]);
    h.stop().await;
}

/// Models named `embed-0`, `embed-1` (as fleet generators write them) balance on `embed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_numbered_models_balance_on_the_role() {
    let yaml = format!(
        "models:\n{}{}",
        fake_model("embed-0", "-np 1", "ttl: 0"),
        fake_model("embed-1", "-np 1", "ttl: 0"),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let both: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { stream_frames(&url, &long("embed", 5)).await.0.status }
            })
        })
        .collect();
    for b in both {
        assert_eq!(b.await.unwrap(), 200);
    }
    assert_eq!(h.count_requests("embed-0", "/v1/chat/completions"), 1);
    assert_eq!(h.count_requests("embed-1", "/v1/chat/completions"), 1);
    let e = post_json(
        &format!("{}/v1/embeddings", h.url),
        &json!({"model": "embed", "input": "x"}),
    )
    .await;
    assert_eq!(e.status, 200);
    let models = get(&format!("{}/v1/models", h.url)).await.json();
    let pool = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "embed")
        .expect("the pool is listed")
        .clone();
    assert_eq!(pool["meta"]["llamaswap"]["type"], "pool");
    h.stop().await;
}

/// A replica killed under load: its queued requests are served by its sibling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_queue_is_served_by_its_sibling() {
    let h = Harness::start(&format!(
        "models:\n{}",
        replicated("chat", 2, "-np 1", "startReplicas: all")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let busy: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { stream_frames(&url, &long("chat", 8)).await }
            })
        })
        .collect();
    eventually(Duration::from_secs(15), "both busy", || {
        per_replica(&h, "chat").len() == 2
    })
    .await;
    let queued: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { post_json(&url, &chat("chat")).await.status }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let victim = h
        .events("chat")
        .iter()
        .find(|e| e["event"] == "spawned")
        .unwrap()["pid"]
        .as_u64()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for q in queued {
        assert_eq!(q.await.unwrap(), 200, "queued requests are served");
    }
    for b in busy {
        let _ = b.await;
    }
    h.stop().await;
}

/// A replica that refuses connections is taken out, and the request is retried on a sibling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_replica_is_skipped_with_one_retry() {
    let dead_port = free_port_range(1);
    let yaml = format!(
        "models:\n  r-0:\n    cmd: sleep 30\n    checkEndpoint: none\n    proxy: http://127.0.0.1:{dead_port}\n    env: [\"${{env.MARKER}}\"]\n{}",
        fake_model("r-1", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..4 {
        let resp = post_json(&url, &chat("r")).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert_eq!(h.count_requests("r-1", "/v1/chat/completions"), 4);
    wait_for_stop(&h, "r-0", "unreachable").await;
    h.stop().await;
}

/// A replica that takes the connection and closes it without an answer (as llama-server does now and
/// then under load) is not taken out at once: the request is retried on a sibling,
/// and only five such failures in a row eject it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_closing_connections_is_retried_and_ejected_only_when_it_keeps_failing() {
    let closer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closer.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = closer.accept().await else {
                return;
            };
            // read the request, then close without a word
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            drop(socket);
        }
    });
    let yaml = format!(
        "models:\n  r-0:\n    cmd: sleep 30\n    checkEndpoint: none\n    proxy: http://127.0.0.1:{port}\n    env: [\"${{env.MARKER}}\"]\n{}",
        fake_model("r-1", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    // prompts of their own, so no request is drawn to where an earlier one went
    let ask = |i: usize| json!({"model": "r", "messages": [{"role": "user", "content": format!("q{i}")}]});
    let mut sent = 0;
    while h.count_requests("r-1", "/v1/chat/completions") < 4 {
        let resp = post_json(&url, &ask(sent)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        sent += 1;
    }
    assert!(sent >= 4);
    let events = get(&format!("{}/api/lifecycle", h.url)).await.text();
    assert!(
        !events.contains("unreachable"),
        "a closed connection is not an unreachable replica: {events}"
    );
    for i in 0..12 {
        assert_eq!(post_json(&url, &ask(100 + i)).await.status, 200);
    }
    wait_for_stop(&h, "r-0", "ejected").await;
    h.stop().await;
}

/// An instance that keeps failing to start is held back: after two failures, requests get 503 with
/// Retry-After and the last error, without another spawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_backs_off() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("c", "--loading-ms 5000 --exit-after-ms 50", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("c")).await.status, 500);
    assert_eq!(post_json(&url, &chat("c")).await.status, 500);
    let held = post_json(&url, &chat("c")).await;
    assert_eq!(held.status, 503, "{}", held.text());
    assert!(held.header("retry-after").is_some());
    let msg = held.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("c failed 2 times in a row") && msg.contains("exited prematurely"),
        "{msg}"
    );
    assert_eq!(h.count_events("c", "spawned"), 2);
    h.stop().await;
}

/// Without `-np` on the command line, the slot count comes from the engine's `/props`; work that
/// reaches a replica directly is seen through `/slots` polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_come_from_props_and_slots_polling() {
    let (h, url) = warm_pair("--slots 2", "startReplicas: all\nslotsPollInterval: 1").await;
    let running = get(&format!("{}/running", h.url)).await.json();
    assert!(
        running["running"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["slots"] == 2),
        "{running}"
    );

    // fill replica 0's two slots behind corral's back
    let port0 = running["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model"] == "chat-0")
        .unwrap()["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    let direct: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let u = format!("{port0}/v1/chat/completions");
                async move { stream_frames(&u, &long("chat", 30)).await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await; // one poll
    let before = per_replica(&h, "chat");
    for _ in 0..2 {
        let r = tokio::spawn({
            let url = url.clone();
            async move { stream_frames(&url, &long("chat", 5)).await.0.status }
        });
        assert_eq!(r.await.unwrap(), 200);
    }
    let after = per_replica(&h, "chat");
    let port1: u64 = port0.rsplit(':').next().unwrap().parse::<u64>().unwrap() + 1;
    assert_eq!(
        after[&port1] - before.get(&port1).copied().unwrap_or(0),
        2,
        "both went to the idle replica: {before:?} -> {after:?}"
    );
    for d in direct {
        d.abort();
    }
    h.stop().await;
}

/// Free slots per replica, as `/metrics` reports them.
async fn free_slots(h: &Harness) -> BTreeMap<String, i64> {
    let text = get(&format!("{}/metrics", h.url)).await.text();
    text.lines()
        .filter(|l| l.starts_with("corral_slots_free{"))
        .filter_map(|l| {
            let instance = l.split("instance=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some((instance.to_string(), value))
        })
        .collect()
}

/// An engine still reports a slot busy for a moment after corral's request on it ended (the
/// fake engine holds it for 1.5 s here). A `/slots` reading taken then is corral's own work, not
/// outside work: the replica stays free, so no request waits while it sits idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_slots_reading_does_not_hide_a_free_replica() {
    let (h, _url) = warm_pair(
        "--slots-lag-ms 1500",
        "startReplicas: all\nslotsPollInterval: 1",
    )
    .await;
    // at least one poll of each replica lands inside the lag
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let free = free_slots(&h).await;
    assert_eq!(
        free,
        BTreeMap::from([("chat-0".to_string(), 1), ("chat-1".to_string(), 1)]),
        "both replicas are idle"
    );
    h.stop().await;
}

/// `balance: round-robin` sends to each replica in turn whatever its slots, as a client-side
/// balancer would; it exists to compare against the slot-aware pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_ignores_free_slots() {
    let (h, url) = warm_pair("-np 1", "startReplicas: all\nbalance: round-robin").await;
    let burst: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { stream_frames(&url, &long("chat", 5)).await.0.status }
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), 200);
    }
    let max_active = h
        .events("chat")
        .iter()
        .filter(|e| e["path"] == "/v1/chat/completions")
        .filter_map(|e| e["active"].as_u64())
        .max();
    assert_eq!(
        max_active,
        Some(2),
        "two requests at once on a one-slot replica: nothing waited at corral"
    );
    h.stop().await;
}

/// The implicit pool `chat` of `chat-0` and `chat-1` (with their engines' flags), both loaded.
async fn loaded_pool(flags_0: &str, flags_1: &str) -> Harness {
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("chat-0", flags_0, ""),
        fake_model("chat-1", flags_1, "")
    ))
    .await;
    for id in ["chat-0", "chat-1"] {
        let load = post(&format!("{}/api/models/load/{id}", h.url)).await;
        assert_eq!(load.status, 200, "{}", load.text());
    }
    h
}

/// A pool member whose health check passes but whose inference answers 500 is taken out after five
/// server errors in a row; the rest of the traffic goes to the healthy member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_answering_server_errors_is_taken_out() {
    let h = loaded_pool("", "--completion-status 500").await;
    let url = format!("{}/v1/chat/completions", h.url);
    let mut errors = 0;
    for _ in 0..20 {
        match post_json(&url, &chat("chat")).await.status {
            200 => {}
            500 => errors += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(errors, 5, "five server errors, then none");
    assert_eq!(h.running().await, ["chat-0"]);
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(
        metrics.contains(r#"corral_ejections_total{instance="chat-1",model="chat-1"} 1"#),
        "{metrics}"
    );
    wait_for_stop(&h, "chat-1", "ejected").await;
    h.stop().await;
}

/// A member that answers 503 (loading, or overloaded) gets its request tried once more on a
/// sibling; when no sibling can take it, the member's own 503 is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_tried_again_on_a_sibling() {
    let h = loaded_pool("--completion-status 503", "").await;
    let url = format!("{}/v1/chat/completions", h.url);
    // at once, and each its own prompt, so that both members are picked
    let sent: Vec<_> = (0..6)
        .map(|i| {
            let url = url.clone();
            let body = json!({"model": "chat", "messages": [{"role": "user", "content": format!("question {i}")}]});
            tokio::spawn(async move { post_json(&url, &body).await })
        })
        .collect();
    for answer in sent {
        let resp = answer.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert!(
        h.count_requests("chat-0", "/v1/chat/completions") > 0,
        "the 503 member was picked"
    );
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(metrics.contains("corral_retries_total{"), "{metrics}");
    h.stop().await;

    // the sibling cannot start: the member's own answer is the client's
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("chat-0", "--completion-status 503", ""),
        fake_model("chat-1", "--fail-port", "")
    ))
    .await;
    let load = post(&format!("{}/api/models/load/chat-0", h.url)).await;
    assert_eq!(load.status, 200, "{}", load.text());
    let resp = post_json(&format!("{}/v1/chat/completions", h.url), &chat("chat")).await;
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert!(!resp.text().contains("no replica"), "{}", resp.text());
    h.stop().await;
}

/// While a request that a member answered with 503 waits for a sibling, that member's slot is free
/// again: its answer was read, and its lease let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_members_slot_is_free_while_a_sibling_is_awaited() {
    let h = loaded_pool("--completion-status 503", "-np 1").await;
    let url = format!("{}/v1/chat/completions", h.url);
    // chat-1's one slot holds a stream of 60 s, until its client leaves
    let busy = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long("chat-1", 600)).await.0.status }
    });
    eventually(Duration::from_secs(15), "chat-1 busy", || {
        h.count_requests("chat-1", "/v1/chat/completions") == 1
    })
    .await;
    let waiting = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &chat("chat")).await }
    });
    eventually(Duration::from_secs(15), "chat-0 answered 503", || {
        h.count_requests("chat-0", "/v1/chat/completions") == 1
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while in_flight(&h, "chat-0").await != 0 {
        assert!(Instant::now() < deadline, "chat-0 still holds the request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!waiting.is_finished(), "the request waits for chat-1");
    // the stream's client leaves: chat-1's slot is free, and the waiting request takes it
    busy.abort();
    let answer = waiting.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    h.stop().await;
}

/// Requests in flight on `instance`, as `/running` lists them.
async fn in_flight(h: &Harness, instance: &str) -> u64 {
    let running = get(&format!("{}/running", h.url)).await.json();
    running["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model"] == instance)
        .unwrap_or_else(|| panic!("{instance} is not running: {running}"))["inFlight"]
        .as_u64()
        .unwrap()
}

/// Server errors never empty a pool: when every member answers 500 (a request the engine cannot
/// serve, sent again and again), the last ready member stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_never_take_out_the_last_ready_member() {
    let h = loaded_pool("--completion-status 500", "--completion-status 500").await;
    let url = format!("{}/v1/chat/completions", h.url);
    for _ in 0..20 {
        assert_eq!(post_json(&url, &chat("chat")).await.status, 500);
    }
    assert_eq!(h.running().await.len(), 1, "one member stays");
    h.stop().await;
}

/// The turns of one conversation: a long system prompt, then more user and assistant messages each
/// turn, so every turn's `messages` starts with the whole of the turn before.
fn conversation_turns(turns: usize) -> Vec<serde_json::Value> {
    let system = "You are a careful assistant. ".repeat(40);
    let mut messages = vec![json!({"role": "system", "content": system})];
    (0..turns)
        .map(|t| {
            messages.push(json!({"role": "user", "content": format!("question {t}")}));
            let body = json!({"model": "chat", "messages": messages.clone()});
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            body
        })
        .collect()
}

/// Sends the turns one after another; how many reached each replica.
async fn run_conversation(h: &Harness, url: &str, turns: usize) -> Vec<usize> {
    let before = per_replica(h, "chat");
    for body in conversation_turns(turns) {
        assert_eq!(post_json(url, &body).await.status, 200);
    }
    let after = per_replica(h, "chat");
    after
        .iter()
        .map(|(port, n)| n - before.get(port).copied().unwrap_or(0))
        .collect()
}

/// With `balance: prefix` (the default) every turn of a conversation lands on the replica that
/// served the turn before, and `/metrics` counts each later turn as a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_the_replica_holding_its_prefix() {
    let (h, url) = warm_pair("-np 1", "startReplicas: all").await;
    let mut added = run_conversation(&h, &url, 6).await;
    added.sort();
    assert_eq!(added, [0, 6], "every turn on one replica");
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"corral_prefix_hits_total{model="chat"} 5"#),
        "{metrics}"
    );
    let matched = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"corral_prefix_matched_bytes_total{model="chat"} "#))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(matched.is_some_and(|b| b >= 5 * 1024), "{metrics}");
    h.stop().await;
}

/// With `balance: slots` the same turns go by free slots: both replicas idle, each turn goes to
/// the one picked longer ago, so the conversation alternates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_balance_slots_a_conversation_alternates() {
    let (h, url) = warm_pair("-np 1", "startReplicas: all\nbalance: slots").await;
    assert_eq!(run_conversation(&h, &url, 6).await, [3, 3]);
    h.stop().await;
}

/// With `prefixWait`, a turn whose replica is busy waits for it (up to the wait) instead of going
/// to the free one; without it, the turn goes to the free replica at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prefix_wait_a_turn_waits_for_its_busy_replica() {
    for (wait, expected) in [("prefixWait: 5000", [0, 3]), ("", [1, 2])] {
        let (h, url) = warm_pair("-np 1", &format!("startReplicas: all\n{wait}")).await;
        let before = per_replica(&h, "chat");
        let turns = conversation_turns(3);
        assert_eq!(post_json(&url, &turns[0]).await.status, 200);
        // the second turn holds its replica's only slot for a while
        let mut slow = turns[1].clone();
        slow["fakellm"] = json!({"delay_ms": 1500});
        let slow = tokio::spawn({
            let url = url.clone();
            async move { post_json(&url, &slow).await.status }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        assert_eq!(post_json(&url, &turns[2]).await.status, 200);
        let waited = started.elapsed();
        assert_eq!(slow.await.unwrap(), 200);
        let after = per_replica(&h, "chat");
        let mut added: Vec<usize> = after
            .iter()
            .map(|(port, n)| n - before.get(port).copied().unwrap_or(0))
            .collect();
        added.sort();
        assert_eq!(added, expected, "{wait:?}: turns per replica");
        if !wait.is_empty() {
            assert!(
                waited >= Duration::from_millis(900),
                "waited {waited:?} for the holder"
            );
        }
        h.stop().await;
    }
}
