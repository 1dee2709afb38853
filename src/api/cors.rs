//! CORS preflight: the answer to any OPTIONS request.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::body::Body;

/// Any OPTIONS request: permissive CORS, as llama-swap answers it, except that without
/// `any_origin` (management routes while keys are set) no origin is allowed, so no other site's
/// page can call them with a key it got hold of.
pub fn preflight(headers: &HeaderMap, any_origin: bool) -> Response<Body> {
    let requested = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty() && h.bytes().all(is_token_byte))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "Content-Type, Authorization, Accept, X-Requested-With".into());
    let mut resp = Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
        .header(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, PUT, PATCH, DELETE, OPTIONS",
        )
        .header(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_str(&requested).unwrap_or(HeaderValue::from_static("Content-Type")),
        )
        .header(header::ACCESS_CONTROL_MAX_AGE, "86400")
        .body(crate::body::empty())
        .expect("valid");
    if !any_origin {
        resp.headers_mut()
            .remove(header::ACCESS_CONTROL_ALLOW_ORIGIN);
    }
    resp
}

/// A byte HTTP allows in a header name (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
