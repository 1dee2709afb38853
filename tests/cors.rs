//! `security.cors` through the whole service: preflights answered before auth, CORS headers only
//! for allowed origins, an engine's own CORS headers replaced by corral's, and corral's browser
//! rules on top (keyed management routes, cross-site state changes).

mod support;

use bytes::Bytes;
use support::*;

const ADMIN: &str = "admin-key";
const INFERENCE: &str = "inference-key";
const DASH: &str = "https://dash.example";
const EVIL: &str = "https://evil.example";

/// A fake engine that answers with llama-server's CORS headers (its `Origin` echoed, credentials
/// allowed), behind `security` and `apiKeys` as given.
async fn corral(top: &str) -> Harness {
    Harness::start(&format!("{top}models:\n{}", fake_model("m", "--cors", ""))).await
}

/// A request from a page on `origin` (none: curl), with `key` in `x-api-key` when given.
async fn from(
    origin: Option<&str>,
    method: &str,
    url: &str,
    key: Option<&str>,
    extra: &[(&str, &str)],
) -> Resp {
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    headers.extend(origin.map(|o| ("origin", o)));
    headers.extend(key.map(|k| ("x-api-key", k)));
    let body = match method {
        "POST" => {
            headers.push(("content-type", "application/json"));
            chat("m").to_string()
        }
        _ => String::new(),
    };
    request(method, url, &headers, Bytes::from(body)).await
}

fn allow_origin(r: &Resp) -> Option<&str> {
    r.header("access-control-allow-origin")
}

/// With keys set and `*` listed beside a dashboard, any page reaches the model routes, the
/// dashboard alone the management routes; the engine's echo and credentials never get through;
/// a cross-site state change is still refused, readably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_policy_keeps_management_to_listed_origins() {
    let h = corral(&format!(
        "apiKeys:\n  - {ADMIN}\n  - {{key: {INFERENCE}, scope: inference}}\n\
         security:\n  cors:\n    allowedOrigins: ['*', '{DASH}']\n    exposedHeaders: [Retry-After]\n"
    ))
    .await;
    let url = |path: &str| format!("{}{path}", h.url);
    let ask = [("access-control-request-method", "GET")];

    let pre = from(Some(EVIL), "OPTIONS", &url("/running"), None, &ask).await;
    assert_eq!(pre.status, 204, "before auth");
    assert_eq!(allow_origin(&pre), None);
    let pre = from(Some(DASH), "OPTIONS", &url("/running"), None, &ask).await;
    assert_eq!((pre.status, allow_origin(&pre)), (204, Some(DASH)));
    let pre = from(
        Some(EVIL),
        "OPTIONS",
        &url("/v1/chat/completions"),
        None,
        &ask,
    )
    .await;
    assert_eq!(allow_origin(&pre), Some("*"));

    let chat = url("/v1/chat/completions");
    let answer = from(Some(EVIL), "POST", &chat, Some(INFERENCE), &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(allow_origin(&answer), Some("*"), "not the engine's echo");
    assert_eq!(answer.header("access-control-allow-credentials"), None);
    assert_eq!(
        answer.header("access-control-expose-headers"),
        Some("Retry-After")
    );
    let curl = from(None, "POST", &chat, Some(INFERENCE), &[]).await;
    assert_eq!(allow_origin(&curl), None, "the engine's empty echo is gone");

    let refused = from(Some(DASH), "GET", &url("/running"), None, &[]).await;
    assert_eq!((refused.status, allow_origin(&refused)), (401, Some(DASH)));
    let read = from(Some(EVIL), "GET", &url("/running"), Some(ADMIN), &[]).await;
    assert_eq!((read.status, allow_origin(&read)), (200, None));
    let unload = from(
        Some(DASH),
        "POST",
        &url("/api/models/unload"),
        Some(ADMIN),
        &[],
    )
    .await;
    assert_eq!(unload.status, 403, "{}", unload.text());
    assert_eq!(allow_origin(&unload), Some(DASH));
    h.stop().await;
}

/// Without keys, a listed origin alone is answered, with credentials and Chrome's private network
/// permission when configured; others get no CORS header, even from the engine or the model list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_origins_alone_are_answered() {
    let h = corral(&format!(
        "security:\n  cors:\n    allowedOrigins: ['{DASH}']\n    allowCredentials: true\n\
         \x20   allowPrivateNetwork: true\n    allowedMethods: [GET, POST]\n    maxAge: 120\n"
    ))
    .await;
    let url = |path: &str| format!("{}{path}", h.url);
    let pna = [
        ("access-control-request-method", "POST"),
        ("access-control-request-private-network", "true"),
    ];
    let pre = from(
        Some(DASH),
        "OPTIONS",
        &url("/v1/chat/completions"),
        None,
        &pna,
    )
    .await;
    assert_eq!(pre.status, 204);
    assert_eq!(allow_origin(&pre), Some(DASH));
    assert_eq!(pre.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(
        pre.header("access-control-allow-private-network"),
        Some("true")
    );
    assert_eq!(
        pre.header("access-control-allow-methods"),
        Some("GET, POST")
    );
    assert_eq!(pre.header("access-control-max-age"), Some("120"));
    let pre = from(
        Some(EVIL),
        "OPTIONS",
        &url("/v1/chat/completions"),
        None,
        &pna,
    )
    .await;
    assert_eq!(pre.status, 204);
    assert!(
        pre.headers
            .keys()
            .all(|n| !n.as_str().starts_with("access-control-")),
        "{:?}",
        pre.headers
    );

    let chat = url("/v1/chat/completions");
    let answer = from(Some(EVIL), "POST", &chat, None, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(allow_origin(&answer), None, "the engine echoed it");
    assert_eq!(answer.header("access-control-allow-credentials"), None);
    let answer = from(Some(DASH), "POST", &chat, None, &[]).await;
    assert_eq!(allow_origin(&answer), Some(DASH));
    assert_eq!(
        answer.header("access-control-allow-credentials"),
        Some("true")
    );
    let list = from(Some(EVIL), "GET", &url("/v1/models"), None, &[]).await;
    assert_eq!((list.status, allow_origin(&list)), (200, None));
    h.stop().await;
}

/// Without `security.cors` nothing changes from llama-swap v250: the model list echoes `Origin`
/// and an engine's own CORS headers pass through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_policy_answers_are_as_before() {
    let h = corral("").await;
    let list = from(
        Some(EVIL),
        "GET",
        &format!("{}/v1/models", h.url),
        None,
        &[],
    )
    .await;
    assert_eq!(allow_origin(&list), Some(EVIL));
    let chat = format!("{}/v1/chat/completions", h.url);
    let answer = from(Some(EVIL), "POST", &chat, None, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(allow_origin(&answer), Some(EVIL), "the engine's own");
    h.stop().await;
}
