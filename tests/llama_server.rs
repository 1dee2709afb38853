//! End to end against a real llama-server: corral in front of llama.cpp's `llama-server` serving
//! tiny random-weight models that each test writes with `gguf::write_tiny_llama`. Nothing is
//! downloaded and everything stays on loopback.
//!
//! The llama-server binary comes from `CORRAL_LLAMA_SERVER` and the Python with the `openai` SDK
//! from `CORRAL_PYTHON`; `scripts/test.sh` sets both. Without them a test fails under CI (`CI` set)
//! and is skipped, loudly, elsewhere.

mod support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gguf::TinyOptions;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use support::*;

// === gating ===

/// The value of `var`, or `None` (after a loud skip line) when it is unset outside CI.
fn required_env(var: &str, what: &str, how: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => {
            assert!(Path::new(&v).is_file(), "{var}={v} does not exist: {how}");
            Some(v)
        }
        _ if std::env::var_os("CI").is_some() => panic!("{var} is not set: {how}"),
        _ => {
            // straight to stderr, past the test harness's output capture
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED (no {what}): {var} is not set; {how} ***\n"
            );
            None
        }
    }
}

fn llama_server() -> Option<String> {
    required_env(
        "CORRAL_LLAMA_SERVER",
        "llama-server",
        "run scripts/test.sh, which builds llama-server",
    )
}

fn python() -> Option<String> {
    required_env(
        "CORRAL_PYTHON",
        "python",
        "run scripts/test.sh, which sets up the Python venv with the openai SDK",
    )
}

/// Runs a test body with a hard bound, so a hang fails instead of stalling the suite.
async fn bounded<T>(secs: u64, body: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), body)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {secs}s"))
}

// === models and config ===

/// The llama-server flags every model gets: loopback, one slot, one thread, no web UI.
const LLAMA_FLAGS: &str = "--host 127.0.0.1 --port ${PORT} -np 1 -t 1 --no-webui";

/// Writes a tiny model named `name.gguf` into `dir` (llama-server reports the model path as the
/// response's `model`, which tells which upstream answered).
async fn tiny(dir: &Path, name: &str, opts: TinyOptions) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let p = path.clone();
    tokio::task::spawn_blocking(move || gguf::write_tiny_llama(&p, &opts))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("writing {name}.gguf: {e}"));
    path
}

/// Wide enough that each token costs a few milliseconds on CPU, so a stream of 64 tokens lasts
/// ~100 ms and a buffering proxy shows (about 64 MB of F32).
fn slow_chat_options() -> TinyOptions {
    TinyOptions {
        n_embd: 512,
        n_head: 8,
        n_head_kv: 4,
        n_ff: 2048,
        n_layer: 4,
        ..TinyOptions::default()
    }
}

/// Many layers with full KV heads: cheap to write (15 MB), but the KV cache of a large context
/// makes llama-server's "Loading model" phase last ~100 ms or more.
fn slow_load_options() -> TinyOptions {
    TinyOptions {
        n_embd: 256,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 256,
        n_layer: 8,
        ..TinyOptions::default()
    }
}

/// One model entry running llama-server on `${PORT}`; `flags` are extra llama-server flags (the
/// context size among them), `extra` extra YAML lines for the model.
/// corral serving one llama-server model `id` on tiny weights made with `opts`; the directory that
/// holds them is returned with the harness and must outlive it.
async fn serve_one(
    server: &str,
    id: &str,
    opts: TinyOptions,
    flags: &str,
    extra: &str,
) -> (tempfile::TempDir, Harness) {
    let models = tempfile::tempdir().unwrap();
    let model = tiny(models.path(), id, opts).await;
    let h = Harness::start(&format!(
        "healthCheckTimeout: 60\nmodels:\n{}",
        llama_model(id, server, &model, flags, extra)
    ))
    .await;
    (models, h)
}

