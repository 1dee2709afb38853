//! llama-swap behaviours beyond the core: request rewriting, the model list, peers, profiles,
//! selectors, events, in-flight cancellation, preload and the load endpoint.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

fn seen_request(resp: &Resp) -> serde_json::Value {
    resp.json()["fakellm"]["request"].clone()
}

/// stripParams, setParams (nested keys too) and setParamsByID rewrite JSON bodies; `model` is protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_rewrite_the_body() {
    let extra = "filters:\n  stripParams: 'top_k, model'\n  setParams: {temperature: 0.1, chat_template_kwargs.enable_thinking: false}\n  setParamsByID:\n    'a:think': {chat_template_kwargs.enable_thinking: true}\n";
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", extra))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let r = post_json(
        &url,
        &json!({"model": "a", "top_k": 3, "temperature": 0.9, "messages": []}),
    )
    .await;
    let seen = seen_request(&r);
    assert_eq!(seen["model"], "a");
    assert!(seen.get("top_k").is_none());
    assert_eq!(seen["temperature"], 0.1);
    assert_eq!(seen["chat_template_kwargs"]["enable_thinking"], false);
    let r = post_json(&url, &json!({"model": "a:think", "messages": []})).await;
    assert_eq!(r.status, 200, "setParamsByID keys are aliases");
    assert_eq!(
        seen_request(&r)["chat_template_kwargs"]["enable_thinking"],
        true
    );
    h.stop().await;
}

/// The model list carries names, capabilities, metadata, aliases and status; unlisted models are hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_list_in_full() {
    let a = "name: Model A\ndescription: the first\naliases: [alpha]\nmetadata: {port: '${PORT}', family: test, context_length: 9}\ncapabilities: {in: [text, image], out: [text], tools: true, context: 8192}";
    let yaml = format!(
        "includeAliasesInList: true\nmodels:\n{}{}",
        fake_model("a", "", a),
        fake_model("hidden", "", "unlisted: true")
    );
    let h = Harness::start(&yaml).await;
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "alpha"]);
    let a = &list["data"][0];
    assert_eq!(a["name"], "Model A");
    assert_eq!(a["description"], "the first");
    assert_eq!(a["object"], "model");
    assert_eq!(
        a["architecture"],
        json!({"input_modalities": ["text", "image"], "output_modalities": ["text"], "modality": "text+image->text"})
    );
    assert_eq!(
        a["capabilities"],
        json!({"vision": true, "function_calling": true})
    );
    assert_eq!(a["supported_parameters"], json!(["tools", "tool_choice"]));
    assert_eq!(a["context_length"], 8192);
    assert_eq!(a["meta"]["n_ctx"], 8192);
    assert_eq!(a["meta"]["llamaswap"]["type"], "model");
    assert_eq!(a["meta"]["llamaswap"]["family"], "test");
    assert!(
        a["meta"]["llamaswap"]["port"].is_u64(),
        "macros keep their type in metadata"
    );
    assert!(
        a["meta"]["llamaswap"].get("context_length").is_none(),
        "replaced by capabilities"
    );
    assert_eq!(a["status"]["value"], "unloaded");
    assert_eq!(list["data"][1]["meta"]["llamaswap"]["type"], "alias");
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", h.url), &chat("hidden"))
            .await
            .status,
        200,
        "unlisted is still routable"
    );
    let resp = request(
        "GET",
        &format!("{}/v1/models", h.url),
        &[("origin", "http://ui.example")],
        "",
    )
    .await;
    assert_eq!(
        resp.header("access-control-allow-origin"),
        Some("http://ui.example")
    );
    h.stop().await;
}

