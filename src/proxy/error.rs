//! One error type for everything a client can be told, and one function that renders it.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::proxy::body::{full, Body};

#[derive(Debug, Clone, thiserror::Error)]
#[cfg_attr(
    test,
    derive(strum::EnumDiscriminants),
    strum_discriminants(derive(strum::EnumIter))
)]
pub enum Error {
    #[error("no model id could be identified")]
    NoModel,
    #[error("no router for requested model")]
    UnknownModel,
    #[error("Too many requests")]
    ConcurrencyLimit,
    #[error("unspecific error: {0}")]
    StartFailed(String),
    #[error("unspecific error: group: model unloaded")]
    Unloaded,
    #[error("{0} is shutting down")]
    ShuttingDown(String),
    /// The upstream took the request and failed before an answer (a connection closed, a broken
    /// exchange).
    #[error("upstream error: {0}")]
    Upstream(String),
    /// No connection to the upstream could be made: refused, no answer, TLS refused. Said as
    /// [`Error::Upstream`] is; a pool takes such a member out at once.
    #[error("upstream error: {0}")]
    Unreachable(String),
    #[error("upstream did not send response headers within {0}s")]
    UpstreamTimeout(u64),
    #[error("request body is larger than the limit of {0} bytes")]
    BodyTooLarge(u64),
    /// The request body arrived too slowly (`clientTimeouts.requestBody`); the connection closes.
    #[error("request body too slow: {0}")]
    BodyTimeout(&'static str),
    #[error("unauthorized: invalid or missing API key")]
    Unauthorized,
    /// A valid key without the scope the route needs, or a cross-site request to a route that
    /// changes state.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
    #[error("request cancelled")]
    Cancelled,
    /// Not enough device memory; the message names what holds it.
    #[error("{0}")]
    InsufficientMemory(String),
    /// Temporarily unable to serve: a full queue (429) or no replica in time (503), with a retry hint.
    #[error("{message}")]
    Busy {
        status: u16,
        message: String,
        retry_after: u64,
    },
}

impl Error {
    pub fn status(&self) -> StatusCode {
        match self {
            Error::NoModel | Error::UnknownModel | Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::ConcurrencyLimit => StatusCode::TOO_MANY_REQUESTS,
            Error::StartFailed(_)
            | Error::Unloaded
            | Error::ShuttingDown(_)
            | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Upstream(_) | Error::Unreachable(_) => StatusCode::BAD_GATEWAY,
            Error::Cancelled | Error::InsufficientMemory(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Error::Unauthorized => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::Busy { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }

    /// The same error with known secrets masked in the messages that carry a command line or an
    /// engine's output (a failed start, and the backoff that repeats it).
    pub fn redacted(self, redactor: &crate::logs::redact::Redactor) -> Error {
        match self {
            Error::StartFailed(m) => Error::StartFailed(redactor.text(&m).into_owned()),
            Error::Busy {
                status,
                message,
                retry_after,
            } => Error::Busy {
                status,
                message: redactor.text(&message).into_owned(),
                retry_after,
            },
            other => other,
        }
    }

    /// This error as the last event of an event stream (see [`sse_error_event`]).
    pub fn sse_event(&self) -> Bytes {
        sse_error_event(self.status(), &self.to_string())
    }

    /// The `error.code` of the envelope: llama-swap's names by status.
    pub fn code(&self) -> &'static str {
        match self {
            Error::ConcurrencyLimit => return "concurrency_limit",
            Error::InsufficientMemory(_) => return "insufficient_memory",
            _ => {}
        }
        status_code_name(self.status())
    }
}

pub fn status_code_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        408 => "request_timeout",
        409 => "conflict",
        413 => "payload_too_large",
        429 => "rate_limit_exceeded",
        502 => "bad_gateway",
        503 => "service_unavailable",
        504 => "gateway_timeout",
        _ if status.is_client_error() => "invalid_request",
        _ => "internal_error",
    }
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        429 => "rate_limit_error",
        _ if status.is_client_error() => "invalid_request_error",
        _ => "server_error",
    }
}

