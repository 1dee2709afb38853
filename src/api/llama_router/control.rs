//! `POST /models/load` and `POST /models/unload` with `{"model": id}`, answering
//! `{"success": true}` as llama.cpp's router does. A load answers once the start is under way
//! (its progress shows in `GET /models` and `/models/sse`); an unload once the model stopped.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::{model_state, RouterState};
use crate::api::json;
use crate::api::App;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// The `model` of a `{"model": id}` body.
async fn model_of<B>(app: &App, req: Request<B>) -> Result<String, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let v = crate::api::control::json_body(app, req).await?;
    match v.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        _ => Err(Error::BadRequest(
            "body must be {\"model\": \"<model id>\"}".into(),
        )),
    }
}

/// The router's state of the model `name` means.
fn resolve(app: &App, name: &str) -> Result<RouterState, Error> {
    let catalog = app.fleet.catalog();
    let (_, model) = catalog
        .resolve(name)
        .ok_or_else(|| Error::NotFound(format!("model is not found: {name:?}")))?;
    let snapshot = app.fleet.snapshot();
    let members: Vec<_> = snapshot.iter().filter(|s| *s.model == **model).collect();
    Ok(model_state(&members))
}

fn success() -> Response<Body> {
    json(StatusCode::OK, &json!({"success": true}))
}

/// `POST /models/load`: starts the model and answers at once; one already running is refused as
/// the router refuses it.
pub async fn load<B>(app: &Arc<App>, req: Request<B>) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let name = model_of(app, req).await?;
    if resolve(app, &name)?.is_running() {
        return Err(Error::BadRequest(format!(
            "model is already running: {name:?}"
        )));
    }
    let app = app.clone();
    tokio::spawn(async move {
        // `/api/models/load`'s own load, whose answer nobody waits for: a failure shows in the
        // model's status
        if let Err(e) = crate::api::control::load(&app, &name).await {
            tracing::warn!("loading {name} for /models/load failed: {e}");
        }
    });
    Ok(success())
}

/// `POST /models/unload`: stops the model's instance, or every member of its pool; one that does
/// not run is refused as the router refuses it.
pub async fn unload<B>(app: &Arc<App>, req: Request<B>) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let name = model_of(app, req).await?;
    let state = resolve(app, &name)?;
    if !state.is_running() && state != RouterState::Downloading {
        return Err(Error::BadRequest(format!("model is not running: {name:?}")));
    }
    crate::api::control::unload(app, &name).await?;
    Ok(success())
}