/// A second corral as a peer: full ids `peer/model`, bare ids when unique, the peer's API key
/// injected, and a 502 naming the peer error when it is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_are_reached_by_full_and_bare_ids() {
    let remote = Harness::start(&format!(
        "apiKeys: [peer-key]\nmodels:\n{}",
        fake_model("far", "", "")
    ))
    .await;
    let dead = free_port_range(1);
    let yaml = format!(
        "models:\n{}peers:\n  other:\n    proxy: {}\n    apiKey: peer-key\n    models: [far]\n    filters: {{setParams: {{seed: 7}}}}\n  down:\n    proxy: http://127.0.0.1:{dead}\n    models: [gone]\n",
        fake_model("near", "", ""),
        remote.url
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for name in ["other/far", "far"] {
        let r = post_json(&url, &chat(name)).await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let seen = seen_request(&r);
        assert_eq!(seen["model"], "far", "the peer gets its bare id");
        assert_eq!(seen["seed"], 7);
    }
    // /upstream reaches a peer's model too, with the rest of the path and the peer's key
    let passthrough = get(&format!("{}/upstream/other/far/v1/models", h.url)).await;
    assert_eq!(passthrough.status, 200, "{}", passthrough.text());
    assert!(passthrough.text().contains("\"far\""));
    let down = post_json(&url, &chat("gone")).await;
    assert_eq!(down.status, 502);
    assert!(down.text().contains("peer proxy error"), "{}", down.text());
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    let peer = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "other/far")
        .unwrap()
        .clone();
    assert_eq!(peer["name"], "other: far");
    assert_eq!(peer["meta"]["llamaswap"]["type"], "peer");
    h.stop().await;
    remote.stop().await;
}

/// A task that reads the event stream at `url`, open before this returns, until a
/// `profileChanged` says that `name` is active.
async fn profile_told(url: &str, name: &'static str) -> tokio::task::JoinHandle<()> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let req = http::Request::get(url)
        .body(http_body_util::Empty::new())
        .unwrap();
    let mut body = client.request(req).await.unwrap().into_body();
    tokio::spawn(async move {
        let mut text = String::new();
        loop {
            let frame = body.frame().await.expect("the stream goes on").unwrap();
            text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
            let told = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .any(|d| {
                    let event: serde_json::Value = serde_json::from_str(d).unwrap_or_default();
                    let data = event["data"].as_str().unwrap_or("{}");
                    let data: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
                    event["type"] == "profileChanged" && data["active"] == name
                });
            if told {
                return;
            }
        }
    })
}

/// Profiles pin requested ids to targets while active, and disable ids pinned to nothing.
/// An open event stream is told of each change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_pin_and_switch() {
    let yaml = format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\nprofiles:\n  coding:\n    description: use b\n    pins: {{a: b, off: ~, quick: b}}\n",
        fake_model("a", "", "aliases: [off]"),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let profiles = get(&format!("{}/api/profiles", h.url)).await.json();
    assert_eq!(profiles["active"], serde_json::Value::Null);
    assert_eq!(profiles["profiles"][0]["id"], "coding");
    let told = profile_told(&format!("{}/api/events", h.url), "coding").await;
    let set = request(
        "PUT",
        &format!("{}/api/profiles/active", h.url),
        &[("content-type", "application/json")],
        r#"{"name":"coding"}"#,
    )
    .await;
    assert_eq!(set.json(), json!({"active": "coding"}));
    tokio::time::timeout(Duration::from_secs(5), told)
        .await
        .expect("profileChanged on the open event stream")
        .unwrap();
    // a pin that shadows no model id is listed while its profile is active; disabled ids are not
    let listed = get(&format!("{}/v1/models", h.url)).await.json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, ["a", "b", "quick"], "{listed}");
    let quick = &listed["data"][2]["meta"]["llamaswap"];
    assert_eq!(quick["type"], "profile", "{listed}");
    assert_eq!(quick["modelID"], "b", "{listed}");
    assert_eq!(
        seen_request(&post_json(&url, &chat("quick")).await)["model"],
        "b"
    );
    let r = post_json(&url, &chat("a")).await;
    assert_eq!(seen_request(&r)["model"], "b", "a is pinned to b");
    assert_eq!(h.count_requests("a", "/v1/chat/completions"), 0);
    assert_eq!(
        post_json(&url, &chat("off")).await.status,
        404,
        "pinned to nothing"
    );
    // the pins apply to /upstream paths too
    let (b_before, a_before) = (
        h.count_requests("b", "/props"),
        h.count_requests("a", "/props"),
    );
    let passthrough = get(&format!("{}/upstream/a/props", h.url)).await;
    assert_eq!(passthrough.status, 200);
    assert_eq!(h.count_requests("b", "/props"), b_before + 1);
    assert_eq!(h.count_requests("a", "/props"), a_before);
    let bad = request(
        "PUT",
        &format!("{}/api/profiles/active", h.url),
        &[],
        r#"{"name":"nope"}"#,
    )
    .await;
    assert_eq!(bad.status, 404);
    let clear = request(
        "PUT",
        &format!("{}/api/profiles/active", h.url),
        &[],
        r#"{"name":null}"#,
    )
    .await;
    assert_eq!(clear.status, 200);
    let listed = get(&format!("{}/v1/models", h.url)).await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(
        seen_request(&post_json(&url, &chat("a")).await)["model"],
        "a"
    );
    h.stop().await;
}

