//! The outermost layer: the `Access-Control-*` headers of every answer but a preflight (the open
//! routes answer those), errors included, so that a browser application can read why it was
//! refused. What the answer gets is decided from the request before it goes on.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{header, HeaderValue, Method, Request, Response};

use crate::api::auth::Keys;
use crate::api::cors;
use crate::config::CorsConfig;
use crate::proxy::body::Body;

#[derive(Clone, Copy)]
pub struct CorsLayer<'a> {
    cors: Option<&'a CorsConfig>,
    keys: &'a Keys,
}

impl<'a> CorsLayer<'a> {
    pub fn new(cors: Option<&'a CorsConfig>, keys: &'a Keys) -> Self {
        CorsLayer { cors, keys }
    }
}

impl<'a, S> tower::Layer<S> for CorsLayer<'a> {
    type Service = Cors<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Cors {
            cors: self.cors,
            keys: self.keys,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Cors<'a, S> {
    cors: Option<&'a CorsConfig>,
    keys: &'a Keys,
    inner: S,
}

/// What an answer gets on its way out.
enum Finish<'a> {
    /// Nothing: a preflight, or a request llama-swap v250 added nothing to.
    Leave,
    /// llama-swap v250's model list: the request's `Origin`, echoed on a success.
    EchoOrigin(HeaderValue),
    /// The configured policy: upstream CORS headers out, corral's in for an allowed origin.
    Policy(&'a CorsConfig, Option<HeaderValue>),
}

impl<'a> Finish<'a> {
    fn for_request<B>(cors: Option<&'a CorsConfig>, keys: &Keys, req: &Request<B>) -> Self {
        let (method, path, headers) = (req.method(), req.uri().path(), req.headers());
        if method == Method::OPTIONS {
            return Finish::Leave;
        }
        match cors {
            Some(cors) => {
                let management = cors::keyed_management(keys, path);
                Finish::Policy(cors, cors::allowed_origin(cors, headers, management))
            }
            // the path first: most requests are not for the model list, and skip the lookup
            None if is_model_list(method, path) => match headers.get(header::ORIGIN) {
                Some(origin) => Finish::EchoOrigin(origin.clone()),
                None => Finish::Leave,
            },
            None => Finish::Leave,
        }
    }

    fn apply(self, resp: &mut Response<Body>) {
        match self {
            Finish::Leave => {}
            Finish::EchoOrigin(origin) if resp.status().is_success() => {
                resp.headers_mut()
                    .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            }
            Finish::EchoOrigin(_) => {}
            Finish::Policy(cors, origin) => cors::finish(cors, origin, resp.headers_mut()),
        }
    }
}

/// `GET /v1/models` (and `/models`), which llama-swap v250 answered with the request's `Origin`.
fn is_model_list(method: &Method, path: &str) -> bool {
    (method == Method::GET || method == Method::HEAD) && matches!(path, "/v1/models" | "/models")
}

impl<'a, S, B> tower::Service<Request<B>> for Cors<'a, S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Finished<'a, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let finish = Some(Finish::for_request(self.cors, self.keys, &req));
        Finished {
            inner: self.inner.call(req),
            finish,
        }
    }
}

pin_project_lite::pin_project! {
    pub struct Finished<'a, F> {
        #[pin]
        inner: F,
        finish: Option<Finish<'a>>,
    }
}

