//! Model requests split off before the management route table: each is dispatched to its model (or
//! passed through for `/upstream/<model>/...`) so an operator can cancel it, then metered under its
//! route (all of `/upstream` is one route).

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::Either;
use http::{Method, Request, Response};

use super::Routed;
use crate::api::global_limit::Place;
use crate::api::ollama;
use crate::api::App;
use crate::observe::cancel::Cancellable;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;
use crate::routing::grant::Caller;
use crate::routing::inference;
use crate::routing::passthrough;
use crate::routing::seen::{metered, Seen};

#[derive(Clone, Copy)]
pub struct ModelRequestLayer<'a> {
    app: &'a Arc<App>,
    remote: SocketAddr,
}

impl<'a> ModelRequestLayer<'a> {
    pub fn new(app: &'a Arc<App>, remote: SocketAddr) -> Self {
        ModelRequestLayer { app, remote }
    }
}

impl<'a, S> tower::Layer<S> for ModelRequestLayer<'a> {
    type Service = ModelRequests<'a, S>;

    fn layer(&self, routes: S) -> Self::Service {
        ModelRequests {
            app: self.app,
            remote: self.remote,
            routes,
        }
    }
}

/// Model requests go to their model; the rest to `routes`.
#[derive(Clone)]
pub struct ModelRequests<'a, S> {
    app: &'a Arc<App>,
    remote: SocketAddr,
    routes: S,
}

impl<'a, S, B> tower::Service<Request<B>> for ModelRequests<'a, S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Error>,
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    type Response = Response<Body>;
    type Error = Error;
    type Future = Either<Routed<'a>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(call) = model_call(req.method(), req.uri().path()) else {
            // Ollama's API: looked for under `/api/` only, once the model routes did not match
            let ollama = ollama::call(&self.app.config, req.method(), req.uri().path());
            return match ollama {
                Some(call) => Either::Left(ollama::serve(self.app, req, self.remote, call)),
                None => Either::Right(self.routes.call(req)),
            };
        };
        match admit(self.app, call) {
            Ok(place) => Either::Left(Box::pin(model_request(
                self.app,
                req,
                self.remote,
                call,
                place,
            ))),
            Err(refused) => Either::Left(Box::pin(std::future::ready(Err(refused)))),
        }
    }
}

/// A request another API translated into a model route's (Ollama's chat, say): admitted,
/// dispatched to `upstream_path` and metered under `route`, as the model routes' own requests.
pub fn translated<'a, B>(
    app: &'a Arc<App>,
    req: Request<B>,
    remote: SocketAddr,
    route: &'static str,
    upstream_path: &'static str,
) -> Routed<'a>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let call = ModelCall::Dispatch(route, upstream_path);
    match admit(app, call) {
        Ok(place) => Box::pin(model_request(app, req, remote, call, place)),
        Err(refused) => Box::pin(std::future::ready(Err(refused))),
    }
}

/// A request that goes to a model, and how.
#[derive(Clone, Copy)]
enum ModelCall {
    /// `/upstream/<rest>`: passed through as sent.
    Passthrough,
    /// A model route, and the path it is sent upstream to.
    Dispatch(&'static str, &'static str),
    /// A model query route, sent upstream as it is.
    Query(&'static str),
}

const UPSTREAM: &str = "/upstream/";

/// The model request a method and path make, if any.
fn model_call(method: &Method, path: &str) -> Option<ModelCall> {
    if path.starts_with(UPSTREAM) {
        return Some(ModelCall::Passthrough);
    }
    if method == Method::POST {
        if let Some((route, upstream_path)) = inference::model_route(path) {
            return Some(ModelCall::Dispatch(route, upstream_path));
        }
    }
    let read = method == Method::GET || method == Method::HEAD;
    let query = read.then(|| inference::query_route(path)).flatten();
    query.map(ModelCall::Query)
}

/// A place under `globalConcurrencyLimit` for a model route's request (`/upstream` is not
/// counted), or 429 at once.
fn admit(app: &App, call: ModelCall) -> Result<Option<Place>, Error> {
    match call {
        ModelCall::Passthrough => Ok(None),
        ModelCall::Dispatch(..) | ModelCall::Query(_) => app.global_limit.admit(),
    }
}

/// The request's record is begun here and finished (metered) when its work ends or an operator
/// cancels it. Not an `async fn`, which would keep a second copy of the request beside the one its
/// work holds (see [`crate::proxy::forward`]).
fn model_request<'a, B>(
    app: &'a Arc<App>,
    req: Request<B>,
    remote: SocketAddr,
    call: ModelCall,
    place: Option<Place>,
) -> impl Future<Output = Result<Response<Body>, Error>> + Send + 'a
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    // the request moves on; its route is kept for the metrics
    let (route, path): (_, Cow<'static, str>) = match call {
        ModelCall::Passthrough => ("/upstream", req.uri().path().to_string().into()),
        ModelCall::Dispatch(route, _) | ModelCall::Query(route) => (route, route.into()),
    };
    let caller = req.extensions().get::<Caller>().map(|c| c.0.clone());
    let mut seen = Seen::new(app, req.method(), path, req.headers(), remote, caller);
    if let Some(place) = place {
        // given back when the answer's body ends, or with the request when it fails
        seen.hold(Box::new(place));
    }
    let started = std::time::Instant::now();
    let cancel = seen.cancel.clone();
    async move {
        let result = match call {
            ModelCall::Passthrough => {
                let rest = req.uri().path()[UPSTREAM.len()..].to_string();
                // boxed: the larger future, kept out of the model routes' (see the test below)
                let work = Box::pin(passthrough::upstream_passthrough(
                    &app.gateway,
                    req,
                    rest,
                    remote,
                    &mut seen,
                ));
                Cancellable::new(&cancel, work).await
            }
            ModelCall::Dispatch(_, upstream_path) | ModelCall::Query(upstream_path) => {
                let work = inference::dispatch(&app.gateway, req, upstream_path, remote, &mut seen);
                Cancellable::new(&cancel, work).await
            }
        };
        metered(&app.gateway, route, started, seen, result)
    }
}