/// Selectors: pin always takes the first target; warm prefers a ready one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_pin_and_warm() {
    let yaml = format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\nselectors:\n  fast: {{strategy: pin, targets: [a, b]}}\n  any: {{strategy: warm, targets: [a, b]}}\n",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(
        seen_request(&post_json(&url, &chat("fast")).await)["model"],
        "a"
    );
    assert_eq!(
        post_json(&format!("{}/api/models/unload/a", h.url), &json!({}))
            .await
            .status,
        200
    );
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    assert_eq!(
        seen_request(&post_json(&url, &chat("any")).await)["model"],
        "b",
        "b is the warm one"
    );
    let list = get(&format!("{}/v1/models", h.url)).await.json();
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "any" && m["meta"]["llamaswap"]["type"] == "selector"));
    h.stop().await;
}

/// `/api/events` streams model states (double-encoded) and the requests in flight; a request can
/// be cancelled by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_and_inflight_cancel() {
    use http_body_util::BodyExt;
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", ""))).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("{}/api/events", h.url).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let url = format!("{}/v1/chat/completions", h.url);
    let long = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 100, "interval_ms": 100}});
    let stream = tokio::spawn(async move { stream_frames(&url, &long).await });
    let mut text = String::new();
    let mut inflight_id = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while inflight_id.is_none() {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("events in time")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
        for block in text.split("\n\n") {
            let Some(data) = block.strip_prefix("event:message\ndata:") else {
                continue;
            };
            let Ok(outer) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            let inner: serde_json::Value =
                serde_json::from_str(outer["data"].as_str().unwrap()).unwrap();
            if outer["type"] == "inflight" && inner["operation"] == "upsert" {
                inflight_id = inner["request"]["id"].as_u64();
            }
        }
    }
    assert!(text.contains(r#""type":"modelStatus""#));
    let cancel = post(&format!(
        "{}/api/inflight/{}/cancel",
        h.url,
        inflight_id.unwrap()
    ))
    .await;
    assert_eq!(cancel.json(), json!({"msg": "ok"}));
    let (_, frames) = tokio::time::timeout(Duration::from_secs(5), stream)
        .await
        .expect("cancel ended the stream")
        .unwrap();
    assert!(frames.len() < 50, "the stream was cut short");
    assert_eq!(
        post(&format!("{}/api/inflight/999/cancel", h.url))
            .await
            .status,
        404
    );
    h.stop().await;
}

/// `POST /api/models/load/<id>` returns once the model is ready; preload loads at start without
/// sending the engine a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_load_and_preload() {
    let yaml = format!(
        "hooks:\n  on_startup:\n    preload: [pre, nosuch]\nmodels:\n{}{}groups:\n  g: {{swap: false, members: [pre, later]}}\n",
        fake_model("pre", "--loading-ms 200", ""),
        fake_model("later", "--loading-ms 200", "")
    );
    let h = Harness::start(&yaml).await;
    h.wait_ready(&["pre"], Duration::from_secs(15)).await;
    assert_eq!(h.count_requests("pre", "/v1/chat/completions"), 0);
    let load = post(&format!("{}/api/models/load/later", h.url)).await;
    assert_eq!(load.status, 200, "{}", load.text());
    assert_eq!(load.json()["state"], "ready");
    assert_eq!(h.running().await, ["later", "pre"]);
    assert_eq!(
        post(&format!("{}/api/models/load/nosuch", h.url))
            .await
            .status,
        404
    );
    h.stop().await;
}

/// `/upstream/<model>/x.js` does not load a model that is not ready: 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_paths_do_not_load_models() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", ""))).await;
    let resp = get(&format!("{}/upstream/a/assets/app.js", h.url)).await;
    assert_eq!(resp.status, 409);
    assert_eq!(h.count_events("a", "spawned"), 0);
    assert_eq!(
        get(&format!("{}/upstream/a/health", h.url)).await.status,
        200
    );
    assert_eq!(
        get(&format!("{}/upstream/a/assets/app.js", h.url))
            .await
            .status,
        200,
        "served once loaded"
    );
    h.stop().await;
}

