//! Management routes: model list, running models, unload, logs, version, CORS preflight.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

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

pub async fn route<B>(
    app: &Arc<App>,
    req: Request<B>,
    method: &Method,
    path: &str,
) -> Result<Response<Body>, Error> {
    let get = *method == Method::GET || *method == Method::HEAD;
    match path {
        "/v1/models" | "/models" if get => Ok(models(app, req.headers())),
        "/running" if get => Ok(running(app)),
        "/metrics" if get => {
            let text = app
                .metrics
                .render(&app.fleet.snapshot(), &app.fleet.queue_depths());
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
            Ok(plain_stream(Bytes::from(app.logs.combined.history()), None))
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
                    let (target, _) = app.fleet.catalog().resolve(&decoded).ok_or_else(|| {
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
            Ok(log_stream(&ring, with_history))
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

fn log_stream(ring: &Arc<LogRing>, with_history: bool) -> Response<Body> {
    let history = if with_history {
        Some(Bytes::from(ring.history()))
    } else {
        None
    };
    plain_stream(history.unwrap_or_default(), Some(ring.subscribe()))
}

/// A chunked text/plain body: `first`, then whatever the receiver brings, until the client leaves.
fn plain_stream(
    first: Bytes,
    live: Option<tokio::sync::broadcast::Receiver<Bytes>>,
) -> Response<Body> {
    use futures_util::stream;
    let first = stream::iter((!first.is_empty()).then(|| Ok(http_body::Frame::data(first))));
    let body: Body = match live {
        None => StreamBody::new(first).boxed(),
        Some(rx) => {
            let rest = stream::unfold(rx, |mut rx| async move {
                let data = match rx.recv().await {
                    Ok(data) => data,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        Bytes::from(format!("\n--- {n} messages dropped ---\n"))
                    }
                    Err(_) => return None,
                };
                Some((Ok(http_body::Frame::data(data)), rx))
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

fn models(app: &App, headers: &HeaderMap) -> Response<Body> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let snapshot = app.fleet.snapshot();
    let ready = |ids: &[String]| {
        snapshot
            .iter()
            .any(|s| ids.contains(&s.instance) && s.state == Phase::Ready)
    };
    let status = |loaded: bool| json!({"value": if loaded { "loaded" } else { "unloaded" }});
    let entry = |id: &str, meta: serde_json::Map<String, serde_json::Value>, loaded: bool| json!({"id": id, "object": "model", "created": created, "owned_by": "corral", "meta": {"llamaswap": meta}, "status": status(loaded)});
    let catalog = app.fleet.catalog();
    let mut data = Vec::new();
    for m in app.config.models.values().filter(|m| !m.unlisted) {
        let ids: Vec<String> = m.instances.iter().map(|i| i.id.clone()).collect();
        let loaded = ready(&ids);
        let mut meta = m.metadata.clone();
        meta.insert("type".into(), json!("model"));
        if !m.aliases.is_empty() {
            meta.insert("aliases".into(), json!(m.aliases));
        }
        if ids.len() > 1 {
            meta.insert("replicas".into(), json!(ids));
        }
        let mut record = entry(&m.id, meta, loaded);
        if let Some(name) = &m.name {
            record["name"] = json!(name);
        }
        if let Some(d) = &m.description {
            record["description"] = json!(d);
        }
        data.push(record);
        if ids.len() > 1 {
            for id in &ids {
                let meta = json!({"type": "replica", "modelID": m.id, "pool": m.id});
                data.push(entry(
                    id,
                    meta.as_object().cloned().unwrap_or_default(),
                    ready(std::slice::from_ref(id)),
                ));
            }
        }
        if app.config.include_aliases_in_list {
            for alias in &m.aliases {
                let meta = json!({"type": "alias", "modelID": m.id});
                data.push(entry(
                    alias,
                    meta.as_object().cloned().unwrap_or_default(),
                    loaded,
                ));
            }
        }
    }
    for pool in catalog
        .pools
        .values()
        .filter(|p| !app.config.models.contains_key(&p.id))
    {
        let meta = json!({"type": "pool", "members": pool.members});
        data.push(entry(
            &pool.id,
            meta.as_object().cloned().unwrap_or_default(),
            ready(&pool.members),
        ));
    }
    data.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let mut resp = json(StatusCode::OK, &json!({"object": "list", "data": data}));
    if let Some(origin) = headers.get(header::ORIGIN) {
        resp.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    resp
}

fn running(app: &App) -> Response<Body> {
    let list: Vec<_> = app
        .fleet
        .snapshot()
        .into_iter()
        .filter(|s| s.state != Phase::Stopped)
        .map(|s| {
            let m = &app.config.models[&s.model];
            let spec = m.instances.iter().find(|i| i.id == s.instance).unwrap_or(&m.instances[0]);
            json!({"model": s.instance, "state": s.state.as_str(), "cmd": spec.argv.join(" "), "proxy": spec.proxy,
                "ttl": m.ttl.map_or(0, |t| t.as_secs()), "name": m.name.clone().unwrap_or_default(),
                "description": m.description.clone().unwrap_or_default(), "pool": s.pool,
                "inFlight": s.in_flight, "slots": s.slots, "failures": s.failures, "circuitOpen": s.circuit_open})
        })
        .collect();
    json(StatusCode::OK, &json!({"running": list}))
}

/// Any OPTIONS request: permissive CORS, as llama-swap answers it.
pub fn preflight(headers: &HeaderMap) -> Response<Body> {
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
    Response::builder()
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
        .expect("valid")
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
