//! The security model: key scopes, corral's keys kept from engines and peers, secrets never shown,
//! and browsers kept from changing state or reading management routes from another site.

mod support;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use support::*;

const ADMIN: &str = "admin-key";
const INFERENCE: &str = "inference-key";
const METRICS: &str = "metrics-key";

/// A plain admin key (llama-swap's form), an explicit admin key, an inference key and a metrics key.
fn scoped_keys() -> String {
    format!(
        "apiKeys:\n  - {ADMIN}\n  - {{key: explicit-admin, scope: admin}}\n  - {{key: {INFERENCE}, scope: inference}}\n  - {{key: {METRICS}, scope: metrics}}\n"
    )
}

async fn send(method: &str, url: &str, key: &str, extra: &[(&str, &str)], body: &str) -> Resp {
    let mut headers = vec![("x-api-key", key), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    request(method, url, &headers, body.to_string()).await
}

/// The request headers the fake engine saw, from its chat answer or its echo route.
fn engine_saw(resp: &Resp) -> Value {
    let v = resp.json();
    if v["fakellm"].is_object() {
        v["fakellm"]["headers"].clone()
    } else {
        v["headers"].clone()
    }
}

/// Each scope reaches its own route class and gets 403, naming the scope needed, elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scope_reaches_only_its_routes() {
    let h = Harness::start(&format!(
        "{}models:\n{}",
        scoped_keys(),
        fake_model("m", "", "")
    ))
    .await;
    let chat_body = chat("m").to_string();
    // (method, path, body, scope it needs)
    let routes = [
        (
            "POST",
            "/v1/chat/completions",
            chat_body.as_str(),
            "inference",
        ),
        ("GET", "/v1/models", "", "inference"),
        ("GET", "/models", "", "inference"),
        ("GET", "/upstream/m/health", "", "inference"),
        ("GET", "/metrics", "", "metrics"),
        ("GET", "/running", "", "admin"),
        ("GET", "/logs", "", "admin"),
        ("GET", "/api/profiles", "", "admin"),
        ("POST", "/api/models/unload", "", "admin"),
    ];
    let keys = [
        (ADMIN, "admin"),
        ("explicit-admin", "admin"),
        (INFERENCE, "inference"),
        (METRICS, "metrics"),
    ];
    for (key, scope) in keys {
        for (method, path, body, needed) in routes {
            let r = send(method, &format!("{}{path}", h.url), key, &[], body).await;
            if scope == "admin" || scope == needed {
                assert!(r.status < 400, "{scope} key, {method} {path}: {}", r.status);
            } else {
                assert_eq!(r.status, 403, "{scope} key, {method} {path}");
                let err = r.json();
                assert_eq!(err["error"]["code"], "forbidden");
                assert_eq!(
                    err["error"]["message"],
                    format!("forbidden: this API key lacks the {needed} scope")
                );
                assert_eq!(err["src"], "corral");
            }
        }
    }
    let wrong = send("GET", &format!("{}/metrics", h.url), "nope", &[], "").await;
    assert_eq!(
        wrong.status, 401,
        "an unknown key is unauthorized, not forbidden"
    );
    assert_eq!(
        wrong.header("www-authenticate"),
        Some("Bearer realm=\"corral\"")
    );
    h.stop().await;
}

