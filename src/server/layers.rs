//! What a connection adds around the API for each of its requests, as tower layers (outermost
//! first): the request counts as in flight on its connection until its response body ends, and
//! its body is read under the slow-body bounds (408, and close, past them).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, Version};

use crate::body::Body;
use crate::proxy::GuardedBody;
use crate::server::idle::{Activity, InFlight};
use crate::server::slow_body::{BodyDeadline, BodyLimits};

/// Counts each request in flight on its connection until its response body is done, and marks
/// the connection upgraded when a request switches protocols.
#[derive(Clone)]
pub struct InFlightLayer {
    activity: Arc<Activity>,
}

impl InFlightLayer {
    pub fn new(activity: Arc<Activity>) -> Self {
        InFlightLayer { activity }
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            activity: self.activity.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, B> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<InFlightBody>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        CountedFuture {
            in_flight: Some(self.activity.begin(req.version())),
            activity: self.activity.clone(),
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    pub struct CountedFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        activity: Arc<Activity>,
    }
}

impl<F, E> Future for CountedFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<InFlightBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = std::task::ready!(this.inner.poll(cx))?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            this.activity.upgrade();
        }
        let in_flight = this.in_flight.take();
        Poll::Ready(Ok(resp.map(|body| GuardedBody::new(body, in_flight))))
    }
}

/// A response body that keeps its request in flight until it is dropped (hyper drops it when it
/// is done). The body is wrapped, not boxed once more: that would be an allocation per response
/// and a second dynamic call per frame.
pub type InFlightBody = GuardedBody<Body, Option<InFlight>>;

/// Reads each request body under the slow-body bounds; a request whose body came too slowly is
/// answered 408 (and an HTTP/1 connection closed), whatever the API made of the cut body.
#[derive(Clone, Copy)]
pub struct SlowBodyLayer {
    limits: BodyLimits,
}

impl SlowBodyLayer {
    pub fn new(limits: BodyLimits) -> Self {
        SlowBodyLayer { limits }
    }
}

impl<S> tower::Layer<S> for SlowBodyLayer {
    type Service = SlowBody<S>;

    fn layer(&self, inner: S) -> SlowBody<S> {
        SlowBody {
            inner,
            limits: self.limits,
        }
    }
}

#[derive(Clone)]
pub struct SlowBody<S> {
    inner: S,
    limits: BodyLimits,
}

impl<S, B> tower::Service<Request<B>> for SlowBody<S>
where
    S: tower::Service<Request<BodyDeadline<B>>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = SlowBodyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let version = req.version();
        let accept = req.headers().get(http::header::ACCEPT).cloned();
        let (parts, body) = req.into_parts();
        let (body, too_slow) = BodyDeadline::new(body, self.limits);
        SlowBodyFuture {
            inner: self.inner.call(Request::from_parts(parts, body)),
            too_slow,
            version,
            accept,
        }
    }
}

pin_project_lite::pin_project! {
    pub struct SlowBodyFuture<F> {
        #[pin]
        inner: F,
        too_slow: Arc<AtomicBool>,
        version: Version,
        accept: Option<HeaderValue>,
    }
}

impl<F, E> Future for SlowBodyFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let resp = std::task::ready!(this.inner.poll(cx))?;
        if this.too_slow.load(Ordering::Acquire) {
            return Poll::Ready(Ok(slow_body_response(*this.version, this.accept.as_ref())));
        }
        Poll::Ready(Ok(resp))
    }
}

/// 408 for a body read too slowly; an HTTP/1 connection then closes (its unread rest of the body
/// cannot be skipped in time anyway).
fn slow_body_response(version: Version, accept: Option<&HeaderValue>) -> Response<Body> {
    let err = crate::error::Error::BodyTimeout("the client sent its body too slowly");
    let mut resp = crate::error::render(&err, accept);
    if version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};

    use super::*;

    /// A request body that never sends anything.
    struct Silent;

    impl http_body::Body for Silent {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    /// An API that reads the whole body and answers 400 when it cannot.
    async fn reads_body<B: http_body::Body>(req: Request<B>) -> Result<Response<Body>, Infallible> {
        let status = match req.into_body().collect().await {
            Ok(_) => StatusCode::OK,
            Err(_) => StatusCode::BAD_REQUEST,
        };
        let mut resp = Response::new(crate::body::full("read"));
        *resp.status_mut() = status;
        Ok(resp)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_too_slow_is_answered_408_and_an_http1_connection_closed() {
        let limits = BodyLimits {
            stall: Duration::from_secs(2),
            min_rate: 0,
        };
        for (version, closes) in [(Version::HTTP_11, true), (Version::HTTP_2, false)] {
            let service = SlowBodyLayer::new(limits).layer(tower::service_fn(reads_body));
            let mut req = Request::new(Silent);
            *req.version_mut() = version;
            let resp = service.oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT, "{version:?}");
            let close = resp.headers().get(http::header::CONNECTION);
            assert_eq!(close.is_some_and(|v| v == "close"), closes, "{version:?}");
        }
        let service = SlowBodyLayer::new(limits).layer(tower::service_fn(reads_body));
        let quick = Request::new(crate::body::full("all at once"));
        assert_eq!(
            service.oneshot(quick).await.unwrap().status(),
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn a_request_is_in_flight_until_its_response_body_is_done() {
        let activity = Arc::new(Activity::default());
        let answer = |status: StatusCode| {
            tower::service_fn(move |_: Request<()>| async move {
                let mut resp = Response::new(crate::body::full("answer"));
                *resp.status_mut() = status;
                Ok::<_, Infallible>(resp)
            })
        };
        let service = InFlightLayer::new(activity.clone()).layer(answer(StatusCode::OK));
        let resp = service.oneshot(Request::new(())).await.unwrap();
        assert!(activity.idle_since().is_none(), "the body is still to send");
        resp.into_body().collect().await.unwrap();
        assert!(activity.idle_since().is_some());

        let service =
            InFlightLayer::new(activity.clone()).layer(answer(StatusCode::SWITCHING_PROTOCOLS));
        drop(service.oneshot(Request::new(())).await.unwrap());
        assert!(
            activity.idle_since().is_none(),
            "an upgraded connection is never idle"
        );
    }
}