/// `/audioapi/...` drops its prefix on the way upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audioapi_prefix_is_stripped() {
    let h = Harness::start(&format!("models:\n{}", fake_model("a", "", ""))).await;
    let r = post_json(
        &format!("{}/audioapi/v1/tasks/run", h.url),
        &json!({"model": "a"}),
    )
    .await;
    assert_eq!(r.json()["path"], "/v1/tasks/run");
    h.stop().await;
}

/// The data of an event stream's last event.
fn last_event(text: &str) -> serde_json::Value {
    let last = text
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data:"))
        .last()
        .expect("events");
    serde_json::from_str(last.trim()).unwrap()
}

/// With sendLoadingState, a load that fails ends the already started stream with an error event in
/// the shape a broken upstream stream gets: llama.cpp's, with the status as a number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_state_ends_a_failed_load_with_an_error_event() {
    let yaml = format!(
        "sendLoadingState: true\nmodels:\n{}",
        fake_model("a", "--loading-ms 5000 --exit-after-ms 50", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = json!({"model": "a", "stream": true, "messages": []});
    let (resp, frames) = stream_frames(&url, &body).await;
    assert_eq!(resp.status, 200);
    let text = frames_text(&frames);
    let last = last_event(&text);
    assert_eq!(last["error"]["code"], 500, "{text}");
    assert_eq!(last["error"]["type"], "server_error", "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited prematurely"),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    h.stop().await;
}

/// With sendLoadingState, an engine that dies in the middle of the answer ends the stream with an
/// error event, as it does without the loading messages, where the stream used to end as if the
/// answer were whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_state_ends_a_broken_answer_with_an_error_event() {
    let yaml = format!(
        "sendLoadingState: true\nmodels:\n{}",
        fake_model("a", "--loading-ms 300 --abort-after-chunks 2", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 5, "interval_ms": 10}});
    let (resp, frames) = stream_frames(&url, &body).await;
    assert_eq!(resp.status, 200);
    let text = frames_text(&frames);
    assert!(text.contains("Done!"), "{text}");
    let last = last_event(&text);
    assert_eq!(last["error"]["code"], 502, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    h.stop().await;
}

/// With sendLoadingState, a streaming chat to a cold model gets loading progress as
/// reasoning_content at once, then the real stream in the same response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_state_streams_progress_then_the_answer() {
    let yaml = format!(
        "sendLoadingState: true\nmodels:\n{}",
        fake_model("a", "--loading-ms 1600", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 3, "interval_ms": 10}});
    let (resp, frames) = stream_frames(&url, &body).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let text: String = frames_text(&frames);
    let loading = text
        .find("corral loading model: a")
        .expect("loading message");
    let done = text.find("Done!").expect("done message");
    let first_token = text.find(r#""content":"tok0"#).expect("the real stream");
    assert!(loading < done && done < first_token, "{text}");
    assert!(
        text.matches(r#""reasoning_content":"."#).count() >= 1,
        "progress dots while loading"
    );
    assert!(
        frames[0].0 < Duration::from_millis(500),
        "the first bytes came before the load finished"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
    // a warm model streams as usual, with no loading messages
    let (_, again) = stream_frames(&url, &body).await;
    assert!(!again
        .iter()
        .any(|(_, f)| String::from_utf8_lossy(f).contains("loading")));
    h.stop().await;
}

/// A websocket upgrade through `/upstream/<model>/` is joined to the engine's, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_pass_through_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // an engine that accepts an upgrade and then echoes
    let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = engine.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut sock, _) = engine.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            sock.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(String::from_utf8_lossy(&head).starts_with("GET /socket?x=1 HTTP/1.1"));
        sock.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        loop {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            sock.write_all(&buf[..n]).await.unwrap();
        }
    });
    let yaml = format!("models:\n  ws:\n    cmd: sleep 60\n    checkEndpoint: none\n    proxy: http://127.0.0.1:{port}\n    env: [\"${{env.MARKER}}\"]\n");
    let h = Harness::start(&yaml).await;
    let mut sock = tokio::net::TcpStream::connect(h.url.trim_start_matches("http://"))
        .await
        .unwrap();
    sock.write_all(b"GET /upstream/ws/socket?x=1 HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        sock.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        String::from_utf8_lossy(&head).starts_with("HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    sock.write_all(b"ping-through-corral").await.unwrap();
    let mut echo = [0u8; 19];
    tokio::time::timeout(Duration::from_secs(5), sock.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"ping-through-corral");
    drop(sock);
    h.stop().await;
}

