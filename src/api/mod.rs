//! The HTTP API: llama-swap's routes, auth, CORS and error rendering.

pub mod activity;
mod admin;
pub mod auth;
pub mod budget;
mod captures;
mod control;
mod cors;
mod events;
pub mod extract;
mod filters;
mod hardware;
pub mod inflight;
mod loading;
mod log_routes;
pub mod meter;
mod model_detail;
mod models;
mod peer_load;
mod peers;
mod performance;
mod reports;
mod router;
pub mod routing;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use crate::body::{full, Body, BoxError};
use crate::catalog::Target;
use crate::config::{Config, Scope};
use crate::error::{render, Error};
use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::proxy::upstream::{self, Upstream};
use crate::proxy::{self, Outgoing};
use extract::BodyKind;

/// Limits on what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body that is read to find the model (JSON with base64 images, audio uploads).
    pub body_bytes: u64,
    /// Request body bytes buffered at once across all requests (`maxBufferedBodies`).
    pub buffered_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 128 * 1024 * 1024,
            buffered_bytes: budget::BodyBudget::default_total(),
        }
    }
}

/// Everything a request handler needs.
pub struct App {
    pub fleet: Fleet,
    /// The fleet's catalog when this App was built: a reload builds a new App.
    pub catalog: Arc<crate::catalog::Catalog>,
    /// Cancelled when shutdown starts, so endless streams (events, logs) end and the drain can finish.
    pub closing: tokio_util::sync::CancellationToken,
    pub profiles: routing::Profiles,
    pub spillover: routing::Spillover,
    peer_clients: BTreeMap<String, Arc<Upstream>>,
    /// What the peers report of their load, where several serve one model.
    peer_loads: peer_load::PeerLoads,
    pub inflight: Arc<inflight::Inflight>,
    pub activity: Arc<activity::Activity>,
    /// The samples behind `/api/performance`.
    performance: Arc<performance::Performance>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub config: Arc<Config>,
    pub logs: Arc<Logs>,
    pub limits: Limits,
    /// Shared by every App a reload builds, like the requests in flight.
    pub budget: budget::BodyBudget,
    keys: auth::Keys,
    clients: BTreeMap<String, Arc<Upstream>>,
}

impl App {
    /// The same service for a reloaded config: fleet, metrics, logs, requests in flight and the
    /// shutdown signal carry over; routes, clients and keys come from the new config, and the
    /// active profile is reset, as llama-swap does.
    /// The activity log (and its store, which is not reopened) and the performance samples carry
    /// over too.
    pub fn reloaded(&self) -> App {
        let logged = (self.activity.clone(), self.performance.clone());
        let mut next = App::with_log(
            self.fleet.clone(),
            self.logs.clone(),
            self.metrics.clone(),
            self.limits,
            logged,
        );
        next.inflight = self.inflight.clone();
        next.budget = self.budget.clone();
        next.closing = self.closing.clone();
        next
    }

    pub fn new(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
    ) -> App {
        let activity = Arc::new(activity::Activity::for_config(&fleet.config()));
        let performance = performance::Performance::start(fleet.clone(), activity.tally.clone());
        App::with_log(fleet, logs, metrics, limits, (activity, performance))
    }

    fn with_log(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
        (activity, performance): (Arc<activity::Activity>, Arc<performance::Performance>),
    ) -> App {
        let config = fleet.config().clone();
        let clients = config
            .models
            .values()
            .map(|m| {
                (
                    m.id.clone(),
                    Upstream::new(upstream::Settings {
                        connect: m.timeouts.connect,
                        tls_handshake: m.timeouts.tls_handshake,
                        keepalive: m.timeouts.keepalive,
                        idle: m.timeouts.idle_conn,
                    }),
                )
            })
            .collect();
        let peer_clients = config
            .peers
            .iter()
            .map(|(id, p)| {
                (
                    id.clone(),
                    Upstream::new(upstream::Settings {
                        connect: p.timeouts.connect,
                        tls_handshake: p.timeouts.tls_handshake,
                        keepalive: p.timeouts.keepalive,
                        idle: p.timeouts.idle_conn,
                    }),
                )
            })
            .collect();
        let peer_loads = peer_load::PeerLoads::start(&config, &peer_clients);
        App {
            peer_loads,
            catalog: fleet.catalog(),
            closing: Default::default(),
            profiles: Default::default(),
            spillover: Default::default(),
            peer_clients,
            inflight: Default::default(),
            activity,
            performance,
            keys: auth::Keys::new(&config.api_keys),
            config,
            fleet,
            metrics,
            logs,
            limits,
            budget: budget::BodyBudget::new(limits.buffered_bytes),
            clients,
        }
    }
}

