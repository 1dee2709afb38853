//! What needs no key, answered before auth: CORS preflight, health, the redirects to the UI, and
//! the UI itself (its pages hold no data). A loopback listener first refuses hosts it does not
//! answer to (`hosts.rs`), whatever the route.

use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};

use super::{answer_now, Answer};
use crate::api::auth::{self, Keys};
use crate::api::{cors, redirect, text};
use crate::body::Body;
use crate::config::Scope;
use crate::error::Error;

#[derive(Clone, Copy)]
pub struct OpenRoutesLayer<'a> {
    keys: &'a Keys,
}

impl<'a> OpenRoutesLayer<'a> {
    pub fn new(keys: &'a Keys) -> Self {
        OpenRoutesLayer { keys }
    }
}

impl<'a, S> tower::Layer<S> for OpenRoutesLayer<'a> {
    type Service = OpenRoutes<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        OpenRoutes {
            keys: self.keys,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct OpenRoutes<'a, S> {
    keys: &'a Keys,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for OpenRoutes<'_, S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Error>,
{
    type Response = Response<Body>;
    type Error = Error;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if let Err(refused) = self.keys.admit_host(req.headers(), req.uri()) {
            return answer_now(Err(refused));
        }
        match open_route(self.keys, &req) {
            Some(resp) => answer_now(Ok(resp)),
            None => futures_util::future::Either::Right(self.inner.call(req)),
        }
    }
}

fn open_route<B>(keys: &Keys, req: &Request<B>) -> Option<Response<Body>> {
    let (method, path) = (req.method(), req.uri().path());
    if method == Method::OPTIONS {
        let any_origin = !keys.required() || auth::scope_for(path) == Scope::Inference;
        return Some(cors::preflight(req.headers(), any_origin));
    }
    match (method.as_str(), path) {
        ("GET" | "HEAD", "/health" | "/wol-health") => Some(text(StatusCode::OK, "OK")),
        ("GET" | "HEAD", "/") => Some(redirect(StatusCode::FOUND, "/ui")),
        (_, "/upstream") => Some(redirect(StatusCode::FOUND, "/ui/models")),
        _ if crate::ui::serves(method, path) => Some(crate::ui::serve(path, keys.required())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use http::header;
    use tower::{Layer, ServiceExt};

    use super::super::stub::{self, Stub};
    use super::*;
    use crate::config::ApiKey;

    fn keyed() -> Keys {
        Keys::new(&[ApiKey {
            key: "sekrit".into(),
            scope: Scope::Admin,
            name: None,
            models: vec![],
        }])
    }

    fn refused() -> Result<Response<Body>, Error> {
        Err(Error::Unauthorized)
    }

    #[tokio::test]
    async fn open_routes_are_answered_without_the_inner_service() {
        let keys = keyed();
        for (method, uri, status) in [
            ("GET", "/health", StatusCode::OK),
            ("HEAD", "/wol-health", StatusCode::OK),
            ("GET", "/", StatusCode::FOUND),
            ("POST", "/upstream", StatusCode::FOUND),
            ("OPTIONS", "/running", StatusCode::NO_CONTENT),
        ] {
            let inner = Stub::answering(refused);
            let resp = OpenRoutesLayer::new(&keys)
                .layer(inner.clone())
                .oneshot(stub::request(method, uri, &[]))
                .await
                .unwrap();
            assert_eq!(resp.status(), status, "{method} {uri}");
            assert_eq!(inner.calls(), 0, "{method} {uri}");
        }
    }

    #[tokio::test]
    async fn preflight_allows_any_origin_only_for_model_routes_when_keyed() {
        let keys = keyed();
        let origin = |uri| {
            let svc = OpenRoutesLayer::new(&keys).layer(Stub::answering(refused));
            async move {
                let resp = svc
                    .oneshot(stub::request("OPTIONS", uri, &[]))
                    .await
                    .unwrap();
                resp.headers()
                    .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            }
        };
        assert!(origin("/v1/chat/completions").await);
        assert!(!origin("/api/models/unload").await);
    }

    #[tokio::test]
    async fn other_routes_go_on() {
        let keys = keyed();
        let inner = Stub::answering(refused);
        let result = OpenRoutesLayer::new(&keys)
            .layer(inner.clone())
            .oneshot(stub::request("GET", "/running", &[]))
            .await;
        assert!(matches!(result, Err(Error::Unauthorized)));
        assert_eq!(inner.calls(), 1);
    }
}
