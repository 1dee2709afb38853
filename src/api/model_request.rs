//! A model request's way through the surface: what kind it is (a model route, a query route or
//! `/upstream/`), its place under `globalConcurrencyLimit`, and its record, begun here and
//! metered when its work ends or an operator cancels it. The model-request layer sends the model
//! routes here, and other APIs (Ollama's) their requests once translated into a model route's.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};

use crate::api::global_limit::Place;
use crate::api::App;
use crate::observe::cancel::Cancellable;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;
use crate::routing::grant::Caller;
use crate::routing::inference;
use crate::routing::passthrough;
use crate::routing::seen::{metered, Seen};

/// A route's work, boxed once: unboxed, the largest handler would size every request's future.
pub type Routed<'a> = Pin<Box<dyn Future<Output = Result<Response<Body>, Error>> + Send + 'a>>;

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
pub enum ModelCall {
    /// `/upstream/<rest>`: passed through as sent.
    Passthrough,
    /// A model route, and the path it is sent upstream to.
    Dispatch(&'static str, &'static str),
    /// A model query route, sent upstream as it is.
    Query(&'static str),
}

const UPSTREAM: &str = "/upstream/";

/// The model request a method and path make, if any.
pub fn model_call(method: &Method, path: &str) -> Option<ModelCall> {
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
pub fn admit(app: &App, call: ModelCall) -> Result<Option<Place>, Error> {
    match call {
        ModelCall::Passthrough => Ok(None),
        ModelCall::Dispatch(..) | ModelCall::Query(_) => app.global_limit.admit(),
    }
}

/// The request's record is begun here and finished (metered) when its work ends or an operator
/// cancels it. Not an `async fn`, which would keep a second copy of the request beside the one its
/// work holds (see [`crate::proxy::forward`]).
pub fn model_request<'a, B>(
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
