//! Several hosts on one machine: corral in three network namespaces. The first forwards a model to
//! the other two by their load; one of them dies mid-traffic and no request that had not started
//! its answer is lost or served twice. Needs root for the namespaces; skipped loudly without it.

#[path = "support/netns.rs"]
mod netns;
mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use netns::{Host, Net};
use serde_json::{json, Value};
use support::process::{signal, wait_exit, Proc};
use support::*;
use tokio::task::JoinHandle;

/// How long each engine holds a request before its answer: long enough that a whole burst is in
/// flight when a peer dies, however slow the machine.
const HOLD_MS: u64 = 4000;
const BURST: usize = 20;
const AFTER: usize = 10;

/// corral serving `m` on the fake engine on the host's own address, for the front to reach.
fn backend(host: &Host) -> Proc {
    let model = fake_model("m", "--parallel 64", "concurrencyLimit: 64");
    host.spawn_corral(&format!("{}:0", host.addr), &format!("models:\n{model}"))
}

/// corral on loopback in its host, with both backends as peers for `m`.
fn front(host: &Host, b: &Proc, c: &Proc) -> Proc {
    let yaml = format!(
        "peers:\n  b: {{proxy: '{}', models: [m]}}\n  c: {{proxy: '{}', models: [m]}}\n",
        b.url, c.url
    );
    host.spawn_corral("127.0.0.1:0", &yaml)
}

fn chat_url(p: &Proc) -> String {
    format!("{}/v1/chat/completions", p.url)
}

fn events(p: &Proc) -> Vec<Value> {
    read_events(&p.dir.path().join("m.events"))
}

/// Chat completions the engine behind `p` logged as `event` (`request` or `done`).
fn chats(p: &Proc, event: &str) -> usize {
    events(p)
        .iter()
        .filter(|e| e["event"] == event && e["path"] == "/v1/chat/completions")
        .count()
}

fn engine_pid(p: &Proc) -> u64 {
    events(p)
        .iter()
        .find_map(|e| e["pid"].as_u64())
        .expect("the engine logged")
}

/// A request that names itself in its prompt, held `hold_ms` by the engine.
fn tagged(i: usize, hold_ms: u64) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": format!("req-{i}")}],
           "fakellm": {"delay_ms": hold_ms}})
}

/// A long stream through the front; says once its first bytes arrived, and at the end whether it
/// ran to `[DONE]` (a stream whose peer died is cut short instead).
fn stream(url: &str, started: Arc<AtomicUsize>) -> JoinHandle<bool> {
    let body = json!({"model": "m", "stream": true, "messages": [],
                      "fakellm": {"chunks": 50, "interval_ms": 100}});
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    tokio::spawn(async move {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let resp = client.request(req).await.expect("the stream starts");
        assert_eq!(resp.status(), 200);
        let (mut body, mut text) = (resp.into_body(), Vec::new());
        while let Some(Ok(frame)) = body.frame().await {
            if text.is_empty() {
                started.fetch_add(1, Ordering::SeqCst);
            }
            text.extend_from_slice(&frame.into_data().unwrap_or_default());
        }
        String::from_utf8_lossy(&text).contains("data: [DONE]")
    })
}

/// A request on its way, and its number.
type Sent = JoinHandle<(usize, Resp)>;

fn send(url: &str, i: usize, hold_ms: u64) -> Sent {
    let url = url.to_string();
    tokio::spawn(async move { (i, post_json(&url, &tagged(i, hold_ms)).await) })
}

/// Long streams through the front until each peer has one: the second goes to the peer the first
/// left idle, unless a reading taken during a warm-up still counts that peer busy (readings are up
/// to a second old), and then the third does. The streams, and how many went to c.
async fn a_stream_on_each(url: &str, b: &Proc, c: &Proc) -> (Vec<JoinHandle<bool>>, usize) {
    let started = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::new();
    while chats(b, "request") == 1 || chats(c, "request") == 1 {
        assert!(streams.len() < 4, "the streams all went to one peer");
        streams.push(stream(url, started.clone()));
        let n = streams.len();
        eventually(Duration::from_secs(10), "the stream starts", || {
            started.load(Ordering::SeqCst) == n
        })
        .await;
    }
    (streams, chats(c, "request") - 1)
}

