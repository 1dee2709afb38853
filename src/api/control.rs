//! Management routes that change state: loading and unloading models, cancelling a request in
//! flight, and choosing the active profile.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::api::json;
use crate::api::text;
use crate::api::App;
use crate::config::catalog::Target;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// `POST /api/models/load/<name>`: answers once the model is ready, with how long that took.
pub async fn load(app: &App, name: &str) -> Result<Response<Body>, Error> {
    let catalog = app.fleet.catalog();
    let (target, model) = catalog
        .resolve(name)
        .ok_or_else(|| Error::NotFound("model not found".into()))?;
    let (target, model) = (target.clone(), model.to_string());
    let started = std::time::Instant::now();
    drop(app.fleet.acquire(&target, None).await?);
    Ok(json(
        StatusCode::OK,
        &json!({"msg": "ok", "model": model, "state": "ready", "seconds": started.elapsed().as_secs_f64()}),
    ))
}

/// `POST /api/models/unload/<name>`: stops the model's instance, or every member of its pool.
pub async fn unload(app: &App, name: &str) -> Result<Response<Body>, Error> {
    let catalog = app.fleet.catalog();
    let (target, _) = catalog
        .resolve(name)
        .ok_or_else(|| Error::NotFound("model not found".into()))?;
    let ids = match target {
        Target::Instance(id) => vec![id.to_string()],
        Target::Pool(p) => catalog.pools[&**p].members.clone(),
    };
    app.fleet.unload(Some(&ids)).await;
    Ok(text(StatusCode::OK, "OK"))
}

/// `GET /unload`, llama-swap's: stops every model and answers in plain text.
pub async fn unload_all(app: &App) -> Result<Response<Body>, Error> {
    app.fleet.unload(None).await;
    Ok(text(StatusCode::OK, "OK"))
}

/// `POST /api/models/unload`: stops every model and answers in JSON.
pub async fn unload_all_json(app: &App) -> Result<Response<Body>, Error> {
    app.fleet.unload(None).await;
    Ok(json(StatusCode::OK, &json!({"msg": "ok"})))
}

/// `POST /api/inflight/<id>/cancel`. The id is taken as sent: it is a number, and the error names
/// exactly what the client asked for.
pub fn cancel_inflight(app: &App, id: &str) -> Result<Response<Body>, Error> {
    if !id.parse().is_ok_and(|id| app.inflight.cancel(id)) {
        return Err(Error::NotFound(format!("no request {id:?} in flight")));
    }
    Ok(json(StatusCode::OK, &json!({"msg": "ok"})))
}

/// `GET /api/profiles`: the configured profiles and the active one.
pub fn profiles(app: &App) -> Value {
    let profiles: Vec<_> = app
        .config
        .profiles
        .iter()
        .map(|(id, p)| json!({"id": id, "description": p.description, "pins": p.pins}))
        .collect();
    json!({"active": app.profiles.active(), "profiles": profiles})
}

/// The JSON body of a management request: small (64 KiB at most), charged to the body budget
/// while it is read.
pub(crate) async fn json_body<B>(app: &App, req: Request<B>) -> Result<Value, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    let declared = crate::routing::extract::declared_length(&parts.headers);
    let (bytes, _charge) =
        crate::routing::extract::read_body(declared, body, 64 * 1024, &app.budget).await?;
    serde_json::from_slice(&bytes).map_err(|e| Error::BadRequest(format!("invalid JSON: {e}")))
}

/// `PUT /api/profiles/active` with `{"name": "profile"}`, or `{"name": null}` for none.
pub async fn set_profile<B>(app: &Arc<App>, req: Request<B>) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let v = json_body(app, req).await?;
    let name = match v.get("name") {
        Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        _ => {
            return Err(Error::BadRequest(
                "body must be {\"name\": \"profile\"} or {\"name\": null}".into(),
            ))
        }
    };
    if let Some(n) = &name {
        if !app.config.profiles.contains_key(n) {
            return Err(Error::NotFound(format!("no profile {n:?}")));
        }
    }
    app.profiles.set(name.clone());
    tracing::info!("active profile: {}", name.as_deref().unwrap_or("none"));
    Ok(json(StatusCode::OK, &json!({"active": name})))
}
