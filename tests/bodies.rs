//! Request bodies in memory: a budget for all buffered bodies, and rewrites that do not multiply one.

mod support;

use std::io::Write;
use std::time::Duration;

use serde_json::json;
use support::process::*;
use support::*;

/// A chat body of about `bytes`, made of many small messages (the shape that multiplied in memory
/// when a rewrite parsed it whole).
fn many_messages(model: &str, bytes: usize) -> Vec<u8> {
    let one = r#"{"role":"user","content":"hi"},"#;
    let mut body = format!(r#"{{"model":"{model}","messages":["#).into_bytes();
    while body.len() < bytes {
        body.extend_from_slice(one.as_bytes());
    }
    body.pop();
    body.extend_from_slice(b"]}");
    body
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A 32 MiB body for a model with filters is rewritten with its top level parsed only: corral's
/// peak memory grows by about twice the body (it once grew by 39 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_rewrite_stays_within_a_few_times_the_body() {
    let extra = "filters:\n  stripParams: top_k\n  setParams: {temperature: 0.1}";
    let state = tempfile::tempdir().unwrap();
    let p = spawn_corral(
        &format!("models:\n{}", fake_model("m", "", extra)),
        state.path(),
    );
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("m")).await.status, 200, "warm up");
    let before = peak_rss_kib(p.child.id());
    let body = many_messages("m", 32 << 20);
    let resp = request("POST", &url, &[("content-type", "application/json")], body).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let grew_mib = peak_rss_kib(p.child.id()).saturating_sub(before) / 1024;
    eprintln!("peak memory grew by {grew_mib} MiB for a 32 MiB body");
    assert!(
        grew_mib < 3 * 32,
        "a 32 MiB body raised corral's peak memory by {grew_mib} MiB"
    );
}

/// While one client holds most of `maxBufferedBodies` with a body it is still sending, a second
/// large body is refused at once with 503 and Retry-After; once the first is done, its bytes are
/// free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_budget_refuses_with_retry_after_and_recovers() {
    let h = Harness::start(&format!(
        "maxBufferedBodies: 1MiB\nmodels:\n{}",
        fake_model("m", "", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let big = many_messages("m", 700 << 10);

    // clients that only declare large bodies hold nothing
    let addr = h.url.trim_start_matches("http://").to_string();
    let silent: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n").unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let through = request(
        "POST",
        &url,
        &[("content-type", "application/json")],
        big.clone(),
    )
    .await;
    assert_eq!(through.status, 200, "{}", through.text());
    drop(silent);

    // the first client declares its body and sends half of it
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        slow,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .unwrap();
    slow.write_all(&big[..big.len() / 2]).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = request(
        "POST",
        &url,
        &[("content-type", "application/json")],
        big.clone(),
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(
        refused.text().contains("maxBufferedBodies"),
        "{}",
        refused.text()
    );

    slow.write_all(&big[big.len() / 2..]).unwrap();
    let mut answer = String::new();
    let mut buf = [0u8; 4096];
    while !answer.contains("\r\n\r\n") {
        let n = std::io::Read::read(&mut slow, &mut buf).unwrap();
        assert!(n > 0, "the first client got no answer");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(slow);

    let served = request("POST", &url, &[("content-type", "application/json")], big).await;
    assert_eq!(served.status, 200, "{}", served.text());
    let small = post_json(&url, &json!({"model": "m", "messages": []})).await;
    assert_eq!(small.status, 200);
    h.stop().await;
}

/// A body bound for a peer stays charged until the peer's answer begins, as one bound for a local
/// model does: while the first waits for its model to load on the peer, a second large body is
/// refused, where it used to be taken beyond `maxBufferedBodies`. One peer, then two that share
/// the model (the least loaded is asked), each take their own path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_bound_for_a_peer_is_charged_until_its_answer() {
    let loading = || async {
        Harness::start(&format!(
            "models:\n{}",
            fake_model("m", "--loading-ms 1500", "")
        ))
        .await
    };
    let (a, b) = (loading().await, loading().await);
    let one = format!("peers:\n  a: {{proxy: '{}', models: [m]}}\n", a.url);
    let two = format!("{one}  b: {{proxy: '{}', models: [m]}}\n", b.url);
    for peers in [one, two] {
        let front = Harness::start(&format!("maxBufferedBodies: 1MiB\n{peers}")).await;
        let url = format!("{}/v1/chat/completions", front.url);
        let big = many_messages("m", 700 << 10);
        let json = [("content-type", "application/json")];
        let first = tokio::spawn({
            let (url, big) = (url.clone(), big.clone());
            async move { request("POST", &url, &json, big).await }
        });
        let spawned = || a.count_events("m", "spawned") + b.count_events("m", "spawned");
        let before = spawned();
        eventually(
            Duration::from_secs(10),
            "the first body reached a peer",
            || spawned() > before,
        )
        .await;
        let refused = request("POST", &url, &json, big.clone()).await;
        let said = |r: &Resp| r.text().chars().take(300).collect::<String>();
        assert_eq!(refused.status, 503, "{}", said(&refused));
        let first = first.await.unwrap();
        assert_eq!(first.status, 200, "{}", said(&first));
        front.stop().await;
        for peer in [&a, &b] {
            let unload = format!("{}/api/models/unload", peer.url);
            assert_eq!(post(&unload).await.status, 200);
        }
    }
    a.stop().await;
    b.stop().await;
}