/// Sends the burst and waits until each request of it reached an engine (`before` had reached
/// them before).
async fn burst(url: &str, b: &Proc, c: &Proc, before: usize) -> Vec<Sent> {
    let sent: Vec<_> = (0..BURST).map(|i| send(url, i, HOLD_MS)).collect();
    eventually(
        Duration::from_secs(10),
        "the burst reaches the engines",
        || chats(b, "request") + chats(c, "request") == before + BURST,
    )
    .await;
    sent
}

/// Every request got its own answer, from b's engine.
async fn all_answered_by(sent: Vec<Sent>, pid: u64) {
    let mut answered = BTreeSet::new();
    for task in sent {
        let (i, r) = task.await.unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        let body = r.json();
        let echoed = &body["fakellm"]["request"]["messages"][0]["content"];
        assert_eq!(
            echoed,
            &json!(format!("req-{i}")),
            "request {i} got another's answer"
        );
        assert_eq!(body["fakellm"]["pid"], pid, "request {i} was answered by b");
        answered.insert(i);
    }
    assert_eq!(answered.len(), BURST + AFTER);
}

#[test]
fn a_front_spreads_by_load_and_loses_nothing_when_a_peer_dies() {
    let Some(net) = netns::or_skip(Net::new(3)) else {
        return;
    };
    let [a, b, c] = &net.hosts[..] else {
        unreachable!()
    };
    let (b, mut c) = (backend(b), backend(c));
    let front = front(a, &b, &c);
    netns::run_in(&a.ns.clone(), move || async move {
        for p in [&b, &c] {
            let r = post_json(&chat_url(p), &chat("m")).await;
            assert_eq!(r.status, 200, "warm {} from the front: {}", p.url, r.text());
        }
        let url = chat_url(&front);
        let (streams, streams_c) = a_stream_on_each(&url, &b, &c).await;
        let mut sent = burst(&url, &b, &c, 2 + streams.len()).await;
        let on_c = chats(&c, "request") - 1 - streams_c;
        let on_b = BURST - on_c;
        eprintln!(
            "streams on c: {streams_c} of {}; burst: {on_b} on b, {on_c} on c",
            streams.len()
        );
        assert!(
            on_b >= BURST / 4 && on_c >= BURST / 4,
            "the burst spreads: {on_b}/{on_c}"
        );

        signal(&c.child, nix::sys::signal::Signal::SIGKILL);
        wait_exit(&mut c.child, Duration::from_secs(5)).await;
        assert_eq!(
            chats(&c, "done"),
            1,
            "c answered only its warm-up before it died"
        );
        sent.extend((BURST..BURST + AFTER).map(|i| send(&url, i, 100)));

        // the streams c had started are cut short, never sent again; b's run to the end
        let total = streams.len();
        let mut cut = 0;
        for s in streams {
            cut += usize::from(!s.await.unwrap());
        }
        assert_eq!(cut, streams_c, "c's streams are cut, b's complete");
        all_answered_by(sent, engine_pid(&b)).await;
        // b's engine saw each request once: its streams, the ones first sent to it, the ones c
        // held when it died and those sent after; c's engine saw its streams and its share of
        // the burst, and answered none of them
        let on_b_engine = 1 + (total - streams_c) + BURST + AFTER;
        assert_eq!(chats(&b, "request"), on_b_engine, "b saw each request once");
        assert_eq!(
            chats(&c, "request"),
            1 + streams_c + on_c,
            "c saw only its share"
        );
        drop((front, b, c));
    });
    drop(net);
}
