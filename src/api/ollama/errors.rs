//! Failures in Ollama's shape: `{"error": "..."}` with a status, which its clients raise as a
//! response error carrying that text.

use http::{header, Response, StatusCode};
use serde_json::{json, Value};

use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// The most of an engine's error answer that is read for its message.
const UPSTREAM_ERROR_LIMIT: usize = 64 * 1024;

/// `{"error": message}` with `status`.
pub fn error(status: StatusCode, message: &str) -> Response<Body> {
    crate::api::json(status, &json!({ "error": message }))
}

/// corral's error for a request that named `model`, worded for an Ollama client: its status,
/// and the headers that tell when to try again or how to authenticate.
pub fn from_error(e: &Error, model: &str) -> Response<Body> {
    let message = match e {
        Error::UnknownModel | Error::NoModel => format!(
            "model \"{model}\" not found: corral serves the models its config names; GET /api/tags lists them"
        ),
        other => other.to_string(),
    };
    let mut resp = error(e.status(), &message);
    let rendered = crate::proxy::error::render(e, None);
    for name in [header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(value) = rendered.headers().get(&name) {
            resp.headers_mut().insert(name, value.clone());
        }
    }
    resp
}

/// An engine's answer that is not a success, with its status and the message it gave: OpenAI's
/// `{"error": {"message"}}`, a bare `{"error": "..."}`, or its text.
pub async fn from_upstream(resp: Response<Body>) -> Response<Body> {
    let status = resp.status();
    let limited = http_body_util::Limited::new(resp.into_body(), UPSTREAM_ERROR_LIMIT);
    let text = match super::collect(limited).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("the engine answered {status} and its body failed: {e}"),
    };
    error(status, &upstream_message(&text, status))
}

/// The message of an engine's error body.
pub fn upstream_message(text: &str, status: StatusCode) -> String {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let message = parsed.as_ref().and_then(|v| {
        let e = v.get("error")?;
        e.as_str()
            .or_else(|| e.get("message").and_then(Value::as_str))
            .map(String::from)
    });
    match message {
        Some(m) => m,
        None if text.trim().is_empty() => format!("the engine answered {status}"),
        None => text.trim().to_string(),
    }
}

/// A route of Ollama's model store: refused with what corral does instead.
pub fn not_served(route: &str) -> Response<Body> {
    let instead = match route {
        "pull" => "corral fetches a model's weights itself when its config names a source (models.<id>.source); add the model there",
        "push" => "corral keeps no model store to push from",
        "create" | "blobs" => "models are made by naming their weights and engine in corral's config (models.<id>)",
        "copy" => "a second name for a model is an alias in corral's config (models.<id>.aliases)",
        _ => "models are removed from corral's config; a running one is unloaded with POST /api/models/unload/<id>",
    };
    let message = format!("corral does not serve /api/{route}: {instead}");
    error(StatusCode::NOT_IMPLEMENTED, &message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(resp: Response<Body>) -> Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn an_unknown_model_is_named_with_where_to_look() {
        let resp = from_error(&Error::UnknownModel, "llama3:8b");
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let text = body(resp).await["error"].as_str().unwrap().to_string();
        assert!(text.contains("model \"llama3:8b\" not found"), "{text}");
        assert!(text.contains("/api/tags"), "{text}");
    }

    #[tokio::test]
    async fn a_busy_answer_keeps_its_retry_hint() {
        let busy = Error::Busy {
            status: 429,
            message: "queue full".into(),
            retry_after: 3,
        };
        let resp = from_error(&busy, "m");
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        assert_eq!(body(resp).await, json!({"error": "queue full"}));
    }

    #[test]
    fn an_engines_message_is_found_in_each_shape() {
        let bad = StatusCode::BAD_REQUEST;
        let openai = r#"{"error":{"code":400,"message":"context too long","type":"x"}}"#;
        assert_eq!(upstream_message(openai, bad), "context too long");
        assert_eq!(upstream_message(r#"{"error":"nope"}"#, bad), "nope");
        assert_eq!(upstream_message("plain text\n", bad), "plain text");
        assert_eq!(
            upstream_message("", bad),
            "the engine answered 400 Bad Request"
        );
    }

    #[tokio::test]
    async fn store_routes_say_what_corral_does_instead() {
        let resp = not_served("pull");
        assert_eq!(resp.status(), StatusCode::NOT_IMPLEMENTED);
        let text = body(resp).await["error"].as_str().unwrap().to_string();
        assert!(
            text.contains("/api/pull") && text.contains("source"),
            "{text}"
        );
    }
}