/// POST routes whose JSON (or form) body names the model; the value is the path sent upstream.
fn model_route(path: &str) -> Option<&'static str> {
    const DIRECT: &[&str] = &[
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/reranking",
        "/rerank",
        "/v1/rerank",
        "/v1/reranking",
        "/infill",
        "/completion",
        "/v1/audio/speech",
        "/v1/audio/voices",
        "/v1/images/generations",
        "/sdapi/v1/txt2img",
        "/sdapi/v1/img2img",
        "/v1/audio/transcriptions",
        "/v1/images/edits",
    ];
    const VERSIONLESS: &[&str] = &[
        "/v/chat/completions",
        "/v/responses",
        "/v/completions",
        "/v/messages",
        "/v/messages/count_tokens",
        "/v/embeddings",
        "/v/rerank",
        "/v/reranking",
    ];
    if let Some(direct) = DIRECT.iter().find(|p| **p == path) {
        Some(direct)
    } else if let Some(versionless) = VERSIONLESS.iter().find(|p| **p == path) {
        Some(&versionless[2..])
    } else if path == "/audioapi/v1/tasks/run" {
        Some("/v1/tasks/run")
    } else {
        None
    }
}

/// GET routes that name the model in the query.
fn query_route(path: &str) -> bool {
    matches!(path, "/v1/audio/voices" | "/sdapi/v1/loras" | "/props")
}

/// Handles one request. Never fails: errors become responses.
pub async fn handle<B>(app: Arc<App>, req: Request<B>, remote: SocketAddr) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let accept = req.headers().get(header::ACCEPT).cloned();
    let mut resp = match route(&app, req, remote).await {
        Ok(resp) => resp,
        Err(err) => render(&err.redacted(&app.config.redactor), accept.as_ref()),
    };
    if !resp.headers().contains_key(header::CONTENT_TYPE) && resp.status() == StatusCode::NO_CONTENT
    {
        resp.headers_mut().remove(header::CONTENT_LENGTH);
    }
    resp
}

async fn route<B>(
    app: &Arc<App>,
    mut req: Request<B>,
    remote: SocketAddr,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if method == Method::OPTIONS {
        let any_origin = !app.keys.required() || auth::scope_for(&path) == Scope::Inference;
        return Ok(cors::preflight(req.headers(), any_origin));
    }
    match (method.as_str(), path.as_str()) {
        ("GET" | "HEAD", "/health" | "/wol-health") => return Ok(text(StatusCode::OK, "OK")),
        ("GET" | "HEAD", "/") => return Ok(redirect(StatusCode::FOUND, "/ui")),
        (_, "/upstream") => return Ok(redirect(StatusCode::FOUND, "/ui/models")),
        _ if crate::ui::serves(&method, &path) => {
            return Ok(crate::ui::serve(&path, app.keys.required()))
        }
        _ => {}
    }
    app.keys.check(req.headers(), auth::scope_for(&path))?;
    let guarded = auth::changes_state(&method, &path)
        || auth::simple_model_request(&method, &path, req.headers());
    if guarded && auth::cross_site(req.headers(), req.uri()) {
        return Err(Error::Forbidden(
            "forbidden: cross-site requests may not change state".into(),
        ));
    }
    app.keys.strip_own(req.headers_mut());
    if let Some(rest) = path.strip_prefix("/upstream/") {
        let rest = rest.to_string();
        let seen = Seen::new(app, &method, &path, req.headers(), remote);
        let (started, mut seen) = (std::time::Instant::now(), seen);
        let token = seen.token.clone();
        let result = cancellable(
            &token,
            upstream_passthrough(app, req, rest, remote, &mut seen),
        )
        .await;
        return metered(app, "/upstream", started, seen, result);
    }
    if method == Method::POST {
        if let Some(upstream_path) = model_route(&path) {
            let seen = Seen::new(app, &method, &path, req.headers(), remote);
            let (started, mut seen) = (std::time::Instant::now(), seen);
            let token = seen.token.clone();
            let result =
                cancellable(&token, dispatch(app, req, upstream_path, remote, &mut seen)).await;
            return metered(app, &path, started, seen, result);
        }
    }
    if (method == Method::GET || method == Method::HEAD) && query_route(&path) {
        let upstream_path = path.as_str();
        let seen = Seen::new(app, &method, &path, req.headers(), remote);
        let (started, mut seen) = (std::time::Instant::now(), seen);
        let token = seen.token.clone();
        let result =
            cancellable(&token, dispatch(app, req, upstream_path, remote, &mut seen)).await;
        return metered(app, &path, started, seen, result);
    }
    admin::route(app, req, &method, &path).await
}