/// A spillover selector keeps to the first target until it has `spillover` requests in flight,
/// then spills to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spillover_selector_spills_under_load() {
    let yaml = format!(
        "models:\n{}{}groups:\n  g: {{swap: false, members: [a, b]}}\nselectors:\n  s: {{strategy: spillover, targets: [a, b], settings: {{spillover: 1}}}}\n",
        fake_model("a", "", ""),
        fake_model("b", "", "")
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(
        seen_request(&post_json(&url, &chat("s")).await)["model"],
        "a",
        "a cold selector starts its first target"
    );
    let long = json!({"model": "s", "stream": true, "messages": [], "fakellm": {"chunks": 10, "interval_ms": 100}});
    let busy = tokio::spawn({
        let url = url.clone();
        async move { stream_frames(&url, &long).await }
    });
    eventually(Duration::from_secs(15), "a busy", || {
        h.count_requests("a", "/v1/chat/completions") == 2
    })
    .await;
    assert_eq!(
        seen_request(&post_json(&url, &chat("s")).await)["model"],
        "b",
        "a has 1 in flight: spill to b"
    );
    busy.await.unwrap();
    h.stop().await;
}

/// `/api/metrics/activity` lists finished model requests with their tokens, newest first, filtered
/// and paged as llama-swap does; `/api/metrics/stats` sums them; bad parameters are a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_log_and_stats() {
    let h = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("a", "", ""),
        fake_model("b", "--completion-status 500", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    let streamed = json!({"model": "a", "stream": true, "messages": [], "fakellm": {"chunks": 3}});
    assert_eq!(stream_frames(&url, &streamed).await.0.status, 200);
    assert_eq!(post_json(&url, &chat("b")).await.status, 500);

    let page = get(&format!("{}/api/metrics/activity", h.url)).await.json();
    assert_eq!(page["total"], 3);
    assert_eq!(
        (page["page"].clone(), page["limit"].clone()),
        (json!(1), json!(25))
    );
    let newest = &page["data"][0];
    assert_eq!(newest["model"], "b");
    assert_eq!(newest["resp_status_code"], 500);
    assert!(newest["error_msg"].is_string(), "{newest}");
    let a_rows = get(&format!("{}/api/metrics/activity?model=a&order=asc", h.url))
        .await
        .json();
    assert_eq!(a_rows["total"], 2);
    for row in a_rows["data"].as_array().unwrap() {
        assert_eq!(row["req_path"], "/v1/chat/completions");
        assert!(
            row["tokens"]["output_tokens"].as_u64().unwrap() > 0,
            "{row}"
        );
    }
    assert!(a_rows["data"][1]["resp_content_type"]
        .as_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let bad = get(&format!("{}/api/metrics/activity?limit=0", h.url)).await;
    assert_eq!(bad.status, 400);
    let stats = get(&format!("{}/api/metrics/stats?model=a", h.url))
        .await
        .json();
    assert_eq!(stats["total_requests"], 2);
    assert!(stats["total_output_tokens"].as_u64().unwrap() > 0);
    h.stop().await;
}

/// Each activity row names its source as llama-swap does (`src`: `ip:` and the caller's address
/// and port), whether the request was answered or failed before its answer, and
/// `?src_prefix=` keeps the rows whose source starts with the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_rows_name_their_source_and_filter_by_its_prefix() {
    let broken = "  broken:\n    cmd: /nonexistent/engine --port ${PORT}\n";
    let h = Harness::start(&format!("models:\n{}{broken}", fake_model("a", "", ""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert!(post_json(&url, &chat("broken")).await.status >= 500);
    let activity = |query: &str| {
        let url = format!("{}/api/metrics/activity?{query}", h.url);
        async move { get(&url).await }
    };
    let page = activity("").await.json();
    let sources: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["src"].as_str().unwrap())
        .collect();
    assert_eq!(sources.len(), 2, "{page}");
    for src in &sources {
        let port = src
            .strip_prefix("ip:127.0.0.1:")
            .expect("ip:<address>:<port>");
        assert!(port.parse::<u16>().is_ok(), "{src}");
    }
    assert_eq!(activity("src_prefix=ip:127.").await.json()["total"], 2);
    assert_eq!(activity("src_prefix=ip:10.").await.json()["total"], 0);
    assert_eq!(activity("src_prefix=tc:").await.json()["total"], 0);
    let exact = activity(&format!("src_prefix={}", sources[0])).await.json();
    assert_eq!(exact["data"][0]["src"], sources[0]);
    h.stop().await;
}
