//! Keys before anything else is read: a request without a key that reaches its route is refused,
//! a browser on another site may not change state, and corral's own key headers are removed
//! before the request goes on (to a model, they would leak).

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use super::{answer_now, Answer};
use crate::api::auth::{self, Keys};
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::grant::{Caller, Grant};

#[derive(Clone, Copy)]
pub struct AuthLayer<'a> {
    keys: &'a Keys,
}

impl<'a> AuthLayer<'a> {
    pub fn new(keys: &'a Keys) -> Self {
        AuthLayer { keys }
    }
}

impl<'a, S> tower::Layer<S> for AuthLayer<'a> {
    type Service = Auth<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            keys: self.keys,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Auth<'a, S> {
    keys: &'a Keys,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Auth<'_, S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Error>,
{
    type Response = Response<Body>;
    type Error = Error;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        match admit(self.keys, &req) {
            Err(refused) => return answer_now(Err(refused)),
            // the handlers that decide by model or engine path read the grant here
            Ok(Some(grant)) => drop(req.extensions_mut().insert(Caller(grant))),
            Ok(None) => {}
        }
        self.keys.strip_own(req.headers_mut());
        futures_util::future::Either::Right(self.inner.call(req))
    }
}

/// A key whose scope reaches the route, and no cross-site request that changes state; the key's
/// grant, when keys are configured and the route is not open.
fn admit<B>(keys: &Keys, req: &Request<B>) -> Result<Option<Arc<Grant>>, Error> {
    let (method, path, headers) = (req.method(), req.uri().path(), req.headers());
    let grant = match keys.open(path) {
        true => None,
        false => keys.check(headers, auth::scope_for(path))?,
    };
    let guarded =
        auth::changes_state(method, path) || auth::simple_model_request(method, path, headers);
    if guarded && auth::cross_site(headers, req.uri()) {
        return Err(Error::Forbidden(
            "forbidden: cross-site requests may not change state".into(),
        ));
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use tower::{Layer, ServiceExt};

    use super::super::stub::{self, Stub};
    use super::*;
    use crate::config::{ApiKey, Scope};

    fn keys() -> Keys {
        Keys::new(&[
            ApiKey {
                key: "admin-key".into(),
                scope: Scope::Admin,
                name: None,
                models: vec![],
            },
            ApiKey {
                key: "inference-key".into(),
                scope: Scope::Inference,
                name: Some("apps".into()),
                models: vec![],
            },
        ])
    }

    async fn through(keys: &Keys, req: Request<stub::Sent>) -> (usize, Result<(), Error>) {
        let inner = Stub::answering(stub::ok);
        let result = AuthLayer::new(keys).layer(inner.clone()).oneshot(req).await;
        (inner.calls(), result.map(drop))
    }

    #[tokio::test]
    async fn a_missing_or_unknown_key_is_refused_before_the_route() {
        let keys = keys();
        for headers in [&[][..], &[("x-api-key", "guess")][..]] {
            let req = stub::request("GET", "/running", headers);
            let (calls, result) = through(&keys, req).await;
            assert!(matches!(result, Err(Error::Unauthorized)), "{headers:?}");
            assert_eq!(calls, 0, "{headers:?}");
        }
    }

    #[tokio::test]
    async fn a_key_without_the_scope_is_forbidden() {
        let req = stub::request("GET", "/running", &[("x-api-key", "inference-key")]);
        let (calls, result) = through(&keys(), req).await;
        assert!(matches!(result, Err(Error::Forbidden(_))));
        assert_eq!(calls, 0);
    }

    #[tokio::test]
    async fn a_cross_site_request_that_changes_state_is_forbidden() {
        let keys = Keys::new(&[]);
        let cross = [("host", "corral:8080"), ("sec-fetch-site", "cross-site")];
        for (method, uri, headers) in [
            ("POST", "/api/models/unload", &cross[..]),
            ("GET", "/unload", &cross[..]),
            (
                "POST",
                "/v1/chat/completions",
                &[("host", "corral:8080"), ("origin", "http://evil.example")][..],
            ),
        ] {
            let (calls, result) = through(&keys, stub::request(method, uri, headers)).await;
            assert!(matches!(result, Err(Error::Forbidden(_))), "{method} {uri}");
            assert_eq!(calls, 0, "{method} {uri}");
        }
        let read = stub::request("GET", "/running", &cross);
        assert_eq!(through(&keys, read).await.0, 1, "reading is not refused");
    }

    #[tokio::test]
    async fn corral_keys_are_stripped_and_engine_keys_pass() {
        let keys = keys();
        let inner = Stub::answering(stub::ok);
        let req = stub::request(
            "POST",
            "/v1/chat/completions",
            &[
                ("x-api-key", "inference-key"),
                ("authorization", "Bearer engine-own"),
                ("content-type", "application/json"),
            ],
        );
        AuthLayer::new(&keys)
            .layer(inner.clone())
            .oneshot(req)
            .await
            .unwrap();
        let seen = inner.heads.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(!seen[0].headers.contains_key("x-api-key"));
        assert_eq!(seen[0].headers["authorization"], "Bearer engine-own");
    }
}