/// Finds the model, starts or waits for it, rewrites the body if asked, forwards and streams back.
/// What a model request learns on its way: its model, and its place in the in-flight list.
pub struct Seen {
    model: Option<String>,
    holds: Vec<Box<dyn Send + Sync>>,
    guard: Option<inflight::Guard>,
    token: tokio_util::sync::CancellationToken,
    method: Method,
    path: String,
    remote: SocketAddr,
    /// Its request, when captures are on.
    capture: Option<captures::Capture>,
}

impl Seen {
    fn new(
        app: &App,
        method: &Method,
        path: &str,
        headers: &http::HeaderMap,
        remote: SocketAddr,
    ) -> Seen {
        let capture = app
            .activity
            .captures
            .as_ref()
            .map(|c| c.begin(path, headers));
        Seen {
            model: None,
            holds: Vec::new(),
            guard: None,
            token: Default::default(),
            method: method.clone(),
            path: path.to_string(),
            remote,
            capture,
        }
    }

    /// Keeps something alive until the response body ends.
    fn hold(&mut self, thing: Box<dyn Send + Sync>) {
        self.holds.push(thing);
    }

    /// The model is known: list the request as in flight.
    fn found(&mut self, app: &App, model: &str) {
        self.model = Some(model.to_string());
        self.guard = Some(app.inflight.register(
            model,
            &self.path,
            &self.method,
            self.remote.ip(),
            self.token.clone(),
        ));
    }
}

/// Runs `work` until it ends or an operator cancels the request.
async fn cancellable<F>(
    token: &tokio_util::sync::CancellationToken,
    work: F,
) -> Result<Response<Body>, Error>
where
    F: std::future::Future<Output = Result<Response<Body>, Error>>,
{
    tokio::select! {
        r = work => r,
        _ = token.cancelled() => Err(Error::Cancelled),
    }
}

/// Records a model request: per model when the model is known, else as unknown.
fn metered(
    app: &Arc<App>,
    route: &str,
    started: std::time::Instant,
    seen: Seen,
    result: Result<Response<Body>, Error>,
) -> Result<Response<Body>, Error> {
    let Seen {
        model,
        guard,
        token,
        holds,
        path,
        capture,
        ..
    } = seen;
    let Some(model) = model else {
        if matches!(result, Err(Error::NoModel | Error::UnknownModel)) {
            app.metrics.unknown_model_requests.inc();
        }
        return result;
    };
    let status = match &result {
        Ok(resp) => resp.status(),
        Err(e) => e.status(),
    };
    let labels = meter::Labels {
        model,
        route: route.to_string(),
        status: meter::status_class(status),
    };
    match result {
        Err(e) => {
            meter::record_error(&app.metrics, &labels, started);
            app.activity.record(activity::Entry {
                model: labels.model,
                req_path: path,
                status: status.as_u16(),
                content_type: "application/json".into(),
                tokens: None,
                duration_ms: started.elapsed().as_millis() as u64,
                ttft_ms: None,
                error: Some(app.config.redactor.text(&e.to_string()).into_owned()),
                capture,
            });
            Err(e)
        }
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let idle_limit = stream_idle_limit(&app.config, &labels.model);
            let length_framed = parts.headers.contains_key(header::CONTENT_LENGTH);
            let recording = capture
                .zip(app.activity.captures.as_ref())
                .map(|(c, captures)| captures.record(c, &parts.headers));
            let body =
                meter::Metered::new(body, app.metrics.clone(), labels, started, content_type)
                    .with_inflight(guard, token)
                    .with_idle_limit(idle_limit)
                    .length_framed(length_framed)
                    .logged_in(app.activity.clone(), path, status, content_type)
                    .recording(recording)
                    .holding(holds);
            Ok(Response::from_parts(parts, BodyExt::boxed(body)))
        }
    }
}