fn llama_model(id: &str, server: &str, model: &Path, flags: &str, extra: &str) -> String {
    let mut s = format!(
        "  {id}:\n    cmd: {server} -m {} {LLAMA_FLAGS} {flags}\n    \
         env: [\"${{env.MARKER}}\", \"CORRAL_E2E_MODEL={id}\"]\n",
        model.display()
    );
    for line in extra.lines().filter(|l| !l.trim().is_empty()) {
        s.push_str("    ");
        s.push_str(line);
        s.push('\n');
    }
    s
}

/// Processes of this test (`marker`) that belong to model `id`.
fn model_pids(marker: &str, id: &str) -> Vec<u32> {
    let of_model = marked_pids(&format!("CORRAL_E2E_MODEL={id}"));
    marked_pids(marker)
        .into_iter()
        .filter(|p| of_model.contains(p))
        .collect()
}

fn chat_body(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hello"}]})
}

/// The first `/running` entry for `id`.
async fn running_entry(url: &str, id: &str) -> Option<Value> {
    let list = get(&format!("{url}/running")).await.json();
    list["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == id)
        .cloned()
}

/// A direct GET of the upstream's `/health`: its status and body, or `None` when nothing listens.
async fn probe_health(port: u16) -> Option<(u16, String)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let fut = async {
        let resp = client
            .get(format!("http://127.0.0.1:{port}/health").parse().unwrap())
            .await
            .ok()?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .ok()
        .flatten()
}

fn is_finite_number(v: &Value) -> bool {
    v.as_f64().is_some_and(f64::is_finite)
}

// === 1. the openai SDK ===

/// The most entries of the sorted `times` that fall within any window of `width` seconds.
fn densest_window(times: &[f64], width: f64) -> usize {
    let (mut best, mut lo) = (0, 0);
    for hi in 0..times.len() {
        while times[hi] - times[lo] > width {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// Chat and streaming chat through the official `openai` Python SDK. The stream must arrive as it
/// is generated: the first and last text chunks are far apart, and no burst carries most of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_chat_and_streaming_chat() {
    let (Some(server), Some(python)) = (llama_server(), python()) else {
        return;
    };
    bounded(120, async {
        let (_models, h) = serve_one(&server, "chat", slow_chat_options(), "-c 256", "").await;

        const MAX_TOKENS: usize = 64;
        let report = run_python(
            &python,
            "chat_stream.py",
            &[&h.url, "chat", &MAX_TOKENS.to_string()],
        )
        .await;

        assert!(
            !report["reply"].as_str().unwrap_or_default().is_empty(),
            "{report}"
        );
        let chunks = report["chunks"].as_u64().unwrap();
        let times: Vec<f64> = report["content_times"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect();
        let total = report["total_s"].as_f64().unwrap();
        let millis: Vec<String> = times.iter().map(|t| format!("{:.1}", t * 1e3)).collect();
        let summary = format!(
            "{chunks} chunks; text chunks at [{}] ms of {:.1} ms",
            millis.join(", "),
            total * 1e3
        );
        assert!(chunks > 1, "a stream of one chunk: {report}");
        assert!(
            times.len() >= MAX_TOKENS / 2,
            "{} text chunks for {MAX_TOKENS} tokens: {report}",
            times.len()
        );
        assert_eq!(report["finish_reason"], "length", "{report}");

        let spread = times[times.len() - 1] - times[0];
        let burst = densest_window(&times, total / 10.0);
        eprintln!(
            "stream: {chunks} chunks, {} with text, first {:.1} ms, spread {:.1} ms of {:.1} ms, \
             densest 10% window holds {burst}",
            times.len(),
            times[0] * 1e3,
            spread * 1e3,
            total * 1e3
        );
        assert!(
            spread >= 0.5 * total,
            "text chunks arrived together (a buffering proxy?): {summary}"
        );
        let n = times.len();
        assert!(
            burst * 2 <= n,
            "{burst} of {n} text chunks came in one burst (buffered?): {summary}"
        );
        h.stop().await;
    })
    .await;
}

// === 2. embeddings, 3. rerank ===

/// `/v1/embeddings` from a llama-server started with `--embeddings --pooling mean`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let models = tempfile::tempdir().unwrap();
        let model = tiny(
            models.path(),
            "embed",
            TinyOptions {
                embedding: true,
                ..TinyOptions::default()
            },
        )
        .await;
        let yaml = format!(
            "healthCheckTimeout: 60\nmodels:\n{}",
            llama_model(
                "embed",
                &server,
                &model,
                "-c 256 --embeddings --pooling mean",
                ""
            )
        );
        let h = Harness::start(&yaml).await;
        let resp = post_json(
            &format!("{}/v1/embeddings", h.url),
            &json!({"model": "embed", "input": ["hello world", "a fox"]}),
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let body = resp.json();
        let data = body["data"]
            .as_array()
            .unwrap_or_else(|| panic!("no data: {body}"));
        assert_eq!(data.len(), 2, "{body}");
        let vectors: Vec<Vec<f64>> = data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                assert_eq!(d["index"], i, "{body}");
                let v = d["embedding"]
                    .as_array()
                    .unwrap_or_else(|| panic!("no embedding: {body}"));
                assert!(v.iter().all(is_finite_number), "{body}");
                v.iter().map(|x| x.as_f64().unwrap()).collect()
            })
            .collect();
        assert_eq!(
            vectors[0].len(),
            TinyOptions::default().n_embd as usize,
            "one value per embedding dimension"
        );
        assert_ne!(
            vectors[0], vectors[1],
            "different inputs, different embeddings"
        );
        assert!(
            body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
            "{body}"
        );
        h.stop().await;
    })
    .await;
}

