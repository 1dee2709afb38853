//! Ollama's API served by corral in front of the fake engine (and, where `CORRAL_LLAMA_SERVER` is
//! set, a real llama-server): the listings, chat and generate streamed as NDJSON or whole,
//! embeddings, `keep_alive`, errors in Ollama's shape, keys' scopes and model lists, the switch,
//! and the official `ollama` Python client.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use support::*;

/// A tiny GGUF file in `dir`, as the weights a model's `-m` names.
fn tiny_gguf(dir: &Path, name: &str, embedding: bool) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let opts = gguf::TinyOptions {
        embedding,
        ..gguf::TinyOptions::default()
    };
    gguf::write_tiny_llama(&path, &opts).unwrap();
    path
}

async fn call(h: &Harness, path: &str, body: Value) -> Resp {
    post_json(&format!("{}{path}", h.url), &body).await
}

/// The objects of an NDJSON answer.
fn lines(r: &Resp) -> Vec<Value> {
    r.text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The error text of an Ollama error answer, which must be `{"error": "..."}` alone.
fn error_text(r: &Resp) -> String {
    let body = r.json();
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    body["error"].as_str().expect("error is text").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_and_show_say_what_corral_knows() {
    let weights = tempfile::tempdir().unwrap();
    let gguf = tiny_gguf(weights.path(), "chat", false);
    let chat_flags = format!("-m {}", gguf.display());
    let h = Harness::start(&format!(
        "models:\n{}{}{}",
        fake_model(
            "chat",
            &chat_flags,
            "ttl: 300\ncapabilities: {tools: true, context: 4096}"
        ),
        fake_model("embed", "--embedding", ""),
        fake_model("hidden", "", "unlisted: true"),
    ))
    .await;

    let tags = get(&format!("{}/api/tags", h.url)).await;
    assert_eq!(tags.status, 200, "{}", tags.text());
    let models = tags.json()["models"].as_array().unwrap().clone();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["chat", "embed"]);
    let chat = &models[0];
    assert_eq!(chat["model"], "chat");
    assert_eq!(chat["size"], std::fs::metadata(&gguf).unwrap().len());
    assert_eq!(chat["details"]["format"], "gguf");
    assert_eq!(chat["details"]["family"], "llama");
    assert!(chat["details"]["parameter_size"].is_string(), "{chat}");
    assert!(
        chat["modified_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{chat}"
    );
    assert_eq!(models[1]["size"], 0, "no weights file: nothing invented");
    assert!(models[1].get("modified_at").is_none(), "{}", models[1]);

    let shown = call(&h, "/api/show", json!({"model": "chat"})).await;
    assert_eq!(shown.status, 200, "{}", shown.text());
    let shown = shown.json();
    assert_eq!(shown["capabilities"], json!(["completion", "tools"]));
    assert_eq!(shown["model_info"]["llama.context_length"], 4096);
    assert_eq!(shown["model_info"]["general.architecture"], "llama");
    assert_eq!(shown["details"]["family"], "llama");
    let embed = call(&h, "/api/show", json!({"model": "embed:latest"}))
        .await
        .json();
    assert_eq!(embed["capabilities"], json!(["embedding"]));
    let missing = call(&h, "/api/show", json!({"model": "nope"})).await;
    assert_eq!(missing.status, 404);
    assert!(error_text(&missing).contains("model \"nope\" not found"));

    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_lists_loaded_models_with_memory_and_expiry() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("chat", "", "ttl: 300\ncapabilities: {context: 4096}")
    ))
    .await;
    let ps = get(&format!("{}/api/ps", h.url)).await.json();
    assert_eq!(ps["models"], json!([]), "nothing loaded yet");
    let answered = call(
        &h,
        "/api/chat",
        with(chat_body("chat"), json!({"stream": false})),
    )
    .await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let ps = get(&format!("{}/api/ps", h.url)).await.json();
    let running = &ps["models"][0];
    assert_eq!(running["name"], "chat", "{ps}");
    assert!(
        running["size_vram"].is_u64() && running["size"].is_u64(),
        "{running}"
    );
    assert_eq!(running["context_length"], 4096);
    let expires = corral_time(running["expires_at"].as_str().expect("a ttl of 300s"));
    let left = expires.duration_since(SystemTime::now()).unwrap();
    assert!(
        left > Duration::from_secs(250) && left <= Duration::from_secs(301),
        "{left:?}"
    );
    h.stop().await;
}