/// `timeouts.streamIdle` of a model, or of the peer for `peer/model`.
fn stream_idle_limit(config: &Config, model: &str) -> Option<std::time::Duration> {
    if let Some(m) = config.models.get(model) {
        return m.timeouts.stream_idle;
    }
    let (peer, _) = model.split_once('/')?;
    config.peers.get(peer)?.timeouts.stream_idle
}

async fn dispatch<B>(
    app: &Arc<App>,
    req: Request<B>,
    upstream_path: &str,
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (mut parts, body) = req.into_parts();
    let query = parts.uri.query().map(String::from);
    let get = parts.method == Method::GET || parts.method == Method::HEAD;
    // charged to the body budget while this request holds the bytes (to its answer's head)
    let mut charge = budget::Charge::none();
    let (sent, bytes, kind, streaming) = if get {
        let name = query
            .as_deref()
            .and_then(|q| extract::query_param(q, "model"));
        (name, Bytes::new(), BodyKind::Other, false)
    } else {
        let (bytes, held) =
            extract::read_body(&parts.headers, body, app.limits.body_bytes, &app.budget).await?;
        charge = held;
        if let Some(capture) = &mut seen.capture {
            capture.request_body(&bytes);
        }
        let kind = extract::classify(&parts.headers, &bytes);
        let (name, streaming) = extract::model_from_body(&kind, &bytes);
        (name, bytes, kind, streaming)
    };
    let sent = sent.filter(|n| !n.is_empty()).ok_or(Error::NoModel)?;
    let name = routing::apply_profile(&app.config, &app.profiles, &sent)
        .filter(|n| !n.is_empty())
        .ok_or(Error::NoModel)?;
    let (route, spill) =
        routing::resolve(&app.config, &app.catalog, &app.fleet, &app.spillover, &name)?;
    if let Some(s) = spill {
        seen.hold(Box::new(s));
    }
    let chosen = match &route {
        routing::Route::Local { .. } if app.config.selectors.contains_key(&name) => {
            // a selector chose a target: the request names that target from here on
            match &route {
                routing::Route::Local {
                    target: Target::Instance(id) | Target::Pool(id),
                    ..
                } => id.clone(),
                _ => name.clone(),
            }
        }
        _ => name.clone(),
    };
    let path_and_query = match &query {
        Some(q) => format!("{upstream_path}?{q}"),
        None => upstream_path.to_string(),
    };
    match route {
        routing::Route::Peer { peer, model } => {
            seen.found(app, &format!("{peer}/{model}"));
            let bytes = rewrite_for_peer(app, &peer, &model, kind, bytes)?;
            peers::forward(app, &peer, parts, bytes, path_and_query, remote).await
        }
        routing::Route::Peers { owners, model } => {
            let ranked = app.peer_loads.rank(&owners, &model);
            seen.found(app, &format!("{}/{model}", ranked[0]));
            let request = (parts, kind, bytes, path_and_query, remote);
            forward_to_least_loaded(app, &ranked, &model, request).await
        }
        routing::Route::Local { target, model } => {
            let model = app.config.models.get(&model).ok_or(Error::UnknownModel)?;
            seen.found(app, &model.id);
            let renamed = chosen != sent;
            let bytes = match kind {
                BodyKind::Json { .. } if renamed || filters::may_apply(model, &chosen) => {
                    let mut body = filters::JsonBody::parse(&bytes).map_err(Error::BadRequest)?;
                    if renamed {
                        body.set("model", &serde_json::Value::String(chosen.clone()));
                    }
                    let changed = filters::apply(model, &chosen, &mut body) || renamed;
                    let rewritten = changed.then(|| body.to_bytes());
                    drop(body);
                    rewritten.unwrap_or(bytes)
                }
                BodyKind::Multipart(boundary) => match &model.use_model_name {
                    Some(upstream_name) => {
                        extract::rewrite_multipart_model(&bytes, &boundary, upstream_name)
                            .unwrap_or(bytes)
                    }
                    None => bytes,
                },
                _ => bytes,
            };
            if !get {
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
            }
            let loading_state = model.send_loading_state
                && streaming
                && path_and_query.starts_with("/v1/chat/completions");
            if loading_state && !app.fleet.is_ready(&target) {
                seen.hold(Box::new(charge)); // the loading stream holds the body until it sends it
                return Ok(loading::stream(
                    app.clone(),
                    model.id.clone(),
                    target,
                    parts,
                    bytes,
                    path_and_query,
                    remote,
                ));
            }
            forward_local(app, model, &target, parts, bytes, path_and_query, remote).await
        }
    }
}

