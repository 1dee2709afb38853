//! Config files that must never take corral down: deep nesting and alias bombs give a located
//! error from `corral check` and from a reload, and a reload that would stop every model or turn
//! API keys off is refused while the running config keeps serving.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::process::*;
use support::*;

/// A list nested 20,000 deep (40 KB), under a model's metadata at line 4.
fn deep_nesting() -> String {
    format!(
        "models:\n  m:\n    metadata:\n      {}x\n",
        "- ".repeat(20_000)
    )
}

/// "Billion laughs": 10^9 values from a few hundred bytes, unless aliases are bounded.
fn alias_bomb() -> String {
    let mut yaml = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for pair in names.windows(2) {
        let refs = vec![format!("*{}", pair[0]); 9].join(", ");
        yaml.push_str(&format!("{}: &{} [{refs}]\n", pair[1], pair[1]));
    }
    yaml
}

fn check(path: &Path) -> (i32, String) {
    let out = Command::new(CORRAL)
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_names_where_nesting_and_aliases_go_too_far() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, deep_nesting()).unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, 64, "{err}");
    let at = format!(
        "{}:4:257: lists and mappings nest deeper than 128 levels",
        path.display()
    );
    assert!(err.contains(&at), "{err}");

    std::fs::write(&path, alias_bomb()).unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, 64, "{err}");
    let at = format!(
        "{}:6:8: aliases expand to more than 100000 values",
        path.display()
    );
    assert!(err.contains(&at), "{err}");
}

const KEY: &str = "secret-key";

fn keyed_config(port: u16) -> String {
    format!(
        "startPort: {port}\napiKeys: [{KEY}]\nmodels:\n{}",
        fake_model("a", "", "")
    )
}

async fn get_with_key(url: &str) -> Resp {
    request(
        "GET",
        url,
        &[("authorization", &format!("Bearer {KEY}"))],
        "",
    )
    .await
}

/// Waits until corral has counted `n` failed reloads.
async fn wait_failed_reloads(p: &Proc, n: usize) {
    let line = format!("corral_config_reloads_total{{result=\"failure\"}} {n}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = get_with_key(&format!("{}/metrics", p.url)).await.text();
        if metrics.contains(&line) {
            return;
        }
        assert!(Instant::now() < deadline, "no {line} in:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The running config still serves `a`, still wants the key, and was never replaced.
async fn still_serving(p: &Proc) {
    let chat_url = format!("{}/v1/chat/completions", p.url);
    let body = chat("a").to_string();
    let headers = [
        ("content-type", "application/json"),
        ("authorization", &*format!("Bearer {KEY}")),
    ];
    assert_eq!(request("POST", &chat_url, &headers, body).await.status, 200);
    let models = get_with_key(&format!("{}/v1/models", p.url)).await.json();
    assert_eq!(models["data"][0]["id"], "a", "{models}");
    for path in ["/logs", "/metrics", "/running", "/v1/models"] {
        let status = get(&format!("{}{path}", p.url)).await.status;
        assert_eq!(status, 401, "{path} still needs the key");
    }
    let metrics = get_with_key(&format!("{}/metrics", p.url)).await.text();
    assert!(
        !metrics.contains(r#"corral_config_reloads_total{result="success"} 1"#),
        "{metrics}"
    );
}

/// Each reload below is refused with a reason, counted as a failure, and leaves corral serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_or_destructive_reloads_are_refused() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_range(8);
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, keyed_config(port)).unwrap();
    let mut p = spawn_corral_with(dir, &path, state.path(), &[]);
    still_serving(&p).await;

    let no_keys = format!("startPort: {port}\nmodels:\n{}", fake_model("a", "", ""));
    let attempts = [
        (deep_nesting(), "deeper than 128 levels"),
        (alias_bomb(), "aliases expand to more than 100000 values"),
        (String::new(), "has no models"),
        (no_keys, "has no apiKeys"),
    ];
    for (n, (yaml, why)) in attempts.iter().enumerate() {
        std::fs::write(&path, yaml).unwrap();
        signal(&p.child, Signal::SIGHUP);
        wait_failed_reloads(&p, n + 1).await;
        assert!(p.child.try_wait().unwrap().is_none(), "corral is still up");
        let logs = get_with_key(&format!("{}/logs", p.url)).await.text();
        assert!(logs.contains(why), "the log says why ({why}):\n{logs}");
        still_serving(&p).await;
    }
    let logs = get_with_key(&format!("{}/logs", p.url)).await.text();
    assert!(
        logs.contains("restart corral to do that on purpose"),
        "{logs}"
    );

    signal(&p.child, Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut p.child, Duration::from_secs(20))
            .await
            .code(),
        Some(0)
    );
    assert_no_survivors(&p.marker, Duration::from_secs(2)).await;
}
