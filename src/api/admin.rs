//! Management routes: model list, running models, unload, logs, version, CORS preflight.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use serde_json::json;

use super::{json, text, App};
use crate::body::Body;
use crate::catalog::Target;
use crate::error::Error;
use crate::fleet::Phase;
use crate::logs::LogRing;

async fn set_profile<B>(app: &Arc<App>, req: Request<B>) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    let (bytes, _charge) =
        super::extract::read_body(&parts.headers, body, 64 * 1024, &app.budget).await?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadRequest(format!("invalid JSON: {e}")))?;
    let name = match v.get("name") {
        Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
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

pub async fn route<B>(
    app: &Arc<App>,
    req: Request<B>,
    method: &Method,
    path: &str,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let get = *method == Method::GET || *method == Method::HEAD;
    match path {
        "/v1/models" | "/models" if get => Ok(super::models::list(app, req.headers())),
        "/running" if get => Ok(running(app)),
        "/api/state" if get => Ok(json(StatusCode::OK, &crate::ui::state::state(app))),
        "/api/events" if get => Ok(super::events::stream(app)),
        "/api/profiles" if get => {
            let profiles: Vec<_> = app
                .config
                .profiles
                .iter()
                .map(|(id, p)| json!({"id": id, "description": p.description, "pins": p.pins}))
                .collect();
            Ok(json(
                StatusCode::OK,
                &json!({"active": app.profiles.active(), "profiles": profiles}),
            ))
        }
        "/api/profiles/active" if *method == Method::PUT => set_profile(app, req).await,
        "/api/metrics/activity" if get => {
            let query = req.uri().query().unwrap_or("");
            let page = app.activity.query(query).map_err(Error::BadRequest)?;
            Ok(json(StatusCode::OK, &page))
        }
        "/api/metrics/stats" if get => {
            let query = req.uri().query().unwrap_or("");
            let stats = app.activity.stats(query).map_err(Error::BadRequest)?;
            Ok(json(StatusCode::OK, &stats))
        }
        "/metrics" if get => {
            app.metrics.set_model_statuses(&app.fleet.statuses());
            let text = app.metrics.render(
                &app.fleet.snapshot(),
                &app.fleet.queue_depths(),
                &app.config.devices,
                &app.fleet.used_by_others(),
                app.config.vllm_metric_names,
            );
            Ok(Response::builder()
                .header(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .body(crate::body::full(text))
                .expect("valid"))
        }
        "/unload" if get => {
            app.fleet.unload(None).await;
            Ok(text(StatusCode::OK, "OK"))
        }
        "/api/models/unload" if *method == Method::POST => {
            app.fleet.unload(None).await;
            Ok(json(StatusCode::OK, &json!({"msg": "ok"})))
        }
        _ if get && super::performance::serves(path) => {
            super::performance::answer(app, path, req.uri().query()).await
        }
        "/api/lifecycle" if get => Ok(json(
            StatusCode::OK,
            &json!({"events": app.fleet.recent_lifecycle_events()}),
        )),
        _ if get && model_detail_id(path).is_some() => {
            let id = model_detail_id(path).unwrap_or_default();
            Ok(json(
                StatusCode::OK,
                &super::model_detail::detail(app, &id)?,
            ))
        }
        "/api/load" if get => Ok(json(StatusCode::OK, &load_report(app))),
        "/api/version" if get => Ok(json(
            StatusCode::OK,
            &json!({"version": env!("CARGO_PKG_VERSION"), "commit": option_env!("CORRAL_COMMIT").unwrap_or("unknown"), "build_date": option_env!("CORRAL_BUILD_DATE").unwrap_or("unknown")}),
        )),
        "/logs" if get => {
            let wants_html = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("text/html"));
            if wants_html {
                return Ok(Response::builder()
                    .status(StatusCode::FOUND)
                    .header(header::LOCATION, "/ui/")
                    .body(crate::body::empty())
                    .expect("valid"));
            }
            let history = Bytes::from(app.logs.combined.history());
            Ok(plain_stream(app.config.redactor.bytes(history), None))
        }
        _ if get && (path == "/logs/stream" || path.starts_with("/logs/stream/")) => {
            let id = path
                .trim_start_matches("/logs/stream")
                .trim_start_matches('/');
            let ring: Arc<LogRing> = match id {
                "" => app.logs.combined.clone(),
                "proxy" => app.logs.proxy.clone(),
                "upstream" => app.logs.upstream.clone(),
                other => {
                    let decoded = percent_encoding::percent_decode_str(other)
                        .decode_utf8_lossy()
                        .into_owned();
                    let catalog = app.fleet.catalog();
                    let (target, _) = catalog.resolve(&decoded).ok_or_else(|| {
                        Error::BadRequest(format!("unknown log stream {decoded:?}"))
                    })?;
                    let (Target::Instance(id) | Target::Pool(id)) = target;
                    app.fleet.instance_logs(id).ok_or(Error::UnknownModel)?
                }
            };
            let with_history = !req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .any(|p| p == "no-history" || p.starts_with("no-history="));
            Ok(log_stream(&ring, with_history, app))
        }
        _ if *method == Method::POST && inflight_cancel_id(path).is_some() => {
            let id = inflight_cancel_id(path).unwrap_or_default();
            if !id.parse().is_ok_and(|id| app.inflight.cancel(id)) {
                return Err(Error::NotFound(format!("no request {id:?} in flight")));
            }
            Ok(json(StatusCode::OK, &json!({"msg": "ok"})))
        }
        _ if *method == Method::POST && path.starts_with("/api/models/load/") => {
            let raw = &path["/api/models/load/".len()..];
            let name = percent_encoding::percent_decode_str(raw)
                .decode_utf8_lossy()
                .into_owned();
            let catalog = app.fleet.catalog();
            let (target, model) = catalog
                .resolve(&name)
                .ok_or_else(|| Error::NotFound("model not found".into()))?;
            let (target, model) = (target.clone(), model.to_string());
            let started = std::time::Instant::now();
            drop(app.fleet.acquire(&target, None).await?);
            Ok(json(
                StatusCode::OK,
                &json!({"msg": "ok", "model": model, "state": "ready", "seconds": started.elapsed().as_secs_f64()}),
            ))
        }
        _ if *method == Method::POST && path.starts_with("/api/models/unload/") => {
            let raw = &path["/api/models/unload/".len()..];
            let name = percent_encoding::percent_decode_str(raw)
                .decode_utf8_lossy()
                .into_owned();
            let catalog = app.fleet.catalog();
            let (target, _) = catalog
                .resolve(&name)
                .ok_or_else(|| Error::NotFound("model not found".into()))?;
            let ids = match target {
                Target::Instance(id) => vec![id.clone()],
                Target::Pool(p) => catalog.pools[p].members.clone(),
            };
            app.fleet.unload(Some(&ids)).await;
            Ok(text(StatusCode::OK, "OK"))
        }
        _ => Ok(Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(crate::body::full("404 page not found\n"))
            .expect("valid")),
    }
}

/// The id in `/api/inflight/<id>/cancel`, split by segment (an empty id is still an id, and unknown).
fn inflight_cancel_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/api/inflight/")?;
    let (id, tail) = rest.split_once('/')?;
    (tail == "cancel").then_some(id)
}