/// `/v1/rerank` (and its aliases) from a llama-server started with `--reranking`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let opts = TinyOptions {
            reranker: true,
            ..TinyOptions::default()
        };
        let (_models, h) = serve_one(&server, "rerank", opts, "-c 256 --reranking", "").await;
        let docs = [
            "a fox is a small canid",
            "paris is in france",
            "the quick brown fox",
        ];
        for path in ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"] {
            let resp = post_json(
                &format!("{}{path}", h.url),
                &json!({"model": "rerank", "query": "what is a fox?", "documents": docs}),
            )
            .await;
            assert_eq!(resp.status, 200, "{path}: {}", resp.text());
            let body = resp.json();
            let results = body["results"]
                .as_array()
                .unwrap_or_else(|| panic!("{path}: no results: {body}"));
            let mut indices: Vec<u64> = results
                .iter()
                .map(|r| r["index"].as_u64().unwrap())
                .collect();
            indices.sort();
            assert_eq!(indices, [0, 1, 2], "{path}: one score per document: {body}");
            assert!(
                results
                    .iter()
                    .all(|r| is_finite_number(&r["relevance_score"])),
                "{path}: {body}"
            );
        }
        let top = post_json(
            &format!("{}/v1/rerank", h.url),
            &json!({"model": "rerank", "query": "fox", "documents": docs, "top_n": 2}),
        )
        .await;
        assert_eq!(
            top.json()["results"].as_array().unwrap().len(),
            2,
            "{}",
            top.text()
        );
        h.stop().await;
    })
    .await;
}

// === 4. lazy start through the loading phase, 5. swap, 6. ttl, 7. upstream passthrough ===