/// Sends a buffered request to the target's instance; for a pool, a member that fails before sending
/// a byte back is taken out and the request tried once more on another.
pub(crate) async fn forward_local(
    app: &Arc<App>,
    model: &crate::config::ModelConfig,
    target: &Target,
    parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: String,
    remote: SocketAddr,
) -> Result<Response<Body>, Error> {
    let client = &app.clients[&model.id];
    let timeout = model.timeouts.response_header;
    let prompt = prompt_blocks(model, target, &bytes);
    let lease = app.fleet.acquire_for(target, None, prompt.as_ref()).await?;
    let out = |lease: &crate::fleet::Lease, parts: http::request::Parts| Outgoing {
        base: lease.proxy(),
        path_and_query: &path_and_query,
        parts,
        body: full(bytes.clone()),
        client_addr: Some(remote.ip()),
    };
    if !matches!(target, Target::Pool(_)) {
        let req = out(&lease, parts);
        return proxy::forward(client, req, timeout, lease).await;
    }
    let first = out(&lease, clone_parts(&parts));
    let first_id = lease.id().to_string();
    match proxy::forward(client, first, timeout, lease).await {
        Err(Error::Upstream(e)) => {
            app.fleet.report_unreachable(&first_id);
            app.metrics.retries.with_label_values(&[&model.id]).inc();
            tracing::warn!(instance = %first_id, "retrying on another replica after: {e}");
            let lease = app
                .fleet
                .acquire_for(target, Some(&first_id), prompt.as_ref())
                .await?;
            let id = lease.id().to_string();
            let req = out(&lease, parts);
            let answer = proxy::forward(client, req, timeout, lease).await;
            if let Ok(resp) = &answer {
                app.fleet.report_answer(&id, resp.status());
            }
            answer
        }
        Ok(resp) => {
            app.fleet.report_answer(&first_id, resp.status());
            Ok(resp)
        }
        other => other,
    }
}

/// The prompt's chained block hashes, for a pool that balances by prefix: the JSON text of a chat
/// body's `messages` or a completion's `prompt`, read without parsing the rest of the body.
fn prompt_blocks(
    model: &crate::config::ModelConfig,
    target: &Target,
    bytes: &[u8],
) -> Option<crate::fleet::prefix::Prefix> {
    if !matches!(target, Target::Pool(_)) || model.pool.balance != crate::config::Balance::Prefix {
        return None;
    }
    let body = filters::JsonBody::parse(bytes).ok()?;
    let text = body.raw("messages").or_else(|| body.raw("prompt"))?;
    Some(crate::fleet::prefix::Prefix::of(text.as_bytes()))
}

/// Tries the peers that serve `model`, least loaded first: one that fails before answering (it
/// could not be reached, or broke before its response head) is held out, and the next one gets the
/// request, since nothing has reached the client yet.
async fn forward_to_least_loaded(
    app: &Arc<App>,
    ranked: &[String],
    model: &str,
    (parts, kind, bytes, path_and_query, remote): (
        http::request::Parts,
        BodyKind,
        Bytes,
        String,
        SocketAddr,
    ),
) -> Result<Response<Body>, Error> {
    let mut last = Error::UnknownModel;
    for peer in ranked {
        let body = rewrite_for_peer(app, peer, model, kind.clone(), bytes.clone())?;
        let parts = clone_parts(&parts);
        match peers::forward(app, peer, parts, body, path_and_query.clone(), remote).await {
            Err(Error::Upstream(e)) => {
                tracing::warn!(peer = %peer, "trying another peer for {model} after: {e}");
                app.peer_loads.failed(peer);
                last = Error::Upstream(e);
            }
            answer => return answer,
        }
    }
    Err(last)
}

/// A peer gets the bare model id and its own filters.
fn rewrite_for_peer(
    app: &App,
    peer: &str,
    model: &str,
    kind: BodyKind,
    bytes: Bytes,
) -> Result<Bytes, Error> {
    let BodyKind::Json { .. } = kind else {
        return Ok(bytes);
    };
    let mut body = filters::JsonBody::parse(&bytes).map_err(Error::BadRequest)?;
    body.set("model", &serde_json::Value::String(model.to_string()));
    let f = &app.config.peers[peer].filters;
    for key in &f.strip_params {
        body.remove(key);
    }
    for (k, val) in &f.set_params {
        body.set(k, val);
    }
    Ok(body.to_bytes())
}

