//! Models named by engine and source, end to end on the fake engine: corral builds the command,
//! fetches the weights before the start (showing the download as it runs), and points the engine
//! at the fetched file.

#[path = "support/hub.rs"]
mod hub;
mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `engines:` running every llama_cpp model on the fake engine.
fn fake_llama_cpp() -> String {
    "engines:\n  llama_cpp: {command: '${env.ENGINE}'}\n".into()
}

fn engine_model(id: &str, source: &str, extra: &str) -> String {
    format!(
        "  {id}:\n    engine: llama_cpp\n    source: '{source}'\n    env: [\"${{env.MARKER}}\"]\n    args: [--events-file, '${{env.DIR}}/{id}.events']\n{extra}"
    )
}

/// Serves one file over HTTP/1.1, `chunks` pieces `every` apart, and counts the requests.
async fn slow_file_server(
    body: Vec<u8>,
    chunks: usize,
    every: Duration,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/weights/tiny.gguf",
        listener.local_addr().unwrap()
    );
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let _ = sock.read(&mut head).await;
                let header = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                sock.write_all(header.as_bytes()).await.unwrap();
                let piece = body.len().div_ceil(chunks);
                for part in body.chunks(piece) {
                    if sock.write_all(part).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            });
        }
    });
    (url, hits)
}

fn opts_with_cache(dir: &std::path::Path) -> corral::Options {
    corral::Options {
        source_env: vec![("CORRAL_CACHE".into(), dir.display().to_string())],
        ..Default::default()
    }
}

/// A model from a path: corral's command for it starts the engine, which answers as the model's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_source_runs_the_built_command() {
    let weights = tempfile::NamedTempFile::new().unwrap();
    let source = weights.path().display().to_string();
    let yaml = format!(
        "{}models:\n{}",
        fake_llama_cpp(),
        engine_model("tiny", &source, "    slots: 2\n")
    );
    let h = Harness::start(&yaml).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("tiny")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let running = get(&format!("{}/running", h.url)).await.json();
    let cmd = running["running"][0]["cmd"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for part in [
        format!("-m {source}"),
        "--alias tiny".into(),
        "-np 2".into(),
    ] {
        assert!(cmd.contains(&part), "{part:?} in {cmd}");
    }
    let state = get(&format!("{}/api/state", h.url)).await.json();
    assert_eq!(state["instances"][0]["slots"], 2, "{state}");
    h.stop().await;
}

/// A URL source is downloaded before the start: the model shows `downloading` with its progress
/// while the bytes arrive, then `active`; the engine is given the cached file, and a second start
/// downloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_source_is_downloaded_with_progress_before_the_engine_starts() {
    let body: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let sha = {
        use sha2::Digest;
        hex(&sha2::Sha256::digest(&body))
    };
    let (url, hits) = slow_file_server(body, 16, Duration::from_millis(100)).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}models:\n{}",
        fake_llama_cpp(),
        engine_model("web", &url, &format!("    sha256: {sha}\n"))
    );
    let h = Harness::start_with(&yaml, opts_with_cache(cache.path())).await;
    let chat_url = format!("{}/v1/chat/completions", h.url);
    let first = tokio::spawn(async move { post_json(&chat_url, &chat("web")).await });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let detail = loop {
        let detail = get(&format!("{}/api/models/web", h.url)).await.json();
        if detail["status"] == "downloading" && detail["download"]["bytes"].as_u64() > Some(0) {
            break detail;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no download seen: {detail}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(detail["download"]["total"], 64 * 1024, "{detail}");
    let listed = model_entry(&h, "web").await;
    assert!(
        listed["status"]["lifecycle"] == "downloading"
            || listed["status"]["lifecycle"] == "deploying",
        "{listed}"
    );

    let answer = first.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        model_entry(&h, "web").await["status"]["lifecycle"],
        "active"
    );
    let running = get(&format!("{}/running", h.url)).await.json();
    let cmd = running["running"][0]["cmd"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        cmd.contains(&format!("-m {}", cache.path().display())),
        "{cmd}"
    );
    assert!(!cmd.contains("http://"), "{cmd}");
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(
        metrics.contains("corral_download_bytes_total{scheme=\"url\"} 65536"),
        "{metrics}"
    );

    assert_eq!(
        post(&format!("{}/api/models/unload/web", h.url))
            .await
            .status,
        200
    );
    let again = post_json(&format!("{}/v1/chat/completions", h.url), &chat("web")).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one download"
    );
    h.stop().await;
}

