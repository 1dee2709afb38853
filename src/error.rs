//! One error type for everything a client can be told, and one function that renders it.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, Body};

#[derive(Debug, Clone, thiserror::Error)]
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
    #[error("upstream error: {0}")]
    Upstream(String),
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
            Error::Upstream(_) => StatusCode::BAD_GATEWAY,
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
    pub fn redacted(self, redactor: &crate::config::Redactor) -> Error {
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

    #[test]
    fn each_error_maps_to_its_status_and_code() {
        let cases = [
            (Error::NoModel, 404, "not_found"),
            (Error::UnknownModel, 404, "not_found"),
            (Error::ConcurrencyLimit, 429, "concurrency_limit"),
            (Error::StartFailed("x".into()), 500, "internal_error"),
            (Error::Upstream("x".into()), 502, "bad_gateway"),
            (Error::UpstreamTimeout(1), 504, "gateway_timeout"),
            (Error::BodyTooLarge(1), 413, "payload_too_large"),
            (Error::BodyTimeout("x"), 408, "request_timeout"),
            (Error::Unauthorized, 401, "unauthorized"),
            (Error::Forbidden("x".into()), 403, "forbidden"),
            (Error::Conflict("x".into()), 409, "conflict"),
        ];
        for (err, status, code) in cases {
            assert_eq!(err.status().as_u16(), status, "{err:?}");
            assert_eq!(err.code(), code, "{err:?}");
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
