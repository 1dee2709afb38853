//! Several applications on one corral: each key reaches only what its scope and model list allow,
//! corral's trust (its keys for peers, its origin in a browser) is lent to no one, and each key's
//! usage is counted under its name.

mod support;

use support::*;

const ADMIN: &str = "admin-key";
const APPS: &str = "apps-key";

/// An admin key and an inference key named `apps`, then `extra` top-level lines.
fn keys(extra: &str) -> String {
    format!("apiKeys:\n  - {ADMIN}\n  - {{key: {APPS}, scope: inference, name: apps}}\n{extra}")
}

async fn as_key(method: &str, url: &str, key: &str, extra: &[(&str, &str)], body: &str) -> Resp {
    let mut headers = vec![("x-api-key", key), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    request(method, url, &headers, body.to_string()).await
}

fn message(r: &Resp) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `/upstream/<model>/` lends an inference key only the engine's prompt-free reads: `/slots`
/// (every slot's conversation), a slot erase and every write need an admin key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_key_reaches_only_prompt_free_engine_reads() {
    let h = Harness::start(&format!("{}models:\n{}", keys(""), fake_model("m", "", ""))).await;
    let at = |path: &str| format!("{}/upstream/m{path}", h.url);
    for path in ["/health", "/props", "/metrics"] {
        let r = as_key("GET", &at(path), APPS, &[], "").await;
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    }
    for (method, path) in [
        ("GET", "/slots"),
        ("POST", "/slots/0?action=erase"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/props"),
    ] {
        let r = as_key(method, &at(path), APPS, &[], "{}").await;
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text());
        assert!(message(&r).contains("admin scope"), "{}", r.text());
    }
    let slots = as_key("GET", &at("/slots"), ADMIN, &[], "").await;
    assert_eq!(slots.status, 200, "{}", slots.text());
    assert!(slots.json().is_array(), "{}", slots.text());
    h.stop().await;
}

/// What an engine serves under `/upstream/` is sandboxed away from corral's origin, and a path
/// with `.` or `..` segments is refused before it reaches anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_pages_are_sandboxed_and_dot_segments_refused() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let r = get(&format!("{}/upstream/m/health", h.url)).await;
    assert_eq!(r.status, 200);
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.starts_with("sandbox") && !csp.contains("allow-same-origin"),
        "{csp}"
    );
    for path in ["/upstream/m/%2e%2e/slots", "/upstream/m/x/%2E/health"] {
        let r = get(&format!("{}{path}", h.url)).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    h.stop().await;
}