/// A checksum that does not match fails the start with the reason, puts the model in `error`,
/// and leaves nothing in the cache that looks complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_checksum_is_an_error_naming_the_source() {
    let (url, _) = slow_file_server(vec![7u8; 4096], 1, Duration::ZERO).await;
    let cache = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let yaml = format!(
        "{}models:\n{}",
        fake_llama_cpp(),
        engine_model("bad", &url, &format!("    sha256: '{wrong}'\n"))
    );
    let h = Harness::start_with(&yaml, opts_with_cache(cache.path())).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("bad")).await;
    assert!(answer.status >= 500, "{}", answer.text());
    assert!(
        answer.text().contains("checksum mismatch"),
        "{}",
        answer.text()
    );
    let detail = get(&format!("{}/api/models/bad", h.url)).await.json();
    assert_eq!(detail["status"], "error", "{detail}");
    let files: Vec<_> = walk(cache.path());
    assert!(
        files.iter().all(|f| !f.ends_with("tiny.gguf")),
        "nothing complete left: {files:?}"
    );
    h.stop().await;
}

async fn model_entry(h: &Harness, id: &str) -> Value {
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .cloned()
        .unwrap_or_default()
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An engine that dies out of memory: the error a client gets says so first, with the engine's
/// own line, and the model's status reason carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_start_is_reported_as_such() {
    let weights = tempfile::NamedTempFile::new().unwrap();
    let yaml = format!(
        "{}models:\n{}",
        fake_llama_cpp(),
        engine_model(
            "oom",
            &weights.path().display().to_string(),
            "    ctx: 1024\n"
        )
        .replace("args: [", "args: [--fail-oom, ")
    );
    let h = Harness::start(&yaml).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("oom")).await;
    assert!(answer.status >= 500, "{}", answer.text());
    assert!(
        answer.text().contains("out of GPU memory: "),
        "{}",
        answer.text()
    );
    assert!(
        answer.text().contains("cudaMalloc failed"),
        "{}",
        answer.text()
    );
    let detail = get(&format!("{}/api/models/oom", h.url)).await.json();
    let reason = detail["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("out of GPU memory"), "{detail}");
    h.stop().await;
}

/// An Ollama store holding `library/tiny:latest`: a manifest naming one model layer, and its blob.
fn ollama_store(root: &std::path::Path) {
    use sha2::Digest;
    let blob = b"GGUF not really, but verified by digest".to_vec();
    let digest = hex(&sha2::Sha256::digest(&blob));
    let blobs = root.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("sha256-{digest}")), &blob).unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": [{"mediaType": "application/vnd.ollama.image.model",
            "digest": format!("sha256:{digest}"), "size": blob.len()}],
    });
    let dir = root.join("manifests/registry.ollama.ai/library/tiny");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("latest"), manifest.to_string()).unwrap();
}

/// An Ollama model from the local store: `ollama serve` (imitated) runs on the model's own port,
/// reads the same store, and gets requests under the model's Ollama name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_engine_serves_its_store_under_the_ollama_name() {
    let store = tempfile::tempdir().unwrap();
    ollama_store(store.path());
    let yaml = "engines:\n  ollama: {command: '${env.ENGINE} --imitate ollama serve'}\nmodels:\n  local:\n    engine: ollama\n    source: ollama://tiny\n    env: [\"${env.MARKER}\"]\n    args: [--events-file, '${env.DIR}/local.events']\n";
    let opts = corral::Options {
        source_env: vec![("OLLAMA_MODELS".into(), store.path().display().to_string())],
        ..Default::default()
    };
    let h = Harness::start_with(yaml, opts).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("local")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let asked: Vec<_> = h
        .events("local")
        .into_iter()
        .filter(|e| e["event"] == "request" && e["path"] == "/v1/chat/completions")
        .map(|e| e["model"].clone())
        .collect();
    assert_eq!(asked, [serde_json::json!("tiny:latest")]);
    let pid = get(&format!("{}/api/models/local", h.url)).await.json()["instances"][0]["pid"]
        .as_u64()
        .unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.contains(&format!("OLLAMA_MODELS={}", store.path().display())),
        "the engine reads corral's store"
    );
    assert!(
        environ.contains("OLLAMA_HOST=127.0.0.1:"),
        "its own address"
    );
    assert!(
        environ.contains("OLLAMA_NOPRUNE=1"),
        "it leaves the store's other downloads alone"
    );
    h.stop().await;
}

