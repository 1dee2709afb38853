//! The HTTP API: llama-swap's routes, auth, CORS and error rendering.

pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod app;
pub(crate) mod auth;
pub(crate) mod control;
pub(crate) mod cors;
pub(crate) mod events;
pub(crate) mod global_limit;
pub(crate) mod hosts;
pub(crate) mod layers;
pub(crate) mod llama_router;
pub(crate) mod log_routes;
pub(crate) mod metadata;
pub(crate) mod model_detail;
pub(crate) mod model_times;
pub(crate) mod models;
pub(crate) mod observed;
pub(crate) mod ollama;
pub(crate) mod reports;
pub(crate) mod router;
pub(crate) mod state;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, Request, Response, StatusCode};
use tower::{Service, ServiceBuilder};

use crate::proxy::body::{full, Body, BoxError};
pub use crate::routing::Limits;
pub use app::App;
pub use model_detail::shown_command;

/// The service that answers one request under `app`: CORS headers on every answer, errors
/// rendered, then the open routes, keys and the cross-site guard, then model requests, and last
/// the management routes. Never fails.
pub fn service<'a, B>(
    app: &'a Arc<App>,
    remote: SocketAddr,
) -> impl tower::Service<
    Request<B>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'a,
> + 'a
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    ServiceBuilder::new()
        .layer(layers::CorsLayer::new(app.config.cors.as_ref(), &app.keys))
        .layer(layers::RenderErrorsLayer::new(&app.config.redactor))
        .layer(layers::OpenRoutesLayer::new(
            &app.keys,
            app.config.cors.as_ref(),
        ))
        .layer(layers::AuthLayer::new(&app.keys))
        .layer(layers::ModelRequestLayer::new(app, remote))
        .service(layers::RouteTable::new(app))
}

/// A request served by [`service`]. Its layers are always ready (the outermost says so without
/// asking the others), so it is called at once instead of through a future that waits.
pub fn serve<'a, B>(
    app: &'a Arc<App>,
    remote: SocketAddr,
    req: Request<B>,
) -> impl Future<Output = Response<Body>> + Send + 'a
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let access = if app.config.log_to_stdout.http() {
        access_log::Access::begin(&req, remote, &app.logs)
    } else {
        None
    };
    let mut api = service(app, remote);
    let ready = api.poll_ready(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    debug_assert!(ready.is_ready(), "the API's layers are always ready");
    // one future whether the line is written or not: an `Either` of the two cost every request
    // a poll through its discriminant
    api.call(req).map(move |Ok(resp)| match access {
        None => resp,
        Some(access) => access.answered(resp),
    })
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