fn clone_parts(parts: &http::request::Parts) -> http::request::Parts {
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version);
    if let Some(h) = req.headers_mut() {
        *h = parts.headers.clone();
    }
    req.body(())
        .expect("copied from a valid request")
        .into_parts()
        .0
}

/// `/upstream/<model>/<path>`: the longest prefix that names a model wins; the rest goes upstream as
/// it was sent, percent-encoding included, with the request body streamed.
async fn upstream_passthrough<B>(
    app: &Arc<App>,
    req: Request<B>,
    rest: String,
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let segments: Vec<&str> = rest.split('/').collect();
    let catalog = app.fleet.catalog();
    // the longest prefix that names a model, alias or peer model, after the active profile's pins
    let found = (1..=segments.len()).rev().find_map(|n| {
        let raw = segments[..n].join("/");
        let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8_lossy();
        let name = routing::apply_profile(&app.config, &app.profiles, &decoded)?;
        routing::resolve_plain(&app.config, &catalog, &name)
            .ok()
            .map(|route| (route, n))
    });
    let (route, n) = found.ok_or(Error::UnknownModel)?;
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let local = match route {
        routing::Route::Local { target, model } => Ok((target, model)),
        routing::Route::Peer { peer, model } => Err((peer, model)),
        // a streamed body cannot be sent twice: the least loaded peer gets it, no retry
        routing::Route::Peers { owners, model } => {
            Err((app.peer_loads.rank(&owners, &model).swap_remove(0), model))
        }
    };
    let (target, model_id) = match local {
        Ok(found) => found,
        Err((peer, model)) => {
            seen.found(app, &format!("{peer}/{model}"));
            if n == segments.len() {
                return Ok(slash_redirect(req.method(), &rest, &query));
            }
            let tail = format!("/{}{query}", segments[n..].join("/"));
            let (parts, body) = req.into_parts();
            let body = body.map_err(Into::into).boxed();
            return peers::forward_body(app, &peer, parts, body, &tail, remote).await;
        }
    };
    seen.found(app, &model_id);
    if n == segments.len() {
        return Ok(slash_redirect(req.method(), &rest, &query));
    }
    let tail = format!("/{}", segments[n..].join("/"));
    if app.config.ignore_paths.iter().any(|re| re.is_match(&tail)) && !app.fleet.is_ready(&target) {
        return Err(Error::Conflict(format!(
            "{model_id} is not loaded and {tail} does not load it"
        )));
    }
    let model = app
        .config
        .models
        .get(&model_id)
        .ok_or(Error::UnknownModel)?;
    if proxy::is_upgrade(req.headers()) {
        let req = req.map(|b| b.map_err(Into::into).boxed());
        let client = &app.clients[&model.id];
        let path = format!("{tail}{query}");
        if model.ignore_websockets {
            // these never load, queue or count: they reach the model only while it is up
            let Some(base) = app.fleet.ready_proxy(&target) else {
                return Err(Error::Conflict(format!(
                    "{model_id} is not loaded; websockets do not load it"
                )));
            };
            return proxy::forward_upgrade(client, &base, &path, req, ()).await;
        }
        let lease = app.fleet.acquire(&target, None).await?;
        let base = lease.proxy();
        return proxy::forward_upgrade(client, &base, &path, req, lease).await;
    }
    let lease = app.fleet.acquire(&target, None).await?;
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    let out = Outgoing {
        base: lease.proxy(),
        path_and_query: &format!("{tail}{query}"),
        parts,
        body,
        client_addr: Some(remote.ip()),
    };
    proxy::forward(
        &app.clients[&model.id],
        out,
        model.timeouts.response_header,
        lease,
    )
    .await
}

pub fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(full(body))
        .expect("valid response")
}

pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(value.to_string()))
        .expect("valid response")
}

/// `/upstream/<model>` without the trailing slash: 301 for GET and HEAD, 308 otherwise.
fn slash_redirect(method: &Method, rest: &str, query: &str) -> Response<Body> {
    let status = if matches!(*method, Method::GET | Method::HEAD) {
        StatusCode::MOVED_PERMANENTLY
    } else {
        StatusCode::PERMANENT_REDIRECT
    };
    redirect(status, &format!("/upstream/{rest}/{query}"))
}

fn redirect(status: StatusCode, to: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::LOCATION, to)
        .body(crate::body::empty())
        .expect("valid response")
}