/// A vLLM model from a directory: vLLM refuses connections while it loads, so the model stays
/// `deploying` until it answers, then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_engine_is_deploying_until_it_listens() {
    let snapshot = tempfile::tempdir().unwrap();
    std::fs::write(snapshot.path().join("config.json"), "{}").unwrap();
    let yaml = format!(
        "engines:\n  vllm: {{command: '${{env.ENGINE}} --imitate vllm serve'}}\nmodels:\n  big:\n    engine: vllm\n    source: {}\n    slots: 4\n    env: [\"${{env.MARKER}}\"]\n    args: [--loading-ms, '800']\n",
        snapshot.path().display()
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let first = tokio::spawn(async move { post_json(&url, &chat("big")).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let detail = get(&format!("{}/api/models/big", h.url)).await.json();
        if detail["status"] == "deploying" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{detail}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = first.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let detail = get(&format!("{}/api/models/big", h.url)).await.json();
    assert_eq!(detail["status"], "active", "{detail}");
    let cmd = detail["instances"][0]["cmd"].as_str().unwrap_or_default();
    assert!(cmd.contains("--served-model-name big"), "{cmd}");
    assert!(cmd.contains("--max-num-seqs 4"), "{cmd}");
    h.stop().await;
}

/// With `sendLoadingState`, a streaming chat to a model whose weights are still coming gets the
/// download's progress in its loading messages, then the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loading_stream_shows_the_download() {
    let (url, _) = slow_file_server(vec![1u8; 32 * 1024], 16, Duration::from_millis(150)).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "sendLoadingState: true\n{}models:\n{}",
        fake_llama_cpp(),
        engine_model("web", &url, "")
    );
    let h = Harness::start_with(&yaml, opts_with_cache(cache.path())).await;
    let mut body = chat("web");
    body["stream"] = serde_json::json!(true);
    let (resp, frames) = stream_frames(&format!("{}/v1/chat/completions", h.url), &body).await;
    assert_eq!(resp.status, 200);
    let text = frames_text(&frames);
    assert!(text.contains("downloading tiny.gguf: "), "{text}");
    assert!(text.contains("[DONE]"), "{text}");
    h.stop().await;
}