#[cfg(test)]
mod tests {
    use tower::{Layer, ServiceExt};

    use super::super::stub::{self, Stub};
    use super::*;

    /// An App with no models, on a fleet that never starts one.
    fn app() -> Arc<App> {
        let config = crate::config::load_str("t.yaml", "models: {}\n", &|_| None)
            .unwrap()
            .config;
        let spawner = crate::supervisor::Spawner::start(tokio::runtime::Handle::current()).unwrap();
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let logs = Arc::new(crate::logs::Logs::default());
        let fleet = crate::fleet::Fleet::new(
            Arc::new(config),
            spawner,
            logs.clone(),
            metrics.fleet.clone(),
            crate::supervisor::sweep::StateFile::new(None, "t"),
            crate::sources::Fetcher::from_env(&|_| None),
        );
        Arc::new(App::new(fleet, logs, metrics, Default::default()))
    }

    #[test]
    fn model_calls() {
        let (get, post) = (Method::GET, Method::POST);
        assert!(matches!(
            model_call(&post, "/v1/chat/completions"),
            Some(ModelCall::Dispatch(
                "/v1/chat/completions",
                "/v1/chat/completions"
            ))
        ));
        assert!(matches!(
            model_call(&get, "/upstream/m/props"),
            Some(ModelCall::Passthrough)
        ));
        assert!(matches!(
            model_call(&post, "/v/embeddings"),
            Some(ModelCall::Dispatch("/v/embeddings", "/embeddings"))
        ));
        assert!(matches!(
            model_call(&get, "/props"),
            Some(ModelCall::Query("/props"))
        ));
        assert!(model_call(&get, "/v1/chat/completions").is_none());
        assert!(model_call(&post, "/props").is_none());
        assert!(model_call(&get, "/upstream").is_none());
        assert!(model_call(&get, "/running").is_none());
    }

    #[tokio::test]
    async fn a_model_request_goes_to_its_model_and_is_metered() {
        let app = app();
        let remote: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let routes = Stub::answering(stub::ok);
        let req = stub::with_body(
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            r#"{"model":"nowhere"}"#,
        );
        let result = ModelRequestLayer::new(&app, remote)
            .layer(routes.clone())
            .oneshot(req)
            .await;
        assert!(matches!(result, Err(Error::UnknownModel)), "{result:?}");
        assert_eq!(routes.calls(), 0);
        assert_eq!(app.metrics.requests.unknown_model.get(), 1);
    }

    /// A model request's future is boxed, and each layer's future is moved into the one that awaits
    /// it: what a layer keeps across an await is copied with it, for every request. It was over 7
    /// KB while forwarding was made of `async fn`s that kept their arguments and locals beside
    /// what they awaited, with room for opening a connection and for the peers' and passthrough's
    /// larger futures.
    #[tokio::test]
    async fn a_model_request_future_stays_small() {
        let app = app();
        let remote: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let route = "/v1/chat/completions";
        let req = stub::with_body("POST", route, &[], r#"{"model":"m"}"#);
        let future = model_request(&app, req, remote, ModelCall::Dispatch(route, route), None);
        let size = std::mem::size_of_val(&future);
        assert!(
            size <= 3 * 1024,
            "a model request's future takes {size} bytes"
        );
    }

    #[tokio::test]
    async fn management_requests_go_to_the_routes() {
        let app = app();
        let remote: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for (method, uri) in [
            ("GET", "/running"),
            ("GET", "/v1/models"),
            ("POST", "/props"),
        ] {
            let routes = Stub::answering(stub::ok);
            let resp = ModelRequestLayer::new(&app, remote)
                .layer(routes.clone())
                .oneshot(stub::request(method, uri, &[]))
                .await
                .unwrap();
            assert_eq!(stub::text(resp).await, "inner", "{method} {uri}");
            assert_eq!(routes.calls(), 1, "{method} {uri}");
        }
        assert_eq!(app.metrics.requests.unknown_model.get(), 0);
    }
}
