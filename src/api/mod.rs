//! The HTTP API: llama-swap's routes, auth, CORS and error rendering.

pub mod activity;
mod admin;
mod app;
pub mod auth;
pub mod budget;
mod captures;
mod control;
mod cors;
mod events;
pub mod extract;
mod filters;
mod forward;
mod hardware;
mod inference;
pub mod inflight;
mod loading;
mod log_routes;
pub mod meter;
mod model_detail;
mod models;
mod passthrough;
mod peer_load;
mod peers;
mod performance;
mod reports;
mod router;
pub mod routing;
mod seen;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};

use crate::body::{full, Body, BoxError};
use crate::config::Scope;
use crate::error::{render, Error};
pub use app::{App, Limits};
pub use model_detail::shown_command;
pub use seen::Seen;
use seen::{cancellable, metered};

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

/// Preflight and the open routes first; then keys and the cross-site guard; then model requests,
/// and last the management routes.
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
    if let Some(open) = open_route(app, &req, &method, &path) {
        return Ok(open);
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
    match model_call(&method, &path) {
        Some(call) => model_request(app, req, remote, call).await,
        None => admin::route(app, req, &method, &path).await,
    }
}

/// What needs no key: CORS preflight, health, the redirects to the UI, and the UI itself.
fn open_route<B>(
    app: &App,
    req: &Request<B>,
    method: &Method,
    path: &str,
) -> Option<Response<Body>> {
    if method == Method::OPTIONS {
        let any_origin = !app.keys.required() || auth::scope_for(path) == Scope::Inference;
        return Some(cors::preflight(req.headers(), any_origin));
    }
    match (method.as_str(), path) {
        ("GET" | "HEAD", "/health" | "/wol-health") => Some(text(StatusCode::OK, "OK")),
        ("GET" | "HEAD", "/") => Some(redirect(StatusCode::FOUND, "/ui")),
        (_, "/upstream") => Some(redirect(StatusCode::FOUND, "/ui/models")),
        _ if crate::ui::serves(method, path) => Some(crate::ui::serve(path, app.keys.required())),
        _ => None,
    }
}

/// A request that goes to a model, and how.
enum ModelCall<'p> {
    /// `/upstream/<rest>`: passed through as sent.
    Passthrough(&'p str),
    /// A model route, sent upstream to this path.
    Dispatch(&'p str),
}

/// The model request a method and path make, if any.
fn model_call<'p>(method: &Method, path: &'p str) -> Option<ModelCall<'p>> {
    if let Some(rest) = path.strip_prefix("/upstream/") {
        return Some(ModelCall::Passthrough(rest));
    }
    if method == Method::POST {
        if let Some(upstream_path) = inference::model_route(path) {
            return Some(ModelCall::Dispatch(upstream_path));
        }
    }
    let read = method == Method::GET || method == Method::HEAD;
    (read && inference::query_route(path)).then_some(ModelCall::Dispatch(path))
}

/// Runs a model request so an operator can cancel it, then meters it under its route (all of
/// `/upstream` is one route).
async fn model_request<B>(
    app: &Arc<App>,
    req: Request<B>,
    remote: SocketAddr,
    call: ModelCall<'_>,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_string();
    let mut seen = Seen::new(app, req.method(), &path, req.headers(), remote);
    let started = std::time::Instant::now();
    let token = seen.token.clone();
    let (label, result) = match call {
        ModelCall::Passthrough(rest) => {
            let work = passthrough::upstream_passthrough(app, req, rest.into(), remote, &mut seen);
            ("/upstream", cancellable(&token, work).await)
        }
        ModelCall::Dispatch(upstream_path) => {
            let work = inference::dispatch(app, req, upstream_path, remote, &mut seen);
            (path.as_str(), cancellable(&token, work).await)
        }
    };
    metered(app, label, started, seen, result)
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

fn redirect(status: StatusCode, to: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::LOCATION, to)
        .body(crate::body::empty())
        .expect("valid response")
}