/// With devices to place on, a model named by a remote GGUF is sized from the file's header
/// before anything is downloaded, as exactly as from the whole file once it is in the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_gguf_is_sized_from_its_header_before_the_download() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::write_tiny_llama(&path, &gguf::TinyOptions::default()).unwrap();
    let (url, _) = slow_file_server(std::fs::read(&path).unwrap(), 1, Duration::ZERO).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "devices:\n  - {{name: gpu0, capacity: 8GiB}}\n{}models:\n{}",
        fake_llama_cpp(),
        engine_model("web", &url, "    ctx: 512\n")
    );
    let memory = |state: &Value| state["instances"][0]["memory"].as_u64().unwrap_or(0);
    let first = Harness::start_with(&yaml, opts_with_cache(cache.path())).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let before = loop {
        let state = get(&format!("{}/api/state", first.url)).await.json();
        if memory(&state) > 0 {
            break memory(&state);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never sized: {state}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        walk(cache.path())
            .iter()
            .all(|f| !f.ends_with("/tiny.gguf")),
        "nothing downloaded yet"
    );
    let answer = post_json(&format!("{}/v1/chat/completions", first.url), &chat("web")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    first.stop().await;

    let second = Harness::start_with(&yaml, opts_with_cache(cache.path())).await;
    let state = get(&format!("{}/api/state", second.url)).await.json();
    assert_eq!(
        memory(&state),
        before,
        "the cached file's estimate: {state}"
    );
    second.stop().await;
}

/// Work that reaches a vLLM replica behind corral's back shows in vLLM's own gauges
/// (`vllm:num_requests_running`), which corral polls: that replica has no free slot meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_replicas_outside_work_is_read_from_its_gauges() {
    let snapshot = tempfile::tempdir().unwrap();
    let yaml = format!(
        "engines:\n  vllm: {{command: '${{env.ENGINE}} --imitate vllm serve'}}\nmodels:\n  big:\n    engine: vllm\n    source: {}\n    slots: 1\n    replicas: 2\n    startReplicas: all\n    slotsPollInterval: 1\n    env: [\"${{env.MARKER}}\"]\n",
        snapshot.path().display()
    );
    let h = Harness::start(&yaml).await;
    let answer = post_json(&format!("{}/v1/chat/completions", h.url), &chat("big")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    h.wait_ready(&["big-0", "big-1"], Duration::from_secs(10))
        .await;
    let free = |state: &Value, id: &str| {
        state["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .map(|i| i["free"].as_u64().unwrap_or(9))
    };
    let state = get(&format!("{}/api/state", h.url)).await.json();
    let proxy = get(&format!("{}/running", h.url)).await.json()["running"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model"] == "big-0")
        .unwrap()["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(free(&state, "big-0"), Some(1), "{state}");
    let mut slow = chat("big");
    slow["stream"] = serde_json::json!(true);
    slow["fakellm"] = serde_json::json!({"chunks": 60, "interval_ms": 100});
    let direct =
        tokio::spawn(
            async move { stream_frames(&format!("{proxy}/v1/chat/completions"), &slow).await },
        );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = get(&format!("{}/api/state", h.url)).await.json();
        if free(&state, "big-0") == Some(0) {
            assert_eq!(free(&state, "big-1"), Some(1), "{state}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not seen busy: {state}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    direct.abort();
    h.stop().await;
}

/// A safetensors file: its header names two tensors (BF16 [64, 32] and F32 [16]), then the data.
fn safetensors() -> bytes::Bytes {
    let json = br#"{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[64,32],"data_offsets":[0,4096]},"b":{"dtype":"F32","shape":[16],"data_offsets":[4096,4160]}}"#;
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json);
    out.extend(std::iter::repeat_n(0u8, 4160));
    out.into()
}

/// With devices to place on, a model directory on the Hub is sized from its safetensors headers
/// before anything is downloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_snapshot_is_sized_from_its_safetensors_headers() {
    let hub = hub::Hub::start().await;
    let file = |path: &str, data: bytes::Bytes, lfs| hub::RepoFile {
        path: path.into(),
        data,
        lfs,
    };
    hub.add_repo(
        "org/small",
        vec![
            file("config.json", bytes::Bytes::from_static(b"{}"), false),
            file("model.safetensors", safetensors(), true),
        ],
    );
    let caches = tempfile::tempdir().unwrap();
    let yaml = "devices:\n  - {name: gpu0, capacity: 8GiB}\nengines:\n  vllm: {command: '${env.ENGINE} --imitate vllm serve'}\nmodels:\n  small:\n    engine: vllm\n    source: hf://org/small\n    env: [\"${env.MARKER}\"]\n";
    let opts = corral::Options {
        source_env: vec![
            ("HF_ENDPOINT".into(), hub.url.clone()),
            ("HF_HUB_CACHE".into(), caches.path().display().to_string()),
        ],
        ..Default::default()
    };
    let h = Harness::start_with(yaml, opts).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = get(&format!("{}/api/state", h.url)).await.json();
        match state["instances"][0]["memory"].as_u64() {
            Some(0) | None => {}
            Some(bytes) => {
                assert_eq!(bytes, 64 * 32 * 2 + 16 * 4, "{state}");
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never sized: {state}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        walk(caches.path()).iter().all(|f| !f.contains("blobs")),
        "nothing downloaded yet"
    );
    h.stop().await;
}

/// Two models whose sources name one file (a quantization tag and the file it picks) download it
/// once, and both show that download's progress while it runs, not only the one that asked first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_that_share_a_file_both_show_its_download() {
    let hub = hub::Hub::start().await;
    let data = bytes::Bytes::from(vec![7u8; 120_000]);
    hub.add_repo(
        "org/tiny-GGUF",
        vec![hub::RepoFile {
            path: "Tiny-Q4_K_M.gguf".into(),
            data: data.clone(),
            lfs: true,
        }],
    );
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let cdn = format!("/cdn/{}", hub::sha256(&data));
    let stall = (50_000, gate.clone());
    hub.state
        .lock()
        .unwrap()
        .stall_after
        .insert(cdn.clone(), stall);
    let caches = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}groups:\n  both: {{swap: false, members: [tag, file]}}\nmodels:\n{}{}",
        fake_llama_cpp(),
        engine_model("tag", "hf://org/tiny-GGUF:Q4_K_M", ""),
        engine_model("file", "hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf", ""),
    );
    let opts = corral::Options {
        source_env: vec![
            ("HF_ENDPOINT".into(), hub.url.clone()),
            ("HF_HUB_CACHE".into(), caches.path().display().to_string()),
        ],
        ..Default::default()
    };
    let h = Harness::start_with(&yaml, opts).await;
    let mut answers = Vec::new();
    for id in ["tag", "file"] {
        let url = format!("{}/v1/chat/completions", h.url);
        answers.push(tokio::spawn(
            async move { post_json(&url, &chat(id)).await },
        ));
        // the second asks once the first's download is under way
        wait_for_download(&h, id).await;
    }
    assert_eq!(hub.hits(&cdn), 1, "one download for both");
    gate.add_permits(1);
    for answer in answers {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(hub.hits(&cdn), 1);
    h.stop().await;
}

/// Waits until model `id` shows a download of the shared file.
async fn wait_for_download(h: &Harness, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let detail = get(&format!("{}/api/models/{id}", h.url)).await.json();
        if detail["status"] == "downloading" && detail["download"]["file"] == "Tiny-Q4_K_M.gguf" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} shows no download: {detail}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