/// A cold model is started by its first request; corral waits through llama-server's 503
/// "Loading model" phase (observed here by probing the upstream directly), reports the model as
/// starting meanwhile, and forwards only once it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_start_waits_through_the_loading_phase() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let models = tempfile::tempdir().unwrap();
        let model = tiny(models.path(), "slowload", slow_load_options()).await;
        let port = free_port_range(4);
        let yaml = format!(
            "healthCheckTimeout: 60\nstartPort: {port}\nmodels:\n{}",
            llama_model("chat", &server, &model, "-c 24576", "")
        );
        let h = Harness::start(&yaml).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            h.running().await.is_empty(),
            "nothing runs before the first request"
        );
        assert!(
            marked_pids(&h.marker).is_empty(),
            "no llama-server before the first request"
        );

        let started = Instant::now();
        let first = tokio::spawn({
            let url = format!("{}/v1/chat/completions", h.url);
            async move { post_json(&url, &chat_body("chat", 4)).await }
        });
        let (mut loading_seen, mut starting_seen) = (None, false);
        while !first.is_finished() {
            if let Some((503, body)) = probe_health(port).await {
                loading_seen.get_or_insert(body);
                let entry = running_entry(&h.url, "chat").await;
                // still loading after /running answered: corral cannot have seen it ready
                if let Some((503, _)) = probe_health(port).await {
                    let state = entry.as_ref().map(|e| e["state"].clone());
                    assert_eq!(
                        state,
                        Some(json!("starting")),
                        "/running while llama-server loads: {entry:?}"
                    );
                    starting_seen = true;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let resp = first.await.unwrap();
        let took = started.elapsed();
        assert_eq!(
            resp.status,
            200,
            "the first request is served: {}",
            resp.text()
        );
        let body = resp.json();
        assert!(
            !body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .is_empty(),
            "{body}"
        );
        assert_eq!(
            body["model"],
            model.display().to_string(),
            "llama-server names its model file: {body}"
        );
        let loading = loading_seen.expect(
            "llama-server never answered 503 while loading: the loading phase went untested",
        );
        assert!(loading.contains("Loading model"), "{loading}");
        assert!(starting_seen, "/running was never checked during the load");
        eprintln!("first request took {took:?} through the loading phase");

        let entry = running_entry(&h.url, "chat")
            .await
            .expect("chat is running");
        assert_eq!(entry["state"], "ready", "{entry}");
        let proxy = entry["proxy"].as_str().unwrap_or_default();
        assert!(
            proxy.ends_with(&format!(":{port}")),
            "the probed port is chat's: {entry}"
        );
        assert_eq!(marked_pids(&h.marker).len(), 1, "one llama-server");
        h.stop().await;
    })
    .await;
}

/// Two models in the default group: the second request stops the first llama-server, then the
/// second serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_group_swaps_llama_servers() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let models = tempfile::tempdir().unwrap();
        let a = tiny(
            models.path(),
            "model-a",
            TinyOptions {
                seed: 1,
                ..TinyOptions::default()
            },
        )
        .await;
        let b = tiny(
            models.path(),
            "model-b",
            TinyOptions {
                seed: 2,
                ..TinyOptions::default()
            },
        )
        .await;
        let yaml = format!(
            "healthCheckTimeout: 60\nmodels:\n{}{}",
            llama_model("a", &server, &a, "-c 256", ""),
            llama_model("b", &server, &b, "-c 256", "")
        );
        let h = Harness::start(&yaml).await;
        let url = format!("{}/v1/chat/completions", h.url);

        let ra = post_json(&url, &chat_body("a", 4)).await;
        assert_eq!(ra.status, 200, "{}", ra.text());
        assert_eq!(
            ra.json()["model"],
            a.display().to_string(),
            "a's llama-server answered"
        );
        assert_eq!(h.running().await, ["a"]);
        assert_eq!(model_pids(&h.marker, "a").len(), 1);

        let rb = post_json(&url, &chat_body("b", 4)).await;
        assert_eq!(rb.status, 200, "{}", rb.text());
        assert_eq!(
            rb.json()["model"],
            b.display().to_string(),
            "b's llama-server answered"
        );
        assert_eq!(h.running().await, ["b"], "a was swapped out");
        assert_eq!(running_entry(&h.url, "b").await.unwrap()["state"], "ready");
        assert!(
            model_pids(&h.marker, "a").is_empty(),
            "a's llama-server is gone: {:?}",
            model_pids(&h.marker, "a")
        );
        assert_eq!(model_pids(&h.marker, "b").len(), 1);

        // and back again
        let ra = post_json(&url, &chat_body("a", 4)).await;
        assert_eq!(ra.json()["model"], a.display().to_string(), "{}", ra.text());
        assert_eq!(h.running().await, ["a"]);
        h.stop().await;
    })
    .await;
}

