//! Model requests split off before the management route table: each is dispatched to its model (or
//! passed through for `/upstream/<model>/...`) so an operator can cancel it, then metered under its
//! route (all of `/upstream` is one route).

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response};

use crate::api::model_request::{admit, model_call, model_request, Routed};
use crate::api::ollama;
use crate::api::App;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;

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

#[cfg(test)]
mod tests {
    use tower::{Layer, ServiceExt};

    use super::super::stub::{self, Stub};
    use super::*;
    use crate::api::model_request::ModelCall;
    use http::Method;

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
