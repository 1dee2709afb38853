//! `GET /metrics?model=<id>`: that model's engine's own metrics (llama-server's `llamacpp:*`), as
//! llama.cpp's router forwards them; plain `/metrics` stays corral's.

use http::{header, Response, StatusCode};

use crate::api::App;
use crate::fleet::PhaseName;
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::grant::Grant;

/// The text a ready instance of `name` answers on its `/metrics`, with its status and type.
pub async fn engine_metrics(
    app: &App,
    caller: Option<&Grant>,
    name: &str,
) -> Result<Response<Body>, Error> {
    let catalog = app.fleet.catalog();
    let model = match catalog.resolve(name) {
        Some((_, model)) if caller.is_none_or(|g| g.may_use(model)) => model.clone(),
        // a model the key may not use is as absent as the model list makes it
        _ => return Err(Error::NotFound(format!("model is not found: {name:?}"))),
    };
    let snapshot = app.fleet.snapshot();
    let base = snapshot
        .iter()
        .filter(|s| *s.model == *model && s.state == PhaseName::Ready)
        .find_map(|s| crate::api::metadata::base_of(&app.config, s))
        .ok_or_else(|| not_loaded(name))?;
    let client = crate::supervisor::HealthClient::default();
    let (status, body) = client.get(format!("{base}/metrics")).await.ok_or_else(|| {
        Error::Upstream(format!("the engine of {name:?} did not answer /metrics"))
    })?;
    let content_type = if status.is_success() {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "application/json"
    };
    Ok(Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(crate::proxy::body::full(body))
        .expect("valid response"))
}

/// 503: the model runs no engine to ask.
fn not_loaded(name: &str) -> Error {
    Error::Busy {
        status: StatusCode::SERVICE_UNAVAILABLE.as_u16(),
        message: format!(
            "model is not loaded: {name:?} runs no engine to read metrics from; load it with \
             POST /models/load {{\"model\": {name:?}}}"
        ),
        retry_after: 1,
    }
}