/// `ttl: 1` unloads an idle llama-server about a second after its last request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_unloads_an_idle_llama_server() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let (_models, h) =
            serve_one(&server, "chat", TinyOptions::default(), "-c 256", "ttl: 1").await;
        let resp = post_json(
            &format!("{}/v1/chat/completions", h.url),
            &chat_body("chat", 4),
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let idle_since = Instant::now();
        assert_eq!(h.running().await, ["chat"], "up right after the request");
        assert_eq!(running_entry(&h.url, "chat").await.unwrap()["ttl"], 1);

        let deadline = Instant::now() + Duration::from_secs(15);
        while !h.running().await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "still running {:?} after being idle for {:?}",
                h.running().await,
                idle_since.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let idle = idle_since.elapsed();
        assert!(
            idle >= Duration::from_millis(800),
            "unloaded after only {idle:?} of idleness"
        );
        eprintln!("unloaded after {idle:?} idle");
        assert_no_survivors(&h.marker, Duration::from_secs(3)).await;
        // a later request starts it again
        assert_eq!(
            post_json(
                &format!("{}/v1/chat/completions", h.url),
                &chat_body("chat", 4)
            )
            .await
            .status,
            200
        );
        h.stop().await;
    })
    .await;
}

/// `/upstream/<model>/slots` reaches llama-server's own slots endpoint (starting the model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_passthrough_returns_slots() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let (_models, h) = serve_one(&server, "chat", TinyOptions::default(), "-c 256", "").await;
        let resp = get(&format!("{}/upstream/chat/slots", h.url)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert!(
            resp.header("content-type")
                .is_some_and(|c| c.starts_with("application/json")),
            "{:?}",
            resp.headers
        );
        let slots = resp.json();
        let slots = slots
            .as_array()
            .unwrap_or_else(|| panic!("not an array: {slots}"));
        assert_eq!(slots.len(), 1, "-np 1 gives one slot: {slots:?}");
        assert_eq!(slots[0]["id"], 0, "{slots:?}");
        assert_eq!(slots[0]["n_ctx"], 256, "{slots:?}");
        assert_eq!(h.running().await, ["chat"]);
        h.stop().await;
    })
    .await;
}

/// What llama.cpp's router API reads of a real llama-server: before the start, the context its
/// command line gives each request; once it runs, the context its own `/props` reports; and
/// `/metrics?model=` is its own `llamacpp:*` text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_after_start_and_engine_metrics_come_from_llama_server() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        let flags = "-c 512 --metrics";
        let (_models, h) = serve_one(&server, "chat", TinyOptions::default(), flags, "").await;
        let entry = |list: Value| {
            list["data"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["id"] == "chat")
                .cloned()
                .unwrap()
        };
        let before = entry(get(&format!("{}/v1/models", h.url)).await.json());
        assert_eq!(
            before["context_length"], 512,
            "-c 512 on one slot: {before}"
        );
        let props = get(&format!("{}/upstream/chat/props", h.url)).await.json();
        let reported = &props["default_generation_settings"]["n_ctx"];
        assert!(reported.as_u64().is_some_and(|n| n > 0), "{props}");
        let after = entry(get(&format!("{}/models", h.url)).await.json());
        assert_eq!(&after["context_length"], reported, "{after}");
        assert_eq!(&after["meta"]["n_ctx"], reported, "{after}");
        assert_eq!(after["status"]["value"], "loaded", "{after}");

        let metrics = get(&format!("{}/metrics?model=chat", h.url)).await;
        assert_eq!(metrics.status, 200, "{}", metrics.text());
        assert!(
            metrics.text().contains("llamacpp:prompt_tokens_total"),
            "{}",
            metrics.text()
        );
        h.stop().await;
    })
    .await;
}

