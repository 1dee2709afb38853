//! `GET /api/tags` (the models), `GET /api/ps` (the loaded ones) and `POST /api/show` (one
//! model's details), answered from the config, the fleet and the weights' headers. A key with a
//! model list sees only the models it may use, as in `/v1/models`.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};

use super::errors::error;
use super::facts::{self, Facts};
use crate::api::json;
use crate::api::App;
use crate::config::ModelConfig;
use crate::fleet::{PhaseName, Snapshot};
use crate::proxy::body::Body;
use crate::routing::grant::Grant;

/// The most of a `/api/show` body that is read: it names a model and little else.
const SHOW_BODY_LIMIT: u64 = 64 * 1024;

/// Whether the key (if any) may use the model `id`.
fn may_use(caller: Option<&Grant>, id: &str) -> bool {
    caller.is_none_or(|g| g.may_use(id))
}

/// Reads the facts of the models `ids` off the async threads (a first read opens files).
async fn facts_of(app: &Arc<App>, ids: Vec<Arc<str>>) -> Vec<(Arc<str>, Facts)> {
    let app = app.clone();
    let read = move || {
        ids.into_iter()
            .map(|id| {
                let facts = facts::of_model(&app, &app.config.models[&*id]);
                (id, facts)
            })
            .collect()
    };
    tokio::task::spawn_blocking(read).await.unwrap_or_default()
}

/// `GET /api/tags`: every listed model, and the models of peers.
pub async fn tags(app: &Arc<App>, caller: Option<&Grant>) -> Response<Body> {
    let listed: Vec<Arc<str>> = app
        .config
        .models
        .values()
        .filter(|m| !m.unlisted && may_use(caller, &m.id))
        .map(|m| m.id.clone())
        .collect();
    let mut models: Vec<Value> = facts_of(app, listed)
        .await
        .iter()
        .map(|(id, facts)| tag(id, facts))
        .collect();
    let peers = app
        .config
        .peers
        .iter()
        .flat_map(|(peer, p)| p.models.iter().map(move |m| format!("{peer}/{m}")));
    for name in peers.filter(|n| may_use(caller, n)) {
        models.push(tag(&name, &Facts::default()));
    }
    json(StatusCode::OK, &json!({ "models": models }))
}

/// One model of the list: what is not known is left out, or zero for the size.
fn tag(name: &str, facts: &Facts) -> Value {
    let mut entry = json!({
        "name": name, "model": name, "size": facts.size, "details": facts.details(),
    });
    if let Some(modified) = facts.modified {
        entry["modified_at"] = json!(crate::clock::rfc3339::format(modified));
    }
    entry
}

/// `GET /api/ps`: the models with an instance ready, with the memory corral charges for them
/// (the engine's report once loaded) and when they unload for idleness.
pub async fn ps(app: &Arc<App>, caller: Option<&Grant>) -> Response<Body> {
    let snapshot = app.fleet.snapshot();
    let deadlines = app.fleet.idle_deadlines();
    let ready = |id: &str| -> Vec<&Snapshot> {
        (snapshot.iter())
            .filter(|s| s.model == id && s.state == PhaseName::Ready)
            .collect()
    };
    let loaded: Vec<Arc<str>> = (app.config.models.values())
        .filter(|m| may_use(caller, &m.id) && !ready(&m.id).is_empty())
        .map(|m| m.id.clone())
        .collect();
    let models: Vec<Value> = (facts_of(app, loaded).await.iter())
        .map(|(id, facts)| running(&app.config.models[&**id], facts, &ready(id), &deadlines))
        .collect();
    json(StatusCode::OK, &json!({ "models": models }))
}

/// One loaded model: its ready instances' memory summed, and the latest of their deadlines
/// (left out when one of them never unloads).
fn running(
    model: &ModelConfig,
    facts: &Facts,
    ready: &[&Snapshot],
    deadlines: &std::collections::BTreeMap<String, Option<std::time::SystemTime>>,
) -> Value {
    let vram: u64 = ready
        .iter()
        .flat_map(|s| s.devices.iter().map(|(_, b)| b))
        .sum();
    let charged: u64 = ready.iter().map(|s| s.measured.unwrap_or(s.memory)).sum();
    let due: Option<Vec<_>> = ready
        .iter()
        .map(|s| deadlines.get(&s.instance).copied().flatten())
        .collect();
    let mut entry = json!({
        "name": model.id, "model": model.id, "size": charged.max(vram), "size_vram": vram,
        "details": facts.details(),
    });
    if let Some(latest) = due.and_then(|d| d.into_iter().max()) {
        entry["expires_at"] = json!(crate::clock::rfc3339::format(latest));
    }
    if let Some(ctx) = facts::context_length(model) {
        entry["context_length"] = json!(ctx);
    }
    entry
}

/// `POST /api/show`: one model's details, parameters, template and model info.
pub async fn show<B>(app: &Arc<App>, req: Request<B>, caller: Option<&Grant>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let asked = match read_json(app, req).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let Some(name) = asked["model"].as_str().or_else(|| asked["name"].as_str()) else {
        return error(StatusCode::BAD_REQUEST, "model is required");
    };
    let routed = super::names::routed(app, name);
    let Some(id) = app.config.real_model_name(&routed).map(str::to_string) else {
        let e = crate::proxy::error::Error::UnknownModel;
        return super::errors::from_error(&e, name);
    };
    if !may_use(caller, &routed) && !may_use(caller, &id) {
        let message = format!("forbidden: this API key may not use model {name}");
        return error(StatusCode::FORBIDDEN, &message);
    }
    let model = &app.config.models[&id];
    let facts = facts_of(app, vec![model.id.clone()]).await.pop();
    let facts = facts.map(|(_, f)| f).unwrap_or_default();
    json(StatusCode::OK, &shown(model, &facts))
}

/// The body of a small JSON request, or the error to answer.
async fn read_json<B>(app: &App, req: Request<B>) -> Result<Value, Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let declared = crate::routing::extract::declared_length(req.headers());
    let read =
        crate::routing::extract::read_body(declared, req.into_body(), SHOW_BODY_LIMIT, &app.budget);
    let (bytes, _charge) = read.await.map_err(|e| super::errors::from_error(&e, ""))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("the request body is not JSON: {e}"),
        )
    })
}

/// What `/api/show` says of a model.
fn shown(model: &ModelConfig, facts: &Facts) -> Value {
    let mut info: Map<String, Value> = facts.info.clone();
    if let Some(ctx) = facts::context_length(model) {
        let arch = facts.family.as_deref().unwrap_or("general");
        info.insert(format!("{arch}.context_length"), json!(ctx));
    }
    let mut out = json!({
        "modelfile": format!("# served by corral: models.{} in its config\n", model.id),
        "parameters": parameters(model),
        "details": facts.details(),
        "model_info": info,
        "capabilities": facts::capabilities(model),
    });
    if let Some(template) = &facts.chat_template {
        out["template"] = json!(template);
    }
    if let Some(modified) = facts.modified {
        out["modified_at"] = json!(crate::clock::rfc3339::format(modified));
    }
    out
}

/// The sampling values the model's filters set on every request, one `name value` a line, as
/// Ollama lists a model's parameters.
fn parameters(model: &ModelConfig) -> String {
    model
        .filters
        .set_params
        .iter()
        .filter(|p| !p.path.contains('.'))
        .map(|p| format!("{} {}\n", p.path, p.value))
        .collect()
}
