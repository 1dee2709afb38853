//! The routes that show what the observation room holds: the performance samples, the hardware
//! readings and llama-swap's captures.

use http::{Response, StatusCode};
use serde_json::json;

use crate::api::{json, App};
use crate::observe::captures::Captures;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// Answers `/api/performance`, `/api/hardware` and `/api/captures/<id>`.
pub async fn answer(app: &App, path: &str, query: Option<&str>) -> Result<Response<Body>, Error> {
    if let Some(id) = path.strip_prefix("/api/captures/") {
        return Ok(capture(app.activity.captures.as_ref(), id));
    }
    if path == "/api/hardware" {
        return Ok(json(
            StatusCode::OK,
            &crate::observe::hardware::snapshot(&app.config).await,
        ));
    }
    if app.config.performance_disabled {
        return Ok(json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"enabled": false}),
        ));
    }
    let mut after = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "after" => {
                after = Some(crate::clock::rfc3339::parse(&v).ok_or_else(|| {
                    Error::BadRequest(format!("after must be an RFC 3339 time, not {v:?}"))
                })?)
            }
            other => return Err(Error::BadRequest(format!("unknown parameter {other:?}"))),
        }
    }
    let every = app.config.performance_every;
    Ok(json(StatusCode::OK, &app.performance.json(after, every)))
}

/// `GET /api/captures/<id>`: 400 for an id that is not a number, 404 when it is gone (or captures
/// are off).
fn capture(captures: Option<&Captures>, id: &str) -> Response<Body> {
    let Ok(id) = id.parse::<u64>() else {
        let bad = json!({"error": "invalid capture ID"});
        return json(StatusCode::BAD_REQUEST, &bad);
    };
    match captures.and_then(|c| c.get(id)) {
        Some(found) => json(StatusCode::OK, &found),
        None => json(
            StatusCode::NOT_FOUND,
            &json!({"error": "capture not found"}),
        ),
    }
}