/// corral's own key never reaches the engine: not in `x-api-key`, not in `Authorization`, whether
/// the request went to a model route or through `/upstream`; an engine's own key in
/// `Authorization` still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_keys_are_not_forwarded_to_engines() {
    let h = Harness::start(&format!(
        "{}models:\n{}",
        scoped_keys(),
        fake_model("m", "", "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", h.url);
    let body = chat("m").to_string();
    let as_bearer = format!("Bearer {INFERENCE}");
    let r = request(
        "POST",
        &url,
        &[
            ("authorization", &as_bearer),
            ("content-type", "application/json"),
        ],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = engine_saw(&r);
    assert!(seen.is_object(), "the engine echoes headers: {}", r.text());
    assert!(seen.get("authorization").is_none(), "{seen}");

    let engine_own = [("authorization", "Bearer engine-own-key")];
    let r = send("POST", &url, INFERENCE, &engine_own, &body).await;
    let seen = engine_saw(&r);
    assert!(seen.get("x-api-key").is_none(), "{seen}");
    assert_eq!(seen["authorization"], "Bearer engine-own-key");

    let r = send("GET", &format!("{}/upstream/m/echo", h.url), ADMIN, &[], "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = engine_saw(&r);
    assert!(seen.is_object(), "{}", r.text());
    assert!(seen.get("x-api-key").is_none(), "{seen}");
    h.stop().await;
}

/// With no keys configured, llama-swap forwards `Authorization` and `x-api-key` untouched, which
/// an engine started with its own `--api-key` relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_key_headers_reach_the_engine() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let r = send(
        "POST",
        &format!("{}/v1/chat/completions", h.url),
        "engine-x-key",
        &[("authorization", "Bearer engine-own-key")],
        &chat("m").to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = engine_saw(&r);
    assert_eq!(seen["authorization"], "Bearer engine-own-key");
    assert_eq!(seen["x-api-key"], "engine-x-key");
    h.stop().await;
}

/// A client's corral key never reaches a peer: a peer without `apiKey` gets no key headers, one
/// with `apiKey` gets its own key in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_key_never_reaches_a_peer() {
    // a keyless corral as the peer forwards whatever it receives to its engine, so the engine's
    // echo shows what the peer was sent
    let remote = Harness::start(&format!(
        "models:\n{}{}",
        fake_model("far", "", ""),
        fake_model("far2", "", "")
    ))
    .await;
    let yaml = format!(
        "{}models:\n{}peers:\n  open:\n    proxy: {}\n    models: [far]\n  keyed:\n    proxy: {}\n    apiKey: peer-key\n    models: [far2]\n",
        scoped_keys(),
        fake_model("near", "", ""),
        remote.url,
        remote.url
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let bearer = format!("Bearer {INFERENCE}");
    let client_key = [("authorization", bearer.as_str())];
    let r = send(
        "POST",
        &url,
        INFERENCE,
        &client_key,
        &chat("open/far").to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = engine_saw(&r);
    assert!(seen.get("authorization").is_none(), "{seen}");
    assert!(seen.get("x-api-key").is_none(), "{seen}");
    let r = send(
        "POST",
        &url,
        INFERENCE,
        &client_key,
        &chat("keyed/far2").to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = engine_saw(&r);
    assert_eq!(seen["authorization"], "Bearer peer-key");
    assert_eq!(seen["x-api-key"], "peer-key");
    h.stop().await;
    remote.stop().await;
}

/// A model whose command carries an environment secret and a literal token; the fake engine warns
/// about both flags on stderr, so the values also reach the engine's log.
fn model_with_secrets() -> String {
    fake_model(
        "m",
        "--api-key ${env.ENGINE_SECRET} --hf-token=hf_literal_token",
        "",
    )
}

/// Secrets are `***` in `/running`, `/logs` and `/api/events`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_masked_in_running_logs_and_events() {
    let h = Harness::start(&format!(
        "logToStdout: both\napiKeys: [{ADMIN}]\nmodels:\n{}",
        model_with_secrets()
    ))
    .await;
    let r = send(
        "POST",
        &format!("{}/v1/chat/completions", h.url),
        ADMIN,
        &[],
        &chat("m").to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let running = send("GET", &format!("{}/running", h.url), ADMIN, &[], "").await;
    let cmd = running.json()["running"][0]["cmd"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cmd.contains("--api-key *** --hf-token=***"), "{cmd}");
    assert!(
        !cmd.contains(ENGINE_SECRET) && !cmd.contains("hf_literal"),
        "{cmd}"
    );

    let logs = loop_until_logged(&h).await;
    assert!(logs.contains("unknown argument --api-key ***"), "{logs}");
    assert!(
        !logs.contains(ENGINE_SECRET) && !logs.contains("hf_literal"),
        "{logs}"
    );
    let events = first_events(&h).await;
    assert!(
        events.contains("unknown argument --api-key ***"),
        "{events}"
    );
    assert!(
        !events.contains(ENGINE_SECRET) && !events.contains("hf_literal"),
        "{events}"
    );
    h.stop().await;
}

/// A command that cannot start fails the request with the command line in the message, secrets
/// masked; so do the model's status (which an inference key reads), its detail and its events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_does_not_show_the_secret() {
    let h = Harness::start(&format!(
        "apiKeys: [{ADMIN}, {{key: {INFERENCE}, scope: inference}}]\nmodels:\n  m:\n    cmd: /nonexistent/engine --port ${{PORT}} --api-key ${{env.ENGINE_SECRET}}\n"
    ))
    .await;
    let r = send(
        "POST",
        &format!("{}/v1/chat/completions", h.url),
        INFERENCE,
        &[],
        &chat("m").to_string(),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.text());
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("/nonexistent/engine"), "{message}");
    assert!(message.contains("--api-key ***"), "{message}");
    assert!(!message.contains(ENGINE_SECRET), "{message}");
    // the activity log keeps the same error, masked the same way
    let url = format!("{}/api/metrics/activity", h.url);
    let activity = send("GET", &url, ADMIN, &[], "").await.text();
    assert!(activity.contains("--api-key ***"), "{activity}");
    assert!(!activity.contains(ENGINE_SECRET), "{activity}");
    for (path, key) in [
        ("/v1/models", INFERENCE),
        ("/api/models/m", ADMIN),
        ("/api/lifecycle", ADMIN),
        ("/api/state", ADMIN),
    ] {
        let shown = send("GET", &format!("{}{path}", h.url), key, &[], "").await;
        let shown = shown.text();
        assert!(shown.contains("--api-key ***"), "{path}: {shown}");
        assert!(!shown.contains(ENGINE_SECRET), "{path}: {shown}");
    }
    h.stop().await;
}

/// `/logs` once the engine's startup warnings have been captured.
async fn loop_until_logged(h: &Harness) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let logs = send("GET", &format!("{}/logs", h.url), ADMIN, &[], "")
            .await
            .text();
        if logs.contains("--hf-token") || tokio::time::Instant::now() > deadline {
            return logs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The initial burst of `/api/events`, up to the in-flight snapshot that ends it.
async fn first_events(h: &Harness) -> String {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let req = http::Request::get(format!("{}/api/events", h.url))
        .header("x-api-key", ADMIN)
        .body(http_body_util::Empty::new())
        .unwrap();
    let mut body = client.request(req).await.unwrap().into_body();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !text.contains(r#""type":"inflight""#) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("events in time")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
    }
    text
}

/// `corral check` masks secrets unless asked with `--show-secrets`.
#[test]
fn check_masks_secrets_unless_shown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "models:\n  m:\n    cmd: env HF_TOKEN=hf_check_token srv --port ${PORT} --auth ${env.ENGINE_SECRET} --api-key=literal-key\n",
    )
    .unwrap();
    let check = |extra: &[&str]| {
        let out = std::process::Command::new(CORRAL)
            .arg("check")
            .arg("--config")
            .arg(&path)
            .args(extra)
            .env("ENGINE_SECRET", ENGINE_SECRET)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let masked = check(&[]);
    assert!(masked.contains("env HF_TOKEN=*** srv"), "{masked}");
    assert!(masked.contains("--auth *** --api-key=***"), "{masked}");
    assert!(
        !masked.contains(ENGINE_SECRET)
            && !masked.contains("literal-key")
            && !masked.contains("hf_check_token"),
        "{masked}"
    );
    let shown = check(&["--show-secrets"]);
    assert!(
        shown.contains(&format!(
            "env 'HF_TOKEN=hf_check_token' srv --port 5800 --auth {ENGINE_SECRET} '--api-key=literal-key'"
        )),
        "{shown}"
    );
}

/// A token given to a command run through `env` is `***` in `/running` and the model's detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_prefix_token_is_masked_in_running() {
    let h = Harness::start(&format!(
        "apiKeys: [{ADMIN}]\nmodels:\n  m:\n    cmd: env HF_TOKEN=hf_prefixed_token AWS_SESSION_TOKEN=aws_session_value ${{env.ENGINE}} --port ${{PORT}}\n    env: [\"${{env.MARKER}}\"]\n"
    ))
    .await;
    let chat_url = format!("{}/v1/chat/completions", h.url);
    let r = send("POST", &chat_url, ADMIN, &[], &chat("m").to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for path in ["/running", "/api/models/m"] {
        let shown = send("GET", &format!("{}{path}", h.url), ADMIN, &[], "").await;
        let shown = shown.text();
        assert!(
            shown.contains("env HF_TOKEN=*** AWS_SESSION_TOKEN=*** "),
            "{path}: {shown}"
        );
        assert!(
            !shown.contains("hf_prefixed_token") && !shown.contains("aws_session_value"),
            "{path}: {shown}"
        );
    }
    h.stop().await;
}

const CORRAL_KEY: &str = "corral-key-from-env";

/// An engine inherits none of corral's keys: neither the variable `apiKeys` names nor another that
/// holds the same key. Other variables pass (`HF_TOKEN`, to download with), and the engine
/// printing that token shows `***` in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_inherit_no_key_of_corrals() {
    let dir = tempfile::tempdir().unwrap();
    let dumped = dir.path().join("engine.env");
    let engine = executable(
        &dir.path().join("engine.sh"),
        &format!(
            "#!/bin/sh\nenv > '{}'\necho \"downloading with $HF_TOKEN\" >&2\nexec $ENGINE \"$@\"\n",
            dumped.display()
        ),
    );
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "startPort: {}\nlogToStdout: both\napiKeys: [\"${{env.CORRAL_KEY}}\"]\nmodels:\n  m:\n    cmd: {engine} --port ${{PORT}}\n    env: [\"${{env.MARKER}}\", \"GIVEN=${{env.CORRAL_KEY}}\"]\n",
            free_port_range(8)
        ),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let vars = [
        ("CORRAL_KEY", CORRAL_KEY),
        ("KEY_COPY", CORRAL_KEY),
        ("HF_TOKEN", "hf_inherited_token"),
    ];
    let p = process::spawn_corral_env(dir, &config, state.path(), &[], &vars);
    let chat_url = format!("{}/v1/chat/completions", p.url);
    let r = send("POST", &chat_url, CORRAL_KEY, &[], &chat("m").to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let env = std::fs::read_to_string(&dumped).unwrap();
    let lines: Vec<&str> = env.lines().collect();
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("CORRAL_KEY=") || l.starts_with("KEY_COPY=")),
        "{env}"
    );
    // the model's own `env` is the config's word, and is kept
    assert!(
        lines.contains(&format!("GIVEN={CORRAL_KEY}").as_str()),
        "{env}"
    );
    assert!(lines.contains(&"HF_TOKEN=hf_inherited_token"), "{env}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let logs = loop {
        let logs = send("GET", &format!("{}/logs", p.url), CORRAL_KEY, &[], "").await;
        let logs = logs.text();
        if logs.contains("downloading with") || tokio::time::Instant::now() > deadline {
            break logs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(logs.contains("downloading with ***"), "{logs}");
    assert!(!logs.contains("hf_inherited_token"), "{logs}");
}

/// `GET /unload` from another site is refused and unloads nothing; from the same origin, or from a
/// client that is no browser, it works as in llama-swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_cannot_change_state() {
    let h = Harness::start(&format!(
        "apiKeys: [{ADMIN}]\nmodels:\n{}",
        fake_model("m", "", "")
    ))
    .await;
    let load = send(
        "POST",
        &format!("{}/api/models/load/m", h.url),
        ADMIN,
        &[],
        "",
    )
    .await;
    assert_eq!(load.status, 200, "{}", load.text());
    let unload = format!("{}/unload", h.url);
    let same_origin = h.url.clone();
    for cross in [
        vec![("origin", "http://evil.example")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("origin", "null")],
    ] {
        let r = send("GET", &unload, ADMIN, &cross, "").await;
        assert_eq!(r.status, 403, "{cross:?}");
        assert_eq!(r.json()["error"]["code"], "forbidden");
    }
    let listed = send("GET", &format!("{}/running", h.url), ADMIN, &[], "").await;
    assert_eq!(
        listed.json()["running"][0]["state"],
        "ready",
        "still loaded"
    );
    let profile = send(
        "PUT",
        &format!("{}/api/profiles/active", h.url),
        ADMIN,
        &[("origin", "http://evil.example")],
        &json!({"name": null}).to_string(),
    )
    .await;
    assert_eq!(profile.status, 403);

    let same = [
        ("origin", same_origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    assert_eq!(send("GET", &unload, ADMIN, &same, "").await.status, 200);
    assert_eq!(send("GET", &unload, ADMIN, &[], "").await.status, 200);
    let listed = send("GET", &format!("{}/running", h.url), ADMIN, &[], "").await;
    assert_eq!(listed.json()["running"], json!([]), "unloaded");
    h.stop().await;
}

/// Without keys, a page on another site cannot load a model (and so swap out the one serving) with
/// a plain form POST, which a browser sends without asking; a JSON request from a browser app,
/// which CORS asks about first, still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_cannot_load_a_model() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    let form = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ];
    let r = request("POST", &url, &form, "model=m").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(h.running().await, Vec::<String>::new(), "nothing loaded");
    let json_app = [
        ("content-type", "application/json"),
        ("origin", "http://app.example"),
        ("sec-fetch-site", "cross-site"),
    ];
    let r = request("POST", &url, &json_app, chat("m").to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // the same form from a script (no browser headers) reaches the engine, which answers for itself
    assert_eq!(
        post(&format!("{}/api/models/unload", h.url)).await.status,
        200
    );
    let same = [("content-type", "application/x-www-form-urlencoded")];
    assert_ne!(request("POST", &url, &same, "model=m").await.status, 403);
    assert_eq!(h.running().await, ["m"], "loaded by the form");
    h.stop().await;
}

/// A page on another site cannot load a model with a GET either (an `<img>` of the engine's own
/// route, `/props?model=`, a websocket); the same GET from a script loads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_get_cannot_load_a_model() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let img = [("sec-fetch-site", "cross-site")];
    for path in ["/upstream/m/health", "/props?model=m"] {
        let r = request("GET", &format!("{}{path}", h.url), &img, Bytes::new()).await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    let socket = [
        ("origin", "http://evil.example"),
        ("connection", "upgrade"),
        ("upgrade", "websocket"),
    ];
    let r = request(
        "GET",
        &format!("{}/upstream/m/ws", h.url),
        &socket,
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(h.running().await, Vec::<String>::new(), "nothing loaded");
    let r = get(&format!("{}/upstream/m/health", h.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.running().await, ["m"]);
    h.stop().await;
}

/// With keys set, a preflight for a management route allows no origin, while model routes keep
/// `*` for browser API clients with their own key; without keys every preflight answers `*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_allow_any_origin_only_where_safe() {
    let preflight = |url: String| async move {
        let r = request(
            "OPTIONS",
            &url,
            &[
                ("origin", "http://ui.example"),
                ("access-control-request-method", "POST"),
            ],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 204);
        r.header("access-control-allow-origin").map(String::from)
    };
    let keyed = Harness::start(&format!(
        "{}models:\n{}",
        scoped_keys(),
        fake_model("m", "", "")
    ))
    .await;
    for admin_route in [
        "/running",
        "/unload",
        "/api/models/unload",
        "/logs",
        "/metrics",
    ] {
        let allowed = preflight(format!("{}{admin_route}", keyed.url)).await;
        assert_eq!(allowed, None, "{admin_route}");
    }
    let model = preflight(format!("{}/v1/chat/completions", keyed.url)).await;
    assert_eq!(model.as_deref(), Some("*"));
    keyed.stop().await;

    let open = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let allowed = preflight(format!("{}/running", open.url)).await;
    assert_eq!(
        allowed.as_deref(),
        Some("*"),
        "llama-swap's preflight without keys"
    );
    open.stop().await;
}

/// An engine that prints a secret in two pieces (two writes, two reads of its pipe) still shows
/// it masked: corral masks whole lines before it keeps or shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_printed_in_pieces_is_still_masked() {
    let yaml = "logToStdout: both\nmodels:\n  m:\n    cmd: sh -c 'printf \"token=abcd\"; sleep 0.3; printf \"1234 ok\\n\"; exec sleep 100'\n    env: [\"ENGINE_API_KEY=abcd1234\", \"${env.MARKER}\"]\n    checkEndpoint: none\n    proxy: http://127.0.0.1:9\n";
    let h = Harness::start(yaml).await;
    let load = post(&format!("{}/api/models/load/m", h.url)).await;
    assert_eq!(load.status, 200, "{}", load.text());
    let mut logs = String::new();
    for _ in 0..100 {
        logs = get(&format!("{}/logs", h.url)).await.text();
        if logs.contains(" ok") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(logs.contains("token=*** ok"), "{logs}");
    assert!(!logs.contains("abcd"), "{logs}");
    h.stop().await;
}