// === 8. a llama-server that cannot start ===

/// A llama-server that exits while loading is reported at once, as a 500 that quotes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_llama_server_is_reported_quickly() {
    let Some(server) = llama_server() else { return };
    bounded(40, async {
        let yaml = format!(
            "healthCheckTimeout: 60\nmodels:\n{}",
            llama_model(
                "broken",
                &server,
                Path::new("/nonexistent.gguf"),
                "-c 256",
                ""
            )
        );
        let h = Harness::start(&yaml).await;
        let started = Instant::now();
        let url = format!("{}/v1/chat/completions", h.url);
        let resp = tokio::time::timeout(
            Duration::from_secs(20),
            post_json(&url, &chat_body("broken", 4)),
        )
        .await
        .expect("no answer in 20s: corral missed llama-server's exit (healthCheckTimeout is 60s)");
        let took = started.elapsed();
        assert_eq!(resp.status, 500, "{}", resp.text());
        let msg = resp.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains("failed to open GGUF file") || msg.contains("failed to load model"),
            "llama-server's own words: {msg}"
        );
        assert!(
            took < Duration::from_secs(10),
            "reported after {took:?}, not at once (healthCheckTimeout is 60s)"
        );
        assert!(h.running().await.is_empty());
        assert_no_survivors(&h.marker, Duration::from_secs(3)).await;
        h.stop().await;
    })
    .await;
}

// === 9. SIGKILL of the corral binary ===

/// The corral binary serving one tiny llama-server model, with its own state directory.
fn spawn_corral(server: &str) -> support::process::Proc {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("chat.gguf");
    gguf::write_tiny_llama(&model, &TinyOptions::default()).unwrap();
    let entry = llama_model("chat", server, &model, "-c 256", "");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "healthCheckTimeout: 60\nstartPort: {}\nmodels:\n{entry}",
            free_port_range(4)
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    support::process::spawn_corral_with(dir, &config, &state, &[])
}

/// SIGKILL of the corral binary takes its llama-server with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_corral_leaves_no_llama_server() {
    let Some(server) = llama_server() else { return };
    bounded(60, async {
        // blocking (it reads corral's stdout), so off the runtime, where `bounded` still applies
        let mut p = tokio::task::spawn_blocking(move || spawn_corral(&server))
            .await
            .unwrap();
        let resp = post_json(
            &format!("{}/v1/chat/completions", p.url),
            &chat_body("chat", 4),
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let pids = marked_pids(&p.marker);
        assert_eq!(pids.len(), 1, "one llama-server runs: {pids:?}");
        let exe = std::fs::read_link(format!("/proc/{}/exe", pids[0])).unwrap();
        assert!(
            exe.ends_with("llama-server"),
            "the marked process is llama-server: {exe:?}"
        );

        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        p.child.wait().unwrap();
        assert_no_survivors(&p.marker, Duration::from_secs(5)).await;
    })
    .await;
}

// === 10. replicas under concurrent SDK load ===

/// `/upstream/<instance>/slots` of a `-np 2` replica: how many of its slots have served a task,
/// and the slots without their sampling `params` (for messages). llama-server lists `id_task` and
/// `n_prompt_tokens` only for a slot that has taken a task (`n_decoded` is back to 0 once done).
async fn used_slots(url: &str, instance: &str) -> (usize, Value) {
    let resp = get(&format!("{url}/upstream/{instance}/slots")).await;
    assert_eq!(resp.status, 200, "{instance}/slots: {}", resp.text());
    let mut slots = resp.json();
    let slots = slots
        .as_array_mut()
        .unwrap_or_else(|| panic!("{instance}/slots is not an array: {}", resp.text()));
    assert_eq!(
        slots.len(),
        2,
        "-np 2 gives {instance} two slots: {slots:?}"
    );
    for s in slots.iter_mut() {
        s.as_object_mut().unwrap().remove("params");
    }
    let used = slots
        .iter()
        .filter(|s| {
            s["id_task"].as_i64().is_some_and(|t| t >= 0)
                && s["n_prompt_tokens"].as_u64().is_some_and(|n| n > 0)
        })
        .count();
    (used, Value::Array(slots.clone()))
}

