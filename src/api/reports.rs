//! Management routes that only report: running models, load, version, lifecycle, the activity
//! log and Prometheus metrics.

use http::{header, Response, StatusCode};
use serde_json::{json, Value};

use crate::api::json;
use crate::api::App;
use crate::config::Scope;
use crate::fleet::PhaseName;
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::grant::Grant;

/// `GET /running`: every instance not stopped, with its command line masked.
pub fn running(app: &App) -> Response<Body> {
    let list: Vec<_> = app
        .fleet
        .snapshot()
        .into_iter()
        .filter(|s| s.state != PhaseName::Stopped)
        .filter_map(|s| {
            // an instance a reload retired still runs until idle; the model may be gone from the config
            let m = app.config.models.get(&s.model)?;
            let spec = m.instances.iter().find(|i| i.id == s.instance).unwrap_or(&m.instances[0]);
            Some(json!({"model": s.instance, "state": s.state.as_str(), "cmd": app.config.redactor.command_line(s.argv.as_ref().unwrap_or(&spec.argv)), "proxy": spec.proxy,
                "ttl": m.ttl.map_or(0, |t| t.as_secs()), "name": m.name.clone().unwrap_or_default(),
                "description": m.description.clone().unwrap_or_default(), "pool": s.pool,
                "inFlight": s.in_flight, "slots": s.slots, "failures": s.failures, "circuitOpen": s.circuit_open,
                "engineSleeping": s.engine_sleeping,
                "devices": s.devices.iter().map(|(name, bytes)| json!({"device": name, "bytes": bytes})).collect::<Vec<_>>()}))
        })
        .collect();
    json(StatusCode::OK, &json!({"running": list}))
}

/// `GET /api/load`: requests running and waiting per model and pool, for a corral that has this one
/// as a peer (see `peer_load.rs`). A key that is not an admin's sees neither unlisted models nor
/// models outside its model list.
pub fn load_report(app: &App, caller: Option<&Grant>) -> Value {
    let shown = |id: &str| match caller {
        None => true,
        Some(g) => {
            let listed = app.config.models.get(id).is_none_or(|m| !m.unlisted);
            (g.scope == Scope::Admin || listed) && g.may_use(id)
        }
    };
    // the figures the model-server gauges publish, so a peer and a picker see the same load
    let (loads, _) =
        crate::metrics::model_server::loads(&app.fleet.snapshot(), &app.fleet.queue_depths());
    let mut models: serde_json::Map<String, Value> = app
        .config
        .models
        .keys()
        .filter(|id| shown(id))
        .map(|id| (id.clone(), json!({"running": 0, "waiting": 0})))
        .collect();
    for (id, load) in loads.into_iter().filter(|(id, _)| shown(id)) {
        models.insert(
            id,
            json!({"running": load.running, "waiting": load.waiting}),
        );
    }
    json!({"models": models})
}

/// `GET /api/version`: the version, and the commit and date the build was given.
pub fn version() -> Value {
    json!({"version": env!("CARGO_PKG_VERSION"), "commit": option_env!("CORRAL_COMMIT").unwrap_or("unknown"), "build_date": option_env!("CORRAL_BUILD_DATE").unwrap_or("unknown")})
}

/// `GET /api/lifecycle`: the fleet's recent lifecycle events.
pub fn lifecycle(app: &App) -> Value {
    json!({"events": app.fleet.recent_lifecycle_events()})
}

/// `GET /api/metrics/activity`: a page of the activity log, as the query asks.
pub fn activity(app: &App, query: Option<&str>) -> Result<Response<Body>, Error> {
    let page = app
        .activity
        .query(query.unwrap_or(""))
        .map_err(Error::BadRequest)?;
    Ok(json(StatusCode::OK, &page))
}

/// `GET /api/metrics/stats`: totals over the activity log, as the query asks.
pub fn stats(app: &App, query: Option<&str>) -> Result<Response<Body>, Error> {
    let stats = app
        .activity
        .stats(query.unwrap_or(""))
        .map_err(Error::BadRequest)?;
    Ok(json(StatusCode::OK, &stats))
}

/// `GET /metrics`: the Prometheus text, with the model gauges brought up to date first.
pub fn metrics(app: &App) -> Response<Body> {
    app.metrics.set_model_statuses(&app.fleet.statuses());
    let text = app.metrics.render(
        &app.fleet.snapshot(),
        &app.fleet.queue_depths(),
        &app.config.devices,
        &app.fleet.used_by_others(),
        app.config.vllm_metric_names,
    );
    Response::builder()
        .header(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )
        .body(crate::proxy::body::full(text))
        .expect("valid")
}