/// corral's key for a peer rides only on model routes: a path passed through to the peer goes
/// without it (and needs an admin key), and the client's cookies never go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_gets_corrals_key_only_on_model_routes() {
    // a keyless corral as the peer forwards what it receives to its engine, which echoes it
    let remote = Harness::start(&format!("models:\n{}", fake_model("far", "", ""))).await;
    let yaml = format!(
        "{}models:\n{}peers:\n  keyed:\n    proxy: {}\n    apiKey: peer-key\n    models: [far]\n",
        keys(""),
        fake_model("near", "", ""),
        remote.url
    );
    let h = Harness::start(&yaml).await;
    let echo = format!("{}/upstream/keyed/far/upstream/far/echo", h.url);
    let cookie = [("cookie", "session=dashboard")];
    let r = as_key("GET", &echo, APPS, &cookie, "").await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r = as_key("GET", &echo, ADMIN, &cookie, "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &r.json()["headers"];
    assert!(seen.is_object(), "{}", r.text());
    for header in ["authorization", "x-api-key", "cookie"] {
        assert!(
            seen.get(header).is_none(),
            "{header} reached the peer: {seen}"
        );
    }
    let chat = as_key(
        "POST",
        &format!("{}/v1/chat/completions", h.url),
        APPS,
        &cookie,
        &support::chat("keyed/far").to_string(),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    let seen = &chat.json()["fakellm"]["headers"];
    assert_eq!(seen["authorization"], "Bearer peer-key", "{seen}");
    assert!(seen.get("cookie").is_none(), "{seen}");
    h.stop().await;
    remote.stop().await;
}

/// A key with a model list uses and sees only those models (ids, aliases, patterns, peers'), and
/// the load report shows an inference key no unlisted model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_model_list_bounds_what_it_uses_and_sees() {
    let yaml = format!(
        "apiKeys:\n  - {ADMIN}\n  - {{key: {APPS}, scope: inference, models: [chat, 'emb*']}}\nmodels:\n{}{}{}",
        fake_model("chat", "", "aliases: [gpt]"),
        fake_model("embed", "", ""),
        fake_model("secret", "", "unlisted: true"),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for model in ["chat", "gpt", "embed"] {
        let r = as_key("POST", &url, APPS, &[], &support::chat(model).to_string()).await;
        assert_eq!(r.status, 200, "{model}: {}", r.text());
    }
    let r = as_key(
        "POST",
        &url,
        APPS,
        &[],
        &support::chat("secret").to_string(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        message(&r).contains("may not use model secret"),
        "{}",
        r.text()
    );
    let r = as_key(
        "GET",
        &format!("{}/upstream/secret/health", h.url),
        APPS,
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());

    let listed = as_key("GET", &format!("{}/v1/models", h.url), APPS, &[], "").await;
    let ids: Vec<String> = listed.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["chat", "embed"]);
    let load = as_key("GET", &format!("{}/api/load", h.url), APPS, &[], "").await;
    let load = load.json();
    assert!(
        !load["models"].as_object().unwrap().contains_key("secret"),
        "{load}"
    );
    let admin_load = as_key("GET", &format!("{}/api/load", h.url), ADMIN, &[], "").await;
    assert!(admin_load.json()["models"].get("secret").is_some());
    h.stop().await;
}

/// A page on another port of the same host (`Sec-Fetch-Site: same-site`) may not change state on
/// a keyless corral, and a loopback corral answers no name but loopback ones and `allowedHosts`
/// (DNS rebinding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_on_other_origins_and_rebound_names_are_refused() {
    let h = Harness::start(&format!(
        "allowedHosts: [corral.lan]\nmodels:\n{}",
        fake_model("m", "", "")
    ))
    .await;
    let same_site = [
        ("sec-fetch-site", "same-site"),
        ("origin", "http://localhost:3000"),
    ];
    let r = request(
        "POST",
        &format!("{}/api/models/unload", h.url),
        &same_site,
        "",
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let same_origin = [("sec-fetch-site", "same-origin")];
    let r = request(
        "POST",
        &format!("{}/api/models/unload", h.url),
        &same_origin,
        "",
    )
    .await;
    assert!(r.status < 400, "{}", r.text());

    let rebound = [("host", "attacker.example:8080")];
    for path in ["/running", "/api/metrics/activity", "/logs", "/health"] {
        let r = request("GET", &format!("{}{path}", h.url), &rebound, "").await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(message(&r).contains("allowedHosts"), "{}", r.text());
    }
    for host in ["corral.lan:8080", "localhost", "127.0.0.1:9"] {
        let r = request("GET", &format!("{}/running", h.url), &[("host", host)], "").await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    h.stop().await;
}

/// `openMetrics` leaves exactly `/metrics` open for a scraper or endpoint picker that sends no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_metrics_opens_metrics_alone() {
    let h = Harness::start(&format!(
        "{}models:\n{}",
        keys("openMetrics: true\n"),
        fake_model("m", "", "")
    ))
    .await;
    assert_eq!(get(&format!("{}/metrics", h.url)).await.status, 200);
    for path in ["/running", "/v1/models", "/api/captures/1", "/logs"] {
        assert_eq!(get(&format!("{}{path}", h.url)).await.status, 401, "{path}");
    }
    h.stop().await;
}

/// Each key's requests and tokens are counted under its name (or a fingerprint), never the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_counted_per_key() {
    let h = Harness::start(&format!("{}models:\n{}", keys(""), fake_model("m", "", ""))).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for key in [APPS, APPS, ADMIN] {
        let r = as_key("POST", &url, key, &[], &support::chat("m").to_string()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let metrics = as_key("GET", &format!("{}/metrics", h.url), ADMIN, &[], "")
        .await
        .text();
    let line = |name: &str, key: &str| -> Option<f64> {
        let prefix = format!("{name}{{key=\"{key}\",model=\"m\"");
        metrics
            .lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    assert_eq!(
        line("corral_key_requests_total", "apps"),
        Some(2.0),
        "{metrics}"
    );
    let admin_label = corral_fingerprint(ADMIN);
    assert_eq!(
        line("corral_key_requests_total", &admin_label),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        line("corral_key_prompt_tokens_total", "apps").unwrap_or(0.0) > 0.0,
        "{metrics}"
    );
    assert!(!metrics.contains(ADMIN) && !metrics.contains(APPS));

    let activity = |query: &str| {
        let url = format!("{}/api/metrics/activity{query}", h.url);
        async move { as_key("GET", &url, ADMIN, &[], "").await.json() }
    };
    let all = activity("").await;
    let keys: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(keys, [admin_label.as_str(), "apps", "apps"], "{all}");
    assert_eq!(
        all["keys"],
        serde_json::json!(["apps", admin_label]),
        "sorted"
    );
    let apps = activity("?key=apps").await;
    assert_eq!(apps["total"], 2, "{apps}");
    assert!(!all.to_string().contains(APPS) && !all.to_string().contains(ADMIN));
    h.stop().await;
}

/// A corral without keys logs its requests as llama-swap does: no key field, no key filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_activity_rows_carry_no_key() {
    let h = Harness::start(&format!("models:\n{}", fake_model("m", "", ""))).await;
    let r = post_json(
        &format!("{}/v1/chat/completions", h.url),
        &support::chat("m"),
    )
    .await;
    assert_eq!(r.status, 200);
    let all = get(&format!("{}/api/metrics/activity", h.url)).await.json();
    assert_eq!(all["total"], 1, "{all}");
    assert!(
        all["data"][0].get("key").is_none() && all.get("keys").is_none(),
        "{all}"
    );
    let metrics = get(&format!("{}/metrics", h.url)).await.text();
    assert!(!metrics.contains("corral_key_requests_total{"), "{metrics}");
    h.stop().await;
}

/// `key-` and the first eight hex digits of the key's SHA-256, as an unnamed key is labelled.
fn corral_fingerprint(key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("key-{hex}")
}