impl<F, E> Future for Finished<'_, F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if let Some(finish) = this.finish.take() {
            finish.apply(&mut resp);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use http::StatusCode;
    use tower::{Layer, ServiceExt};

    use super::super::stub::{self, Stub};
    use super::*;
    use crate::config::{ApiKey, Scope};
    use crate::proxy::error::Error;

    const DASH: &str = "https://dash.example";

    fn keyless() -> Keys {
        Keys::new(&[])
    }

    fn keyed() -> Keys {
        Keys::new(&[ApiKey {
            key: "sekrit".into(),
            scope: Scope::Admin,
            name: None,
            models: vec![],
        }])
    }

    fn policy(any_origin: bool) -> CorsConfig {
        CorsConfig {
            any_origin,
            origins: BTreeSet::from([DASH.to_string()]),
            allow_credentials: false,
            allow_private_network: false,
            allowed_methods: vec!["GET".into()],
            allowed_headers: vec![],
            exposed_headers: vec![],
            max_age: 86400,
        }
    }

    /// An engine's answer that carries CORS headers of its own, as llama-server's do.
    fn engine_answer() -> Result<Response<Body>, Error> {
        let mut resp = crate::api::text(StatusCode::OK, "inner");
        let h = resp.headers_mut();
        h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        h.insert(
            "access-control-allow-credentials",
            HeaderValue::from_static("true"),
        );
        Ok(resp)
    }

    fn refused() -> Result<Response<Body>, Error> {
        Ok(crate::api::text(StatusCode::UNAUTHORIZED, "no"))
    }

    async fn answer(
        cors: Option<&CorsConfig>,
        keys: &Keys,
        inner: fn() -> Result<Response<Body>, Error>,
        (method, uri, origin): (&str, &str, Option<&str>),
    ) -> Response<Body> {
        let headers: Vec<_> = origin.iter().map(|o| ("origin", *o)).collect();
        CorsLayer::new(cors, keys)
            .layer(Stub::answering(inner))
            .oneshot(stub::request(method, uri, &headers))
            .await
            .unwrap()
    }

    fn allow_origin(resp: &Response<Body>) -> Option<&str> {
        resp.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn without_a_policy_only_the_model_list_echoes_origin() {
        let keys = keyless();
        let ask = |uri| ("GET", uri, Some("https://any.example"));
        let list = answer(None, &keys, stub::ok, ask("/v1/models")).await;
        assert_eq!(allow_origin(&list), Some("https://any.example"));
        let list = answer(None, &keys, stub::ok, ask("/models")).await;
        assert_eq!(allow_origin(&list), Some("https://any.example"));
        let other = answer(None, &keys, stub::ok, ask("/running")).await;
        assert_eq!(allow_origin(&other), None);
        let failed = answer(None, &keys, refused, ask("/v1/models")).await;
        assert_eq!(allow_origin(&failed), None, "as before: the list only");
        let untouched = answer(None, &keys, engine_answer, ask("/v1/chat/completions")).await;
        assert_eq!(
            allow_origin(&untouched),
            Some("*"),
            "v250 passed engines' through"
        );
    }

    #[tokio::test]
    async fn a_policy_replaces_an_engines_headers_with_its_own() {
        let (keys, cors) = (keyless(), policy(false));
        let chat = |origin| ("POST", "/v1/chat/completions", origin);
        let resp = answer(Some(&cors), &keys, engine_answer, chat(Some(DASH))).await;
        assert_eq!(allow_origin(&resp), Some(DASH));
        assert!(!resp
            .headers()
            .contains_key("access-control-allow-credentials"));
        for origin in [None, Some("https://evil.example")] {
            let resp = answer(Some(&cors), &keys, engine_answer, chat(origin)).await;
            assert_eq!(allow_origin(&resp), None, "{origin:?}");
            assert!(!resp
                .headers()
                .contains_key("access-control-allow-credentials"));
            assert_eq!(resp.headers()["vary"], "Origin");
        }
    }

    #[tokio::test]
    async fn keyed_management_answers_listed_origins_only() {
        let (keys, cors) = (keyed(), policy(true));
        let running = |origin| ("GET", "/running", Some(origin));
        let resp = answer(Some(&cors), &keys, stub::ok, running("https://any.example")).await;
        assert_eq!(allow_origin(&resp), None);
        let resp = answer(Some(&cors), &keys, stub::ok, running(DASH)).await;
        assert_eq!(allow_origin(&resp), Some(DASH));
        let models = ("GET", "/v1/models", Some("https://any.example"));
        let resp = answer(Some(&cors), &keys, stub::ok, models).await;
        assert_eq!(allow_origin(&resp), Some("*"));
    }

    #[tokio::test]
    async fn an_error_answer_is_finished_too_and_a_preflight_left_alone() {
        let (keys, cors) = (keyless(), policy(false));
        let resp = answer(Some(&cors), &keys, refused, ("GET", "/running", Some(DASH))).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            allow_origin(&resp),
            Some(DASH),
            "a browser app may read why"
        );
        let pre = answer(
            Some(&cors),
            &keys,
            engine_answer,
            ("OPTIONS", "/x", Some(DASH)),
        )
        .await;
        assert_eq!(
            allow_origin(&pre),
            Some("*"),
            "the open routes answer preflights"
        );
    }
}