/// An error told inside an event stream whose 200 status has already gone out: the shape
/// llama.cpp's server sends, `{"error": {"code": 500, "message": ..., "type": "server_error"}}`,
/// with the status as a number. OpenAI SDKs raise an event carrying `error` as an API error with
/// `error.message`. No `[DONE]` follows it.
pub fn sse_error_event(status: StatusCode, message: &str) -> Bytes {
    let event = serde_json::json!({"error": {
        "code": status.as_u16(),
        "message": message,
        "type": error_type(status),
    }});
    Bytes::from(format!("data: {event}\n\n"))
}

/// Renders an error as llama-swap does: plain text, HTML or the JSON envelope, by `Accept`.
pub fn render(err: &Error, accept: Option<&HeaderValue>) -> Response<Body> {
    let mut resp = render_message(err.status(), err.code(), &err.to_string(), accept);
    match err {
        Error::ConcurrencyLimit => {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        Error::Unauthorized => {
            // Bearer, not llama-swap's Basic: a Basic challenge makes browsers prompt and then
            // send the cached key with every request to this host, cross-site ones included.
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"corral\""),
            );
        }
        Error::InsufficientMemory(_) => {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        Error::Busy { retry_after, .. } => {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        _ => {}
    }
    resp
}

pub fn render_message(
    status: StatusCode,
    code: &str,
    message: &str,
    accept: Option<&HeaderValue>,
) -> Response<Body> {
    let accept = accept.and_then(|a| a.to_str().ok()).unwrap_or("");
    let (content_type, body) = if accept.contains("text/plain") {
        ("text/plain; charset=utf-8", format!("corral: {message}"))
    } else if accept.contains("text/html") {
        let escaped = message
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        (
            "text/html; charset=utf-8",
            format!("<!doctype html><html><body><h1>{status}</h1><p>{escaped}</p></body></html>"),
        )
    } else {
        let envelope = serde_json::json!({
            "src": "corral",
            "error": { "message": message, "type": error_type(status), "param": null, "code": code },
        });
        ("application/json", envelope.to_string())
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(full(Bytes::from(body)))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures_util::FutureExt;
    use http_body_util::BodyExt;
    use strum::IntoEnumIterator;

    /// What a client sees of one error: status, the envelope's `code` and `type`, the message,
    /// and the one extra header some errors carry.
    struct Seen {
        status: u16,
        code: &'static str,
        kind: &'static str,
        message: &'static str,
        header: Option<(&'static str, &'static str)>,
    }

    fn seen(status: u16, code: &'static str, kind: &'static str, message: &'static str) -> Seen {
        Seen {
            status,
            code,
            kind,
            message,
            header: None,
        }
    }

    fn every_variant() -> Vec<(Error, Seen)> {
        let busy = |status| Error::Busy {
            status,
            message: "busy".into(),
            retry_after: 7,
        };
        vec![
            (
                Error::NoModel,
                seen(
                    404,
                    "not_found",
                    "invalid_request_error",
                    "no model id could be identified",
                ),
            ),
            (
                Error::UnknownModel,
                seen(
                    404,
                    "not_found",
                    "invalid_request_error",
                    "no router for requested model",
                ),
            ),
            (
                Error::ConcurrencyLimit,
                Seen {
                    header: Some(("retry-after", "1")),
                    ..seen(
                        429,
                        "concurrency_limit",
                        "rate_limit_error",
                        "Too many requests",
                    )
                },
            ),
            (
                Error::StartFailed("x".into()),
                seen(500, "internal_error", "server_error", "unspecific error: x"),
            ),
            (
                Error::Unloaded,
                seen(
                    500,
                    "internal_error",
                    "server_error",
                    "unspecific error: group: model unloaded",
                ),
            ),
            (
                Error::ShuttingDown("m".into()),
                seen(500, "internal_error", "server_error", "m is shutting down"),
            ),
            (
                Error::Upstream("x".into()),
                seen(502, "bad_gateway", "server_error", "upstream error: x"),
            ),
            (
                Error::Unreachable("x".into()),
                seen(502, "bad_gateway", "server_error", "upstream error: x"),
            ),
            (
                Error::UpstreamTimeout(3),
                seen(
                    504,
                    "gateway_timeout",
                    "server_error",
                    "upstream did not send response headers within 3s",
                ),
            ),
            (
                Error::BodyTooLarge(9),
                seen(
                    413,
                    "payload_too_large",
                    "invalid_request_error",
                    "request body is larger than the limit of 9 bytes",
                ),
            ),
            (
                Error::BodyTimeout("x"),
                seen(
                    408,
                    "request_timeout",
                    "invalid_request_error",
                    "request body too slow: x",
                ),
            ),
            (
                Error::Unauthorized,
                Seen {
                    header: Some(("www-authenticate", "Bearer realm=\"corral\"")),
                    ..seen(
                        401,
                        "unauthorized",
                        "authentication_error",
                        "unauthorized: invalid or missing API key",
                    )
                },
            ),
            (
                Error::Forbidden("x".into()),
                seen(403, "forbidden", "invalid_request_error", "x"),
            ),
            (
                Error::BadRequest("x".into()),
                seen(400, "bad_request", "invalid_request_error", "x"),
            ),
            (
                Error::NotFound("x".into()),
                seen(404, "not_found", "invalid_request_error", "x"),
            ),
            (
                Error::Conflict("x".into()),
                seen(409, "conflict", "invalid_request_error", "x"),
            ),
            (
                Error::Internal("x".into()),
                seen(500, "internal_error", "server_error", "x"),
            ),
            (
                Error::Cancelled,
                seen(
                    503,
                    "service_unavailable",
                    "server_error",
                    "request cancelled",
                ),
            ),
            (
                Error::InsufficientMemory("x".into()),
                Seen {
                    header: Some(("retry-after", "5")),
                    ..seen(503, "insufficient_memory", "server_error", "x")
                },
            ),
            (
                busy(429),
                Seen {
                    header: Some(("retry-after", "7")),
                    ..seen(429, "rate_limit_exceeded", "rate_limit_error", "busy")
                },
            ),
            (
                busy(503),
                Seen {
                    header: Some(("retry-after", "7")),
                    ..seen(503, "service_unavailable", "server_error", "busy")
                },
            ),
        ]
    }

    /// Every variant's status, `code`, `type`, message and headers, as the JSON envelope and as
    /// an event-stream error. A new variant fails here until it has a row.
    #[test]
    fn every_error_renders_its_status_code_type_and_message() {
        let cases = every_variant();
        for variant in ErrorDiscriminants::iter() {
            assert!(
                cases
                    .iter()
                    .any(|(e, _)| ErrorDiscriminants::from(e) == variant),
                "{variant:?} has no row"
            );
        }
        for (err, want) in cases {
            let resp = render(&err, None);
            assert_eq!(resp.status().as_u16(), want.status, "{err:?}");
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            for name in ["retry-after", "www-authenticate"] {
                let expected = want.header.filter(|(n, _)| *n == name).map(|(_, v)| v);
                let got = resp.headers().get(name).map(|v| v.to_str().unwrap());
                assert_eq!(got, expected, "{name} of {err:?}");
            }
            let body = resp.into_body().collect().now_or_never().unwrap().unwrap();
            let envelope: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
            assert_eq!(
                envelope,
                serde_json::json!({"src": "corral", "error": {
                    "message": want.message, "type": want.kind, "param": null, "code": want.code}}),
                "{err:?}"
            );
            let event = String::from_utf8(err.sse_event().to_vec()).unwrap();
            let data = event
                .strip_prefix("data: ")
                .and_then(|e| e.strip_suffix("\n\n"));
            let data: serde_json::Value = serde_json::from_str(data.unwrap()).unwrap();
            assert_eq!(
                data,
                serde_json::json!({"error": {
                    "code": want.status, "message": want.message, "type": want.kind}}),
                "{err:?}"
            );
        }
    }

    #[test]
    fn accept_chooses_the_body_format() {
        let plain = render(
            &Error::UnknownModel,
            Some(&HeaderValue::from_static("text/plain")),
        );
        assert_eq!(
            plain.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let json = render(&Error::ConcurrencyLimit, None);
        assert_eq!(json.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(json.headers()[header::RETRY_AFTER], "1");
    }
}
