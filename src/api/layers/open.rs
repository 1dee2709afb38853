//! What needs no key, answered before auth: CORS preflight, health, the redirects to the UI, and
//! the UI itself (its pages hold no data). A loopback listener first refuses hosts it does not
//! answer to (`hosts.rs`), whatever the route.

use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};

use super::{answer_now, Answer};
use crate::api::auth::Keys;
use crate::api::cors;
use crate::api::text;
use crate::config::CorsConfig;
use crate::proxy::body::redirect;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

#[derive(Clone, Copy)]
pub struct OpenRoutesLayer<'a> {
    keys: &'a Keys,
    cors: Option<&'a CorsConfig>,
}

impl<'a> OpenRoutesLayer<'a> {
    pub fn new(keys: &'a Keys, cors: Option<&'a CorsConfig>) -> Self {
        OpenRoutesLayer { keys, cors }
    }
}

impl<'a, S> tower::Layer<S> for OpenRoutesLayer<'a> {
    type Service = OpenRoutes<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        OpenRoutes {
            keys: self.keys,
            cors: self.cors,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct OpenRoutes<'a, S> {
    keys: &'a Keys,
    cors: Option<&'a CorsConfig>,
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
        match open_route(self.keys, self.cors, &req) {
            Some(resp) => answer_now(Ok(resp)),
            None => futures_util::future::Either::Right(self.inner.call(req)),
        }
    }
}

fn open_route<B>(
    keys: &Keys,
    cors: Option<&CorsConfig>,
    req: &Request<B>,
) -> Option<Response<Body>> {
    let (method, path) = (req.method(), req.uri().path());
    if method == Method::OPTIONS {
        // every preflight, allowed or not: a browser sends no key with one
        let management = cors::keyed_management(keys, path);
        return Some(cors::preflight(req.headers(), cors, management));
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
    use crate::config::{ApiKey, Scope};

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
            let resp = OpenRoutesLayer::new(&keys, None)
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
            let svc = OpenRoutesLayer::new(&keys, None).layer(Stub::answering(refused));
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
    async fn with_a_policy_keyed_management_preflights_allow_listed_origins_only() {
        let keys = keyed();
        let cors = CorsConfig {
            any_origin: true,
            origins: ["https://dash.example".to_string()].into(),
            allow_credentials: false,
            allow_private_network: false,
            allowed_methods: vec!["GET".into()],
            allowed_headers: vec![],
            exposed_headers: vec![],
            max_age: 86400,
        };
        let allowed = |uri, origin| {
            let inner = Stub::answering(refused);
            let svc = OpenRoutesLayer::new(&keys, Some(&cors)).layer(inner.clone());
            async move {
                let req = stub::request("OPTIONS", uri, &[("origin", origin)]);
                let resp = svc.oneshot(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::NO_CONTENT, "{uri} {origin}");
                assert_eq!(inner.calls(), 0, "answered before auth");
                resp.headers()
                    .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                    .map(|v| v.to_str().unwrap().to_string())
            }
        };
        let any = "https://any.example";
        assert_eq!(
            allowed("/v1/chat/completions", any).await.as_deref(),
            Some("*")
        );
        assert_eq!(allowed("/api/models/unload", any).await, None);
        assert_eq!(
            allowed("/running", "https://dash.example").await.as_deref(),
            Some("https://dash.example")
        );
    }

    #[tokio::test]
    async fn other_routes_go_on() {
        let keys = keyed();
        let inner = Stub::answering(refused);
        let result = OpenRoutesLayer::new(&keys, None)
            .layer(inner.clone())
            .oneshot(stub::request("GET", "/running", &[]))
            .await;
        assert!(matches!(result, Err(Error::Unauthorized)));
        assert_eq!(inner.calls(), 1);
    }
}