fn log_stream(ring: &Arc<LogRing>, with_history: bool, app: &App) -> Response<Body> {
    let history = if with_history {
        Some(app.config.redactor.bytes(Bytes::from(ring.history())))
    } else {
        None
    };
    let live = LiveLog {
        rx: ring.subscribe(),
        closing: app.closing.clone(),
        redactor: app.config.redactor.clone(),
    };
    plain_stream(history.unwrap_or_default(), Some(live))
}

/// A log's new writes, with this config's secrets masked, until shutdown.
struct LiveLog {
    rx: tokio::sync::broadcast::Receiver<Bytes>,
    closing: tokio_util::sync::CancellationToken,
    redactor: crate::config::Redactor,
}

/// A chunked text/plain body: `first`, then whatever the log brings, until the client leaves.
fn plain_stream(first: Bytes, live: Option<LiveLog>) -> Response<Body> {
    use futures_util::stream;
    let first = stream::iter((!first.is_empty()).then(|| Ok(http_body::Frame::data(first))));
    let body: Body = match live {
        None => StreamBody::new(first).boxed(),
        Some(live) => {
            let rest = stream::unfold(live, |mut live| async move {
                let received = tokio::select! {
                    r = live.rx.recv() => r,
                    _ = live.closing.cancelled() => return None,
                };
                let data = match received {
                    Ok(data) => live.redactor.bytes(data),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        Bytes::from(format!("\n--- {n} messages dropped ---\n"))
                    }
                    Err(_) => return None,
                };
                Some((Ok(http_body::Frame::data(data)), live))
            });
            StreamBody::new(futures_util::StreamExt::chain(first, rest)).boxed()
        }
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("x-accel-buffering", "no")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("valid")
}

/// `GET /api/load`: requests running and waiting per model and pool, for a corral that has this one
/// as a peer (see `peer_load.rs`).
fn load_report(app: &App) -> serde_json::Value {
    // the figures the model-server gauges publish, so a peer and a picker see the same load
    let (loads, _) = crate::model_server::loads(&app.fleet.snapshot(), &app.fleet.queue_depths());
    let mut models: serde_json::Map<String, serde_json::Value> = app
        .config
        .models
        .keys()
        .map(|id| (id.clone(), json!({"running": 0, "waiting": 0})))
        .collect();
    for (id, load) in loads {
        models.insert(
            id,
            json!({"running": load.running, "waiting": load.waiting}),
        );
    }
    json!({"models": models})
}

fn running(app: &App) -> Response<Body> {
    let list: Vec<_> = app
        .fleet
        .snapshot()
        .into_iter()
        .filter(|s| s.state != Phase::Stopped)
        .filter_map(|s| {
            // an instance a reload retired still runs until idle; the model may be gone from the config
            let m = app.config.models.get(&s.model)?;
            let spec = m.instances.iter().find(|i| i.id == s.instance).unwrap_or(&m.instances[0]);
            Some(json!({"model": s.instance, "state": s.state.as_str(), "cmd": app.config.redactor.command_line(s.argv.as_ref().unwrap_or(&spec.argv)), "proxy": spec.proxy,
                "ttl": m.ttl.map_or(0, |t| t.as_secs()), "name": m.name.clone().unwrap_or_default(),
                "description": m.description.clone().unwrap_or_default(), "pool": s.pool,
                "inFlight": s.in_flight, "slots": s.slots, "failures": s.failures, "circuitOpen": s.circuit_open,
                "devices": s.devices.iter().map(|(name, bytes)| json!({"device": name, "bytes": bytes})).collect::<Vec<_>>()}))
        })
        .collect();
    json(StatusCode::OK, &json!({"running": list}))
}

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

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The model named by `GET /api/models/<id>` (percent-decoded), for any id but the routes below it.
fn model_detail_id(path: &str) -> Option<String> {
    let raw = path.strip_prefix("/api/models/")?;
    if raw.is_empty() || raw.contains('/') {
        return None;
    }
    Some(
        percent_encoding::percent_decode_str(raw)
            .decode_utf8_lossy()
            .into_owned(),
    )
}
