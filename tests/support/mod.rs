//! Test support: corral on port 0 in front of the fake engine, a small HTTP client, and an orphan oracle.
#![allow(dead_code)]

pub mod process;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// The fake engine command: `corral fake-engine`.
pub fn engine() -> String {
    format!("{CORRAL} fake-engine")
}

/// A unique marker every child of a test carries in its environment.
pub fn new_marker() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "CORRAL_TEST_RUN=t{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        Instant::now().elapsed().as_nanos()
    )
}

/// One model entry on the fake engine, with an events file named after it.
pub fn fake_model(id: &str, flags: &str, extra: &str) -> String {
    let mut s = format!(
        "  {id}:\n    cmd: ${{env.ENGINE}} --port ${{PORT}} --events-file ${{env.DIR}}/{id}.events {flags}\n    env: [\"${{env.MARKER}}\"]\n"
    );
    for line in extra.lines().filter(|l| !l.trim().is_empty()) {
        s.push_str("    ");
        s.push_str(line);
        s.push('\n');
    }
    s
}

/// corral running in this process, on 127.0.0.1:0.
pub struct Harness {
    pub url: String,
    pub dir: tempfile::TempDir,
    pub marker: String,
    shutdown: CancellationToken,
    abort: CancellationToken,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Harness {
    pub async fn start(yaml: &str) -> Harness {
        Self::start_with(yaml, corral::Options::default()).await
    }

    pub async fn start_with(yaml: &str, mut opts: corral::Options) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let marker = new_marker();
        let env = env_for(dir.path(), &marker);
        let yaml = if yaml.contains("startPort") {
            yaml.to_string()
        } else {
            format!("startPort: {}\n{yaml}", free_port_range(16))
        };
        let yaml = yaml.as_str();
        let loaded = corral::config::load_str("test.yaml", yaml, &env)
            .unwrap_or_else(|e| panic!("config: {e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (shutdown, abort) = (CancellationToken::new(), CancellationToken::new());
        opts.state_key = format!("test-{}", marker.replace('=', "-"));
        let logs = Arc::new(corral::Logs::default());
        let task = tokio::spawn(corral::run(
            loaded.config,
            listener,
            logs,
            opts,
            shutdown.clone(),
            abort.clone(),
        ));
        Harness {
            url,
            dir,
            marker,
            shutdown,
            abort,
            task: Some(task),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The fake engine's events for a model, parsed.
    pub fn events(&self, model: &str) -> Vec<Value> {
        read_events(&self.path(&format!("{model}.events")))
    }

    pub fn count_events(&self, model: &str, event: &str) -> usize {
        self.events(model)
            .iter()
            .filter(|e| e["event"] == event)
            .count()
    }

    /// Requests the fake engine received on `path` (health probes excluded unless asked for).
    pub fn count_requests(&self, model: &str, path: &str) -> usize {
        self.events(model)
            .iter()
            .filter(|e| e["event"] == "request" && e["path"] == path)
            .count()
    }

    /// The ids `/running` lists, sorted.
    pub async fn running(&self) -> Vec<String> {
        let list = get(&format!("{}/running", self.url)).await.json();
        let mut ids: Vec<String> = list["running"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["model"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// Waits until every one of `ids` is ready.
    pub async fn wait_ready(&self, ids: &[&str], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let list = get(&format!("{}/running", self.url)).await.json();
            let ready = list["running"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["state"] == "ready" && ids.contains(&m["model"].as_str().unwrap()))
                .count();
            if ready == ids.len() {
                return;
            }
            assert!(Instant::now() < deadline, "not ready in time: {list}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until `/running` lists exactly `ids`.
    pub async fn wait_running(&self, ids: &[&str], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.running().await;
            if now == ids {
                return;
            }
            if Instant::now() > deadline {
                panic!("running is {now:?}, expected {ids:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Graceful stop, as on SIGTERM; asserts that no child outlives it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("shutdown in time")
            .unwrap()
            .unwrap();
        assert_no_survivors(&self.marker, Duration::from_secs(3)).await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.abort.cancel();
    }
}

/// Writes `script` to `path` as an executable (a fake vendor tool); its path as text.
pub fn executable(path: &std::path::Path, script: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// A base port whose next `n` ports are free now, chosen at random so parallel tests do not collide.
pub fn free_port_range(n: u16) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let seed = (std::process::id() as u16).wrapping_mul(7919);
    loop {
        let k = NEXT.fetch_add(1, Ordering::SeqCst);
        // below the ephemeral range (32768 and up), where outgoing connections would take ports
        let base = 20000 + (seed.wrapping_add(k.wrapping_mul(n + 3)) % 12000);
        if (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return base;
        }
    }
}

/// What `${env.ENGINE_SECRET}` expands to in test configs: a secret corral must never show.
pub const ENGINE_SECRET: &str = "engine-s3cret-value";

pub fn env_for(dir: &Path, marker: &str) -> impl Fn(&str) -> Option<String> {
    let dir = dir.display().to_string();
    let marker = marker.to_string();
    move |name| match name {
        "ENGINE" => Some(engine()),
        "DIR" => Some(dir.clone()),
        "MARKER" => Some(marker.clone()),
        "CORRAL_EXE" => Some(CORRAL.to_string()),
        "ENGINE_SECRET" => Some(ENGINE_SECRET.to_string()),
        other => std::env::var(other).ok(),
    }
}

pub fn read_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Processes (any state but zombie) whose environment holds `marker`.
pub fn marked_pids(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == marker.as_bytes()) {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'));
            if !zombie {
                out.push(pid);
            }
        }
    }
    out
}

pub async fn assert_no_survivors(marker: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let alive = marked_pids(marker);
        if alive.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("processes outlived corral: {alive:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `f` until it is true, or panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// === a small HTTP client ===

pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Resp {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client()
        .request(req.body(Full::new(body.into())).unwrap())
        .await
        .expect("request sent");
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Resp {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

pub async fn get(url: &str) -> Resp {
    request("GET", url, &[], Bytes::new()).await
}

/// A POST with no body (the management actions: load, unload, cancel).
pub async fn post(url: &str) -> Resp {
    request("POST", url, &[], Bytes::new()).await
}

pub async fn post_json(url: &str, body: &Value) -> Resp {
    request(
        "POST",
        url,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

pub fn chat(model: &str) -> Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

/// The text of streamed frames, joined.
pub fn frames_text(frames: &[(Duration, Bytes)]) -> String {
    frames
        .iter()
        .map(|(_, f)| String::from_utf8_lossy(f).into_owned())
        .collect()
}

/// Sends a streaming request and returns each body frame with its arrival time since the request.
pub async fn stream_frames(url: &str, body: &Value) -> (Resp, Vec<(Duration, Bytes)>) {
    let started = Instant::now();
    let req = Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.expect("request sent");
    let (parts, mut body) = resp.into_parts();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames.push((started.elapsed(), data));
        }
    }
    (
        Resp {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: Bytes::new(),
        },
        frames,
    )
}

/// Runs `tests/python/<script>` with `args` on `python` (no proxy, 120 s at most); it must exit 0
/// and print one JSON line last, which is returned.
pub async fn run_python(python: &str, script: &str, args: &[&str]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&path)
        .args(args)
        .env("NO_PROXY", "*")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish in 120s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// `CORRAL_PYTHON` (the venv of scripts/setup-python.sh), or `None` after a loud skip line;
/// unset under CI fails.
pub fn python() -> Option<String> {
    match std::env::var("CORRAL_PYTHON") {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => panic!("CORRAL_PYTHON is not set"),
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: CORRAL_PYTHON is not set; run scripts/setup-python.sh ***\n"
            );
            None
        }
    }
}