/// An RFC 3339 time in UTC, `2026-01-02T03:04:05Z`.
fn corral_time(text: &str) -> SystemTime {
    let n = |r: std::ops::Range<usize>| text[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_ndjson_by_default_and_is_metered() {
    let h = Harness::start(&format!("models:\n{}", fake_model("chat", "", ""))).await;
    let body = with(
        chat_body("chat"),
        json!({"options": {"num_predict": 3, "temperature": 0.1}}),
    );
    let r = call(&h, "/api/chat", body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let got = lines(&r);
    assert_eq!(got.len(), 4, "three pieces and the last: {got:?}");
    for piece in &got[..3] {
        assert_eq!(piece["model"], "chat");
        assert_eq!(piece["done"], false);
        assert_eq!(piece["message"]["role"], "assistant");
        assert!(
            piece["message"]["content"]
                .as_str()
                .unwrap()
                .starts_with("tok"),
            "{piece}"
        );
        assert!(piece["created_at"].is_string());
    }
    let last = &got[3];
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["eval_count"], 3);
    assert!(last["prompt_eval_count"].as_u64().unwrap() > 0, "{last}");
    assert!(last["total_duration"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(h.count_requests("chat", "/v1/chat/completions"), 1);

    let activity = get(&format!("{}/api/metrics/activity?model=chat", h.url))
        .await
        .json();
    let row = &activity["data"][0];
    assert_eq!(row["req_path"], "/api/chat", "{activity}");
    assert_eq!(row["tokens"]["output_tokens"], 3, "{row}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_whole_when_asked() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let whole = call(
        &h,
        "/api/chat",
        with(chat_body("m"), json!({"stream": false})),
    )
    .await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(whole.header("content-type"), Some("application/json"));
    let whole = whole.json();
    assert_eq!(whole["done"], true);
    assert!(whole["message"]["content"]
        .as_str()
        .unwrap()
        .contains("hello from fakellm"));
    assert!(whole["eval_count"].as_u64().is_some(), "{whole}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_responses_and_a_raw_prompt_is_a_text_completion() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;

    let generated = call(
        &h,
        "/api/generate",
        json!({"model": "m", "prompt": "hi", "stream": false}),
    )
    .await;
    let generated = generated.json();
    assert!(
        generated["response"]
            .as_str()
            .unwrap()
            .contains("hello from fakellm"),
        "{generated}"
    );
    assert_eq!(generated["done"], true);

    let streamed = call(
        &h,
        "/api/generate",
        json!({"model": "m", "prompt": "hi", "options": {"num_predict": 2}}),
    )
    .await;
    let got = lines(&streamed);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0]["response"].as_str().unwrap().starts_with("tok"));
    assert_eq!(got[2]["done"], true);
    assert_eq!(got[2]["response"], "");

    let raw = call(
        &h,
        "/api/generate",
        json!({"model": "m", "prompt": "hi", "raw": true, "stream": false}),
    )
    .await;
    assert_eq!(raw.status, 200, "{}", raw.text());
    assert_eq!(
        h.count_requests("m", "/v1/completions"),
        1,
        "a raw prompt is a text completion"
    );
    assert_eq!(h.count_requests("m", "/v1/chat/completions"), 2);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_embedding_routes_answer_in_their_shapes() {
    let h = Harness::start(&format!("models:\n{}", fake_model("e", "--embedding", ""))).await;
    let many = call(&h, "/api/embed", json!({"model": "e", "input": ["a", "b"]})).await;
    assert_eq!(many.status, 200, "{}", many.text());
    let many = many.json();
    assert_eq!(many["model"], "e");
    let vectors = many["embeddings"].as_array().unwrap();
    assert_eq!(vectors.len(), 2);
    assert_eq!(vectors[0].as_array().unwrap().len(), 8);
    assert_ne!(vectors[0], vectors[1]);
    assert!(many["prompt_eval_count"].as_u64().unwrap() > 0);
    let one = call(&h, "/api/embed", json!({"model": "e", "input": "a"}))
        .await
        .json();
    assert_eq!(one["embeddings"][0], vectors[0]);
    let old = call(&h, "/api/embeddings", json!({"model": "e", "prompt": "a"}))
        .await
        .json();
    assert_eq!(old, json!({"embedding": vectors[0]}));
    assert_eq!(h.count_requests("e", "/v1/embeddings"), 3);
    h.stop().await;
}

async fn is_running(h: &Harness, id: &str) -> bool {
    h.running().await.iter().any(|r| r == id)
}

/// `keep_alive: -1` keeps a model with a short `ttl` loaded past it (a sibling loaded later with
/// the same ttl is unloaded first), and `0` unloads it once its answer is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_zero_unloads_and_negative_keeps() {
    let h = Harness::start(&format!(
        "groups:\n  all: {{swap: false, members: [kept, other]}}\nmodels:\n{}{}",
        fake_model("kept", "", "ttl: 1"),
        fake_model("other", "", "ttl: 1"),
    ))
    .await;
    let whole = |m: &str, extra: Value| with(chat_body(m), with(json!({"stream": false}), extra));
    let r = call(&h, "/api/chat", whole("kept", json!({"keep_alive": -1}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        call(&h, "/api/chat", whole("other", json!({})))
            .await
            .status,
        200
    );
    let ps = get(&format!("{}/api/ps", h.url)).await.json();
    let kept = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "kept")
        .unwrap()
        .clone();
    assert!(
        kept.get("expires_at").is_none(),
        "kept loaded: no expiry: {kept}"
    );
    eventually(
        Duration::from_secs(10),
        "the sibling's ttl of 1s unloads it",
        || h.count_events("other", "sigterm") > 0,
    )
    .await;
    assert!(
        is_running(&h, "kept").await,
        "keep_alive -1 outlasts the ttl"
    );

    let r = call(&h, "/api/chat", whole("kept", json!({"keep_alive": "0s"}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.count_events("kept", "sigterm"), 0);
    eventually(Duration::from_secs(10), "keep_alive 0 unloads", || {
        h.count_events("kept", "sigterm") > 0
    })
    .await;
    h.stop().await;
}

/// A generate without a prompt loads a model, and a chat without messages with `keep_alive: 0`
/// unloads it, as Ollama's clients do to load and stop models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_prompt_loads_and_keep_alive_zero_without_messages_unloads() {
    let h = Harness::start(&format!("models:\n{}", fake_model("other", "", ""))).await;
    let loaded = call(
        &h,
        "/api/generate",
        json!({"model": "other", "stream": false}),
    )
    .await
    .json();
    assert_eq!(
        (loaded["done"].clone(), loaded["done_reason"].clone()),
        (json!(true), json!("load"))
    );
    assert_eq!(loaded["response"], "");
    assert!(
        is_running(&h, "other").await,
        "a generate without a prompt loads"
    );
    let unloaded = call(
        &h,
        "/api/chat",
        json!({"model": "other", "messages": [], "keep_alive": 0}),
    )
    .await;
    let last = lines(&unloaded).pop().unwrap();
    assert_eq!(last["done_reason"], "unload", "{last}");
    assert_eq!(last["message"]["content"], "");
    assert!(
        !is_running(&h, "other").await,
        "keep_alive 0 without messages unloads"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_come_in_ollamas_shape() {
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("m", "", ""),
        fake_model("broken", "--completion-status 500", "")
    ))
    .await;
    let unknown = call(&h, "/api/chat", chat_body("nope")).await;
    assert_eq!(unknown.status, 404);
    let text = error_text(&unknown);
    assert!(
        text.contains("model \"nope\" not found") && text.contains("/api/tags"),
        "{text}"
    );
    let no_model = call(&h, "/api/generate", json!({"prompt": "x"})).await;
    assert_eq!(
        (no_model.status, error_text(&no_model)),
        (400, "model is required".to_string())
    );
    let not_json = request("POST", &format!("{}/api/chat", h.url), &[], "{oops").await;
    assert_eq!(not_json.status, 400);
    assert!(error_text(&not_json).contains("not JSON"));
    let bad_keep = call(
        &h,
        "/api/chat",
        with(chat_body("m"), json!({"keep_alive": "soon"})),
    )
    .await;
    assert_eq!(bad_keep.status, 400);
    assert!(error_text(&bad_keep).contains("keep_alive"));
    let engine = call(&h, "/api/chat", chat_body("broken")).await;
    assert_eq!(engine.status, 500);
    assert!(
        error_text(&engine).contains("answering with status 500"),
        "{}",
        engine.text()
    );
    let pull = call(&h, "/api/pull", json!({"model": "llama3"})).await;
    assert_eq!(pull.status, 501);
    assert!(error_text(&pull).contains("models.<id>.source"));
    let delete = request(
        "DELETE",
        &format!("{}/api/delete", h.url),
        &[],
        r#"{"model":"m"}"#,
    )
    .await;
    assert_eq!(delete.status, 501, "{}", delete.text());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_ollama_routes_to_their_scope_and_model_list() {
    let h = Harness::start(&format!(
        "apiKeys:\n  - admin-key\n  - {{key: apps-key, scope: inference, models: [a]}}\nmodels:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    ))
    .await;
    let as_apps = |path: &str, body: Value| {
        let url = format!("{}{path}", h.url);
        async move {
            let headers = [
                ("x-api-key", "apps-key"),
                ("content-type", "application/json"),
            ];
            request("POST", &url, &headers, body.to_string()).await
        }
    };
    assert_eq!(get(&format!("{}/api/tags", h.url)).await.status, 401);
    assert_eq!(call(&h, "/api/chat", chat_body("a")).await.status, 401);
    let tags = request(
        "GET",
        &format!("{}/api/tags", h.url),
        &[("x-api-key", "apps-key")],
        "",
    )
    .await;
    assert_eq!(tags.status, 200, "{}", tags.text());
    assert_eq!(tags.json()["models"].as_array().unwrap().len(), 1);
    assert_eq!(tags.json()["models"][0]["name"], "a");
    let refused = as_apps("/api/chat", chat_body("b")).await;
    assert_eq!(refused.status, 403);
    assert!(
        error_text(&refused).contains("may not use model b"),
        "{}",
        refused.text()
    );
    assert_eq!(h.count_requests("b", "/v1/chat/completions"), 0);
    let shown = as_apps("/api/show", json!({"model": "b"})).await;
    assert_eq!(shown.status, 403);
    let allowed = as_apps("/api/chat", with(chat_body("a"), json!({"stream": false}))).await;
    assert_eq!(allowed.status, 200, "{}", allowed.text());
    let version = request(
        "GET",
        &format!("{}/api/version", h.url),
        &[("x-api-key", "apps-key")],
        "",
    )
    .await;
    assert_eq!(
        version.status, 200,
        "Ollama clients ask for the version first"
    );
    assert!(version.json()["version"].is_string());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_turns_the_api_off() {
    let h = Harness::start(&format!(
        "ollamaApi: false\nmodels:\n{}",
        fake_model("m", "", "")
    ))
    .await;
    let tags = get(&format!("{}/api/tags", h.url)).await;
    assert_eq!(
        (tags.status, tags.text()),
        (404, "404 page not found\n".to_string())
    );
    let chat = call(&h, "/api/chat", chat_body("m")).await;
    assert_eq!(chat.status, 404);
    assert_eq!(h.count_requests("m", "/v1/chat/completions"), 0);
    let openai = call(&h, "/v1/chat/completions", chat_body("m")).await;
    assert_eq!(openai.status, 200, "the OpenAI routes stay");
    h.stop().await;
}

/// `corral check` accepts the switch and says when the API is off.
#[test]
fn check_accepts_the_switch_and_says_when_it_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let check = |yaml: &str| {
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new(CORRAL)
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), text, err)
    };
    let models = "models:\n  a: {cmd: srv, proxy: 'http://h:1'}\n";
    let (code, out, err) = check(&format!("ollamaApi: false\n{models}"));
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("ollamaApi"), "no warning: {err}");
    assert!(out.contains("Ollama API: off"), "{out}");
    let (code, out, _) = check(models);
    assert_eq!(code, Some(0));
    assert!(!out.contains("Ollama API"), "{out}");
    let (code, _, err) = check(&format!("ollamaApi: maybe\n{models}"));
    assert_ne!(code, Some(0));
    assert!(err.contains("ollamaApi"), "{err}");
}

// === the official Python client ===

/// What the client must have seen of either engine.
fn assert_client_report(report: &Value, chat: &str, embed: &str) {
    let listed: Vec<&str> = report["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        listed.contains(&chat) && listed.contains(&embed),
        "{report}"
    );
    assert!(report["chat_chunks"].as_u64().unwrap() >= 2, "{report}");
    assert!(report["generate_chunks"].as_u64().unwrap() >= 2, "{report}");
    assert_eq!(report["chat_eval_count"], 4, "{report}");
    assert_eq!(report["embeddings"], 2, "{report}");
    assert!(report["embedding_dim"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(
        report["embedding_dim"], report["old_embedding_dim"],
        "{report}"
    );
    assert!(
        report["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("completion")),
        "{report}"
    );
    assert!(
        report["running"].as_array().unwrap().contains(&json!(chat)),
        "{report}"
    );
    assert_eq!(report["missing_status"], 404, "{report}");
    assert!(
        report["missing_error"]
            .as_str()
            .unwrap()
            .contains("no-such-model"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ollama_python_client_works_against_the_fake_engine() {
    let Some(python) = python() else { return };
    let h = Harness::start(&format!(
        "groups:\n  all: {{swap: false, members: [chat, embed]}}\nmodels:\n{}{}",
        fake_model("chat", "", ""),
        fake_model("embed", "--embedding", "")
    ))
    .await;
    let report = run_python(&python, "ollama_client.py", &[&h.url, "chat", "embed"]).await;
    assert_client_report(&report, "chat", "embed");
    assert_eq!(report["chat_done_reason"], "stop", "{report}");
    assert!(
        report["chat"]
            .as_str()
            .unwrap()
            .contains("hello from fakellm"),
        "{report}"
    );
    h.stop().await;
}

/// The same against llama.cpp's own server over tiny random-weight models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ollama_python_client_works_against_llama_server() {
    let Some(server) = llama_server() else { return };
    let Some(python) = python() else { return };
    let weights = tempfile::tempdir().unwrap();
    let (chat, embed) = (
        tiny_gguf(weights.path(), "chat", false),
        tiny_gguf(weights.path(), "embed", true),
    );
    let flags = "--host 127.0.0.1 --port ${PORT} -np 1 -t 1 --no-webui -c 256";
    let model = |id: &str, path: &Path, more: &str| {
        format!(
            "  {id}:\n    cmd: {server} -m {} {flags} {more}\n    env: [\"${{env.MARKER}}\"]\n",
            path.display()
        )
    };
    let h = Harness::start(&format!(
        "healthCheckTimeout: 60\ngroups:\n  all: {{swap: false, members: [chat, embed]}}\nmodels:\n{}{}",
        model("chat", &chat, ""),
        model("embed", &embed, "--embeddings --pooling mean"),
    ))
    .await;
    let report = run_python(&python, "ollama_client.py", &[&h.url, "chat", "embed"]).await;
    assert_client_report(&report, "chat", "embed");
    assert!(report["running_vram"].is_u64(), "{report}");
    assert_eq!(report["details_format"], "gguf", "{report}");
    h.stop().await;
}

/// `CORRAL_LLAMA_SERVER`, or `None` after a loud skip line; unset under CI fails.
fn llama_server() -> Option<String> {
    match std::env::var("CORRAL_LLAMA_SERVER") {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => panic!("CORRAL_LLAMA_SERVER is not set"),
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED (no llama-server): CORRAL_LLAMA_SERVER is not set; run scripts/test.sh ***\n"
            );
            None
        }
    }
}
