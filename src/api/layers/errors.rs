//! The outermost layer: an `Error` from below becomes llama-swap's answer for it, worded for the
//! request's `Accept`, with known secrets masked; and a 204 goes out without a length.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{header, HeaderValue, Request, Response, StatusCode};
use tower::util::Oneshot;
use tower::ServiceExt;

use crate::config::Redactor;
use crate::proxy::body::Body;
use crate::proxy::error::{render, Error};

#[derive(Clone, Copy)]
pub struct RenderErrorsLayer<'a> {
    redactor: &'a Redactor,
}

impl<'a> RenderErrorsLayer<'a> {
    pub fn new(redactor: &'a Redactor) -> Self {
        RenderErrorsLayer { redactor }
    }
}

impl<'a, S> tower::Layer<S> for RenderErrorsLayer<'a> {
    type Service = RenderErrors<'a, S>;

    fn layer(&self, inner: S) -> Self::Service {
        RenderErrors {
            redactor: self.redactor,
            inner,
        }
    }
}

/// Never fails: what fails below is answered.
#[derive(Clone)]
pub struct RenderErrors<'a, S> {
    redactor: &'a Redactor,
    inner: S,
}

impl<'a, S, B> tower::Service<Request<B>> for RenderErrors<'a, S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Error> + Clone,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Rendered<'a, S, Request<B>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    /// The inner service is driven to readiness in the answer's future (as axum's `HandleError`
    /// does), so that even its readiness failing is answered; the services below are a few borrowed
    /// pointers, cheap to copy.
    fn call(&mut self, req: Request<B>) -> Self::Future {
        Rendered {
            accept: req.headers().get(header::ACCEPT).cloned(),
            redactor: self.redactor,
            inner: self.inner.clone().oneshot(req),
        }
    }
}

pin_project_lite::pin_project! {
    pub struct Rendered<'a, S, R>
    where
        S: tower::Service<R>,
    {
        #[pin]
        inner: Oneshot<S, R>,
        accept: Option<HeaderValue>,
        redactor: &'a Redactor,
    }
}

impl<S, R> Future for Rendered<'_, S, R>
where
    S: tower::Service<R, Response = Response<Body>, Error = Error>,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = match ready!(this.inner.poll(cx)) {
            Ok(resp) => resp,
            Err(err) => render(&err.redacted(this.redactor), this.accept.as_ref()),
        };
        // a 204 carries no body, so no length either (the status first: it is a field, the
        // header a lookup)
        if resp.status() == StatusCode::NO_CONTENT
            && !resp.headers().contains_key(header::CONTENT_TYPE)
        {
            resp.headers_mut().remove(header::CONTENT_LENGTH);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::super::stub::{self, Stub};
    use super::*;
    use tower::Layer;

    fn refused() -> Result<Response<Body>, Error> {
        Err(Error::Unauthorized)
    }

    #[tokio::test]
    async fn an_error_is_answered_as_before_for_each_accept() {
        let redactor = Redactor::default();
        for accept in [
            None,
            Some("text/plain"),
            Some("text/html"),
            Some("application/json"),
        ] {
            let inner = Stub::answering(refused);
            let headers: Vec<_> = accept.iter().map(|a| ("accept", *a)).collect();
            let resp = RenderErrorsLayer::new(&redactor)
                .layer(inner)
                .oneshot(stub::request("GET", "/running", &headers))
                .await
                .unwrap();
            let want = render(
                &Error::Unauthorized,
                accept.map(HeaderValue::from_static).as_ref(),
            );
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{accept:?}");
            assert_eq!(resp.headers(), want.headers(), "{accept:?}");
            assert_eq!(stub::text(resp).await, stub::text(want).await, "{accept:?}");
        }
    }

    #[tokio::test]
    async fn secrets_in_an_error_are_masked() {
        fn failed() -> Result<Response<Body>, Error> {
            Err(Error::StartFailed(
                "llama-server --api-key hunter2 exited".into(),
            ))
        }
        let redactor = Redactor::new(["hunter2".to_string()]);
        let inner = Stub::answering(failed);
        let resp = RenderErrorsLayer::new(&redactor)
            .layer(inner)
            .oneshot(stub::request("POST", "/v1/chat/completions", &[]))
            .await
            .unwrap();
        let body = stub::text(resp).await;
        assert!(body.contains("--api-key"), "{body}");
        assert!(!body.contains("hunter2"), "{body}");
    }

    #[tokio::test]
    async fn a_204_loses_its_length() {
        fn no_content() -> Result<Response<Body>, Error> {
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .header(header::CONTENT_LENGTH, "0")
                .body(crate::proxy::body::empty())
                .unwrap())
        }
        let redactor = Redactor::default();
        let inner = Stub::answering(no_content);
        let resp = RenderErrorsLayer::new(&redactor)
            .layer(inner.clone())
            .oneshot(stub::request("OPTIONS", "/", &[]))
            .await
            .unwrap();
        assert_eq!(inner.calls(), 1);
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        assert!(!resp.headers().contains_key(header::CONTENT_LENGTH));
    }
}
