//! llama.cpp's router API in front of the fake engine: `GET /models` with status and
//! architecture, `POST /models/load` and `/models/unload`, `GET /models/sse`, `?autoload=false`,
//! `/metrics?model=`, `GET /v1/models/<id>`, and the metadata corral fills in.

mod support;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use support::*;

const WAIT: Duration = Duration::from_secs(20);

/// The entry `GET <path>` lists for `id`.
async fn entry(h: &Harness, path: &str, id: &str) -> Value {
    let list = get(&format!("{}{path}", h.url)).await.json();
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not listed: {list}"))
}

/// Polls `GET /models` until `id`'s `status.value` is `value`.
async fn wait_status(h: &Harness, id: &str, value: &str) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let e = entry(h, "/models", id).await;
        if e["status"]["value"] == value {
            return e;
        }
        assert!(std::time::Instant::now() < deadline, "never {value}: {e}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn model_body(id: &str) -> Value {
    json!({"model": id})
}

fn message(r: &Resp) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_carries_router_status_architecture_and_llama_swaps_fields() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("m", "-c 4096 -np 4", "aliases: [mm]")
    ))
    .await;
    for path in ["/models", "/v1/models"] {
        let e = entry(&h, path, "m").await;
        assert_eq!(e["status"]["value"], "unloaded", "{path}: {e}");
        assert_eq!(
            e["architecture"],
            json!({"input_modalities": ["text"], "output_modalities": ["text"], "modality": "text->text"}),
            "{e}"
        );
        assert_eq!(e["meta"]["llamaswap"]["type"], "model", "{e}");
        assert_eq!(e["meta"]["llamaswap"]["aliases"], json!(["mm"]), "{e}");
        assert_eq!(e["status"]["lifecycle"], "inactive", "{e}");
        assert_eq!(e["object"], "model");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_starts_the_model_and_unload_stops_it() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let r = post_json(&format!("{}/models/load", h.url), &model_body("m")).await;
    assert_eq!((r.status, r.json()), (200, json!({"success": true})));
    let e = wait_status(&h, "m", "loaded").await;
    let args = e["status"]["args"].as_array().expect("args while it runs");
    assert!(args.iter().any(|a| a == "--port"), "{e}");

    let again = post_json(&format!("{}/models/load", h.url), &model_body("m")).await;
    assert_eq!(again.status, 400, "{}", again.text());
    assert!(
        message(&again).contains("already running"),
        "{}",
        again.text()
    );

    let r = post_json(&format!("{}/models/unload", h.url), &model_body("m")).await;
    assert_eq!((r.status, r.json()), (200, json!({"success": true})));
    assert_eq!(
        entry(&h, "/models", "m").await["status"]["value"],
        "unloaded"
    );
    assert!(h.running().await.is_empty());
    let again = post_json(&format!("{}/models/unload", h.url), &model_body("m")).await;
    assert_eq!(again.status, 400, "{}", again.text());
    assert!(message(&again).contains("not running"), "{}", again.text());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_errors_use_the_openai_envelope() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    for path in ["/models/load", "/models/unload"] {
        let url = format!("{}{path}", h.url);
        let r = post_json(&url, &model_body("nope")).await;
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        assert!(message(&r).contains("\"nope\""), "{}", r.text());
        let r = post_json(&url, &json!({"name": "m"})).await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(message(&r).contains("{\"model\""), "{}", r.text());
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_need_an_admin_key() {
    let h = Harness::start(&format!(
        "apiKeys:\n  - admin-key\n  - {{key: app-key, scope: inference}}\nmodels:\n{}",
        fake_model("m", "", "")
    ))
    .await;
    let body = model_body("m").to_string();
    for path in ["/models/load", "/models/unload"] {
        let url = format!("{}{path}", h.url);
        let headers = [
            ("x-api-key", "app-key"),
            ("content-type", "application/json"),
        ];
        let r = request("POST", &url, &headers, body.clone()).await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    let headers = [
        ("x-api-key", "admin-key"),
        ("content-type", "application/json"),
    ];
    let r = request("POST", &format!("{}/models/load", h.url), &headers, body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    h.stop().await;
}

/// An event stream whose head has arrived: corral subscribed it before sending the head.
async fn open_events(url: &str) -> hyper::body::Incoming {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    resp.into_body()
}

/// The command line in `status.args` is an admin's to see, with the config's secrets masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_sees_the_command_line_and_never_its_secrets() {
    let h = Harness::start(&format!(
        "apiKeys:\n  - admin-key\n  - {{key: app-key, scope: inference}}\nmodels:\n{}",
        fake_model("m", "--api-key engine-secret-1234", "")
    ))
    .await;
    let admin = [
        ("x-api-key", "admin-key"),
        ("content-type", "application/json"),
    ];
    let load = model_body("m").to_string();
    let r = request("POST", &format!("{}/models/load", h.url), &admin, load).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = |key: &'static str| {
        let url = format!("{}/models", h.url);
        async move {
            let r = request("GET", &url, &[("x-api-key", key)], Bytes::new()).await;
            r.json()["data"][0]["status"].clone()
        }
    };
    let deadline = std::time::Instant::now() + WAIT;
    let mut seen = listed("admin-key").await;
    while seen["value"] != "loaded" {
        assert!(std::time::Instant::now() < deadline, "never loaded: {seen}");
        tokio::time::sleep(Duration::from_millis(25)).await;
        seen = listed("admin-key").await;
    }
    let args = seen["args"].to_string();
    assert!(args.contains("\"--api-key\",\"***\""), "{seen}");
    assert!(!args.contains("engine-secret-1234"), "{seen}");
    let seen = listed("app-key").await;
    assert_eq!(seen["value"], "loaded", "{seen}");
    assert!(seen.get("args").is_none(), "{seen}");
    h.stop().await;
}

/// The data lines of an event stream, read until `enough` says so.
async fn read_events(
    mut body: hyper::body::Incoming,
    mut enough: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let (mut text, mut events) = (String::new(), Vec::new());
    while !enough(&events) {
        let frame = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap_or_else(|_| panic!("no event in time; so far {events:?}"))
            .expect("stream open")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
        while let Some((line, rest)) = text.split_once("\n\n") {
            let data = line.strip_prefix("data: ").expect("a data line");
            events.push(serde_json::from_str(data).unwrap());
            text = rest.to_string();
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_tells_loading_then_loaded() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("m", "--loading-ms 300", "")
    ))
    .await;
    let body = open_events(&format!("{}/models/sse", h.url)).await;
    let r = post_json(&format!("{}/models/load", h.url), &model_body("m")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = read_events(body, |e| e.iter().any(|e| e["data"]["status"] == "loaded")).await;
    let statuses: Vec<&str> = events
        .iter()
        .filter(|e| e["model"] == "m" && e["event"] == "model_status")
        .map(|e| e["data"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["loading", "loaded"], "{events:?}");
    h.stop().await;
}

/// An engine that reports its loading progress (`checkEndpoint` answers `{"progress", "message"}`)
/// has each new value told as a `model_status` event, as llama.cpp's router tells its loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_tells_each_loading_progress() {
    let flags = "--loading-ms 1500 --progress-ms 300 --health-progress";
    let h = Harness::start(&format!("models:\n{}", fake_model("m", flags, ""))).await;
    let body = open_events(&format!("{}/models/sse", h.url)).await;
    let r = post_json(&format!("{}/models/load", h.url), &model_body("m")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = read_events(body, |e| e.iter().any(|e| e["data"]["status"] == "loaded")).await;
    let values: Vec<f64> = events
        .iter()
        .filter(|e| e["event"] == "model_status" && e["data"]["status"] == "loading")
        .filter_map(|e| e["data"]["progress"]["value"].as_f64())
        .collect();
    assert!(values.len() >= 2, "each new value is told: {events:#?}");
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    let first = events
        .iter()
        .find(|e| e["data"]["progress"].is_object())
        .unwrap();
    assert_eq!(first["data"]["progress"]["current"], "text_model");
    assert_eq!(first["data"]["progress"]["message"], "loading tensors");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoload_false_refuses_a_model_that_does_not_run() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let url = format!("{}/v1/chat/completions?autoload=false", h.url);
    let r = post_json(&url, &chat("m")).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let said = message(&r);
    assert!(
        said.contains("model is not loaded") && said.contains("\"m\""),
        "{said}"
    );
    assert!(said.contains("/models/load"), "{said}");
    assert!(h.running().await.is_empty(), "nothing was started");

    let loaded = post_json(&format!("{}/v1/chat/completions", h.url), &chat("m")).await;
    assert_eq!(loaded.status, 200, "{}", loaded.text());
    let r = post_json(&url, &chat("m")).await;
    assert_eq!(r.status, 200, "a running model answers: {}", r.text());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_model_are_its_engines_own() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let url = format!("{}/metrics?model=m", h.url);
    let r = get(&url).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(message(&r).contains("\"m\""), "{}", r.text());
    let r = get(&format!("{}/metrics?model=nope", h.url)).await;
    assert_eq!(r.status, 404, "{}", r.text());

    let answered = post_json(&format!("{}/v1/chat/completions", h.url), &chat("m")).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let engine = get(&url).await;
    assert_eq!(engine.status, 200, "{}", engine.text());
    assert!(
        engine.text().contains("llamacpp:prompt_tokens_total"),
        "{}",
        engine.text()
    );
    let own = get(&format!("{}/metrics", h.url)).await.text();
    assert!(!own.contains("llamacpp:"), "corral's own stay apart: {own}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_model_respect_a_keys_model_list() {
    let h = Harness::start(&format!(
        "apiKeys:\n  - {{key: ops-key, scope: metrics, models: [a]}}\nmodels:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    ))
    .await;
    let headers = [("x-api-key", "ops-key")];
    let of = |m: &str| format!("{}/metrics?model={m}", h.url);
    let r = request("GET", &of("b"), &headers, Bytes::new()).await;
    assert_eq!(r.status, 404, "b is not on the key's list: {}", r.text());
    let r = request("GET", &of("a"), &headers, Bytes::new()).await;
    assert_eq!(r.status, 503, "a is, and does not run: {}", r.text());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_model_is_the_lists_entry_or_a_404() {
    let h = Harness::start(&format!(
        "apiKeys:\n  - admin-key\n  - {{key: app-key, scope: inference, models: [a]}}\nmodels:\n{}{}",
        fake_model("a", "-c 2048", ""),
        fake_model("b", "", "")
    ))
    .await;
    let admin = [("x-api-key", "admin-key")];
    let list = request("GET", &format!("{}/v1/models", h.url), &admin, Bytes::new()).await;
    let listed = list.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "a")
        .cloned()
        .unwrap();
    let one = request(
        "GET",
        &format!("{}/v1/models/a", h.url),
        &admin,
        Bytes::new(),
    )
    .await;
    assert_eq!(one.status, 200, "{}", one.text());
    let mut one = one.json();
    one["created"] = listed["created"].clone();
    assert_eq!(one, listed);

    let missing = request(
        "GET",
        &format!("{}/v1/models/zz", h.url),
        &admin,
        Bytes::new(),
    )
    .await;
    assert_eq!(missing.status, 404, "{}", missing.text());
    assert_eq!(missing.json()["error"]["type"], "invalid_request_error");

    let app = [("x-api-key", "app-key")];
    let r = request("GET", &format!("{}/v1/models/a", h.url), &app, Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request("GET", &format!("{}/v1/models/b", h.url), &app, Bytes::new()).await;
    assert_eq!(r.status, 404, "hidden as the list hides it: {}", r.text());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_comes_from_the_command_then_from_the_running_engine() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("m", "-c 4096 -np 4 --props-n-ctx 3000", "")
    ))
    .await;
    let before = entry(&h, "/v1/models", "m").await;
    assert_eq!(before["context_length"], 1024, "{before}");
    assert_eq!(before["meta"]["n_ctx"], 1024, "{before}");
    let r = post_json(&format!("{}/v1/chat/completions", h.url), &chat("m")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let after = entry(&h, "/v1/models", "m").await;
    assert_eq!(after["context_length"], 3000, "{after}");
    assert_eq!(after["meta"]["n_ctx"], 3000, "{after}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_capabilities_win_and_disable_auto_fills_nothing() {
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("set", "-c 4096", "capabilities: {context: 999}"),
        fake_model("off", "-c 4096", "capabilities: {disableAuto: true}")
    ))
    .await;
    let set = entry(&h, "/v1/models", "set").await;
    assert_eq!(set["context_length"], 999, "{set}");
    assert_eq!(set["meta"]["n_ctx"], 999, "{set}");
    let off = entry(&h, "/v1/models", "off").await;
    assert!(off.get("context_length").is_none(), "{off}");
    assert!(off["meta"].get("n_ctx").is_none(), "{off}");
    h.stop().await;
}

/// A tiny llama GGUF trained for `n_ctx` tokens whose chat template renders tools.
fn tool_model(dir: &Path, n_ctx: u32) -> std::path::PathBuf {
    let opts = gguf::TinyOptions {
        n_ctx,
        ..gguf::TinyOptions::default()
    };
    let mut w = gguf::tiny_llama_writer(&opts).unwrap();
    w.set(
        "tokenizer.chat_template",
        "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let path = dir.join("tools.gguf");
    w.write_file(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_tells_context_size_and_tools_when_nothing_else_does() {
    let models = tempfile::tempdir().unwrap();
    let path = tool_model(models.path(), 2048);
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("g", &format!("-m {} -np 2", path.display()), ""),
        fake_model("vision", "--mmproj /nonexistent/mmproj.gguf", "")
    ))
    .await;
    let e = entry(&h, "/v1/models", "g").await;
    assert_eq!(e["context_length"], 1024, "2048 trained over 2 slots: {e}");
    assert_eq!(e["meta"]["n_ctx_train"], 2048, "{e}");
    assert!(e["meta"]["n_params"].as_u64().unwrap() > 0, "{e}");
    assert!(e["meta"]["size"].as_u64().unwrap() > 0, "{e}");
    assert_eq!(
        e["supported_parameters"],
        json!(["tools", "tool_choice"]),
        "{e}"
    );
    assert_eq!(e["capabilities"]["function_calling"], true, "{e}");
    let v = entry(&h, "/models", "vision").await;
    assert_eq!(
        v["architecture"]["input_modalities"],
        json!(["text", "image"]),
        "{v}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_shows_failed_with_its_exit_code() {
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model(
            "m",
            "--loading-ms 5000 --exit-after-ms 50 --exit-code 3",
            ""
        )
    ))
    .await;
    let r = post_json(&format!("{}/v1/chat/completions", h.url), &chat("m")).await;
    assert!(r.status >= 500, "{}", r.text());
    let e = wait_status(&h, "m", "unloaded").await;
    assert_eq!(e["status"]["failed"], true, "{e}");
    assert_eq!(e["status"]["exit_code"], 3, "{e}");
    h.stop().await;
}

/// The calls Open WebUI's llama.cpp connection makes, replayed: list the models and read
/// `status.value`, load one with `POST /models/load`, see it loaded, eject it with
/// `POST /models/unload`. The calls are those unslothai/unsloth PR #10693 lists as what Open WebUI's
/// llama.cpp provider needs (`GET /models`, `POST /models/load|unload` with `{"model"}`,
/// `status.value`), and those of llama.cpp's tools/server/README.md "Using multiple models".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_webuis_llama_cpp_connection_lists_loads_and_ejects() {
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    ))
    .await;
    let list = get(&format!("{}/models", h.url)).await.json();
    let loaded: Vec<&Value> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["status"]["value"] == "loaded")
        .collect();
    assert!(loaded.is_empty(), "{list}");
    let r = post_json(&format!("{}/models/load", h.url), &model_body("a")).await;
    assert_eq!(r.json()["success"], true, "{}", r.text());
    wait_status(&h, "a", "loaded").await;
    assert_eq!(
        entry(&h, "/models", "b").await["status"]["value"],
        "unloaded"
    );
    let r = post_json(&format!("{}/models/unload", h.url), &model_body("a")).await;
    assert_eq!(r.json()["success"], true, "{}", r.text());
    assert_eq!(
        entry(&h, "/models", "a").await["status"]["value"],
        "unloaded"
    );
    h.stop().await;
}

/// The `openai` SDK's `client.models.retrieve(id)`, and its `NotFoundError` for an unknown id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_retrieves_one_model() {
    let Some(python) = python() else { return };
    let h = Harness::start(&format!(
        "models:\n{}",
        fake_model("m", "-c 4096 -np 2", "")
    ))
    .await;
    let report = run_python(
        &python,
        "models_retrieve.py",
        &[h.url.as_str(), "m", "nope"],
    )
    .await;
    assert_eq!(report["id"], "m", "{report}");
    assert_eq!(report["object"], "model", "{report}");
    assert_eq!(report["context_length"], 2048, "{report}");
    assert_eq!(report["missing"], "NotFoundError", "{report}");
    h.stop().await;
}
