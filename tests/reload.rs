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