/// Two `-np 2` llama-server replicas behind one model: four concurrent chats through the `openai`
/// SDK are all served, and each replica's own `/slots` (through `/upstream/<replica>/slots`) shows
/// it served two of them, one per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_concurrent_sdk_chats() {
    let (Some(server), Some(python)) = (llama_server(), python()) else {
        return;
    };
    bounded(60, async {
        let models = tempfile::tempdir().unwrap();
        let model = tiny(models.path(), "chat", slow_chat_options()).await;
        let h = Harness::start(&format!(
            "healthCheckTimeout: 60\nmodels:\n  chat:\n    cmd: {server} -m {} --host 127.0.0.1 \
             --port ${{PORT}} -np 2 -c 512 -t 1 --no-webui\n    \
             env: [\"${{env.MARKER}}\", \"CORRAL_E2E_MODEL=chat\"]\n    \
             replicas: 2\n    startReplicas: all\n",
            model.display()
        ))
        .await;
        let started = Instant::now();

        // Start the pool before the burst (a replica still loading would leave the four chats to
        // its sibling): one request to the pool starts both (`startReplicas: all`), and no slot
        // has served anything yet.
        let (used, slots) = used_slots(&h.url, "chat").await;
        assert_eq!(used, 0, "no chat yet: {slots}");
        h.wait_ready(&["chat-0", "chat-1"], Duration::from_secs(20))
            .await;
        for replica in ["chat-0", "chat-1"] {
            let (used, slots) = used_slots(&h.url, replica).await;
            assert_eq!(used, 0, "no chat yet on {replica}: {slots}");
        }
        let warm = started.elapsed();

        const N: usize = 4;
        const MAX_TOKENS: u32 = 64;
        let report = run_python(
            &python,
            "concurrent_chat.py",
            &[&h.url, "chat", &N.to_string(), &MAX_TOKENS.to_string()],
        )
        .await;
        assert_eq!(report["errors"], json!([]), "{report}");
        assert_eq!(report["ok"], N, "{report}");
        let results = report["results"].as_array().unwrap();
        assert!(
            results
                .iter()
                .all(|r| r["completion_tokens"].as_u64().is_some_and(|n| n > 0)),
            "{report}"
        );

        for replica in ["chat-0", "chat-1"] {
            let (used, slots) = used_slots(&h.url, replica).await;
            assert!(
                used >= 1,
                "{replica} served none of the {N} chats (all went to its sibling?): {slots}"
            );
            // corral balances the burst 2 + 2 (most free slots, reserved at the pick), and the two
            // chats on a replica overlap (each decodes 64 tokens), so llama-server gives them a
            // slot each
            assert_eq!(
                used, 2,
                "{replica} did not run two of the {N} chats at once (unbalanced pool, or the chats \
                 were serialized): {slots}"
            );
        }
        let mut ready: Vec<String> = get(&format!("{}/running", h.url)).await.json()["running"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["state"] == "ready")
            .map(|m| m["model"].as_str().unwrap().to_string())
            .collect();
        ready.sort();
        assert_eq!(ready, ["chat-0", "chat-1"], "both replicas listed ready");
        assert_eq!(model_pids(&h.marker, "chat").len(), 2, "two llama-servers");
        eprintln!(
            "pool warm in {warm:?}; {N} SDK chats of {MAX_TOKENS} tokens in {:.0} ms; \
             total {:?}",
            report["total_s"].as_f64().unwrap() * 1e3,
            started.elapsed()
        );
        h.stop().await;
    })
    .await;
}
