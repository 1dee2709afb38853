//! The HTTP surface: the request pipeline as tower layers (`layers/`), keys and scopes (`auth/`),
//! CORS, the `Host` rule, the routes of every audience (the model routes' way in,
//! `model_request.rs`; llama-swap's management routes, `admin.rs` and its neighbours; llama.cpp's
//! router API, `llama_router/`; Ollama's API, `ollama/`) and error rendering. `App` is the state
//! every handler receives: the routing room's `Gateway`, read through it, and what the surface adds.

pub(crate) mod access_log;
pub(crate) mod admin;
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
pub(crate) mod model_request;
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
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, Request, Response, StatusCode};
use tower::{Service, ServiceBuilder};

use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::observe::activity;
use crate::observe::performance;
use crate::proxy::body::{full, Body, BoxError};
use crate::routing::Gateway;
pub use crate::routing::Limits;
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

/// Everything a request handler needs: the gateway's fields, read through it, and the surface's.
pub struct App {
    /// Where model requests go, and what they report to.
    pub gateway: Arc<Gateway>,
    /// Cancelled when shutdown starts; shared by every App a reload builds.
    pub closing: tokio_util::sync::CancellationToken,
    /// Cancelled when a reload puts another App in this one's place, or at shutdown: endless
    /// streams (events, logs) end with it, so that none goes on under the keys, masks and config
    /// it began with (a client opens them again), and the drain can finish.
    pub replaced: tokio_util::sync::CancellationToken,
    /// `globalConcurrencyLimit`, over every model request.
    pub(crate) global_limit: global_limit::GlobalLimit,
    /// The samples behind `/api/performance`.
    pub(crate) performance: Arc<performance::Performance>,
    pub logs: Arc<Logs>,
    pub(crate) keys: auth::Keys,
    /// corral listens on a loopback address: requests must name a loopback host (see `hosts.rs`).
    pub(crate) loopback_listener: bool,
}

impl Deref for App {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

impl App {
    /// The same service for a reloaded config: fleet, metrics, logs, requests in flight and the
    /// shutdown signal carry over; routes, clients and keys come from the new config (see
    /// [`Gateway::new`]). The activity log (and its store, which is not reopened) and the
    /// performance samples carry over too.
    pub fn reloaded(&self) -> App {
        let gateway = Gateway::new(
            self.fleet.clone(),
            self.metrics.clone(),
            self.limits,
            self.activity.clone(),
            auth::peer_key_route,
            Some(&self.gateway),
        );
        let mut next = App::with_gateway(gateway, self.logs.clone(), self.performance.clone());
        next.global_limit = self
            .global_limit
            .with_limit(next.config.global_concurrency_limit);
        next.replaced = self.closing.child_token();
        next.closing = self.closing.clone();
        next.listening_on_loopback(self.loopback_listener);
        next
    }

    /// The service for a fleet, in tests: its config's store must open.
    #[cfg(test)]
    pub(crate) fn new(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
    ) -> App {
        let activity = activity::Activity::for_config(&fleet.config()).expect("the store opens");
        App::with_activity(fleet, logs, metrics, limits, activity)
    }

    /// The service for a fleet, with the activity log its config asks for, opened before the
    /// fleet started (a store that cannot be used stops corral before anything starts).
    pub fn with_activity(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
        activity: activity::Activity,
    ) -> App {
        let activity = Arc::new(activity);
        let performance = performance::Performance::start(fleet.clone(), activity.tally.clone());
        let gateway = Gateway::new(fleet, metrics, limits, activity, auth::peer_key_route, None);
        App::with_gateway(gateway, logs, performance)
    }

    fn with_gateway(
        gateway: Gateway,
        logs: Arc<Logs>,
        performance: Arc<performance::Performance>,
    ) -> App {
        let closing = tokio_util::sync::CancellationToken::new();
        let limit = gateway.config.global_concurrency_limit;
        App {
            global_limit: global_limit::GlobalLimit::default().with_limit(limit),
            keys: auth::Keys::for_config(&gateway.config, false),
            gateway: Arc::new(gateway),
            replaced: closing.child_token(),
            closing,
            performance,
            logs,
            loopback_listener: false,
        }
    }

    /// Tells the service that corral listens on a loopback address, so that it answers only
    /// requests that name a loopback host or an allowed one.
    pub fn listening_on_loopback(&mut self, loopback: bool) {
        self.loopback_listener = loopback;
        self.keys = auth::Keys::for_config(&self.config, loopback);
    }
}

#[cfg(test)]
mod tests;
