//! What a connection adds around the API for each of its requests: the request counts as in
//! flight on its connection until its response body ends, its response's waits for hyper to take
//! the next frame are counted (`stall.rs`), an upgrade request carries the connection's handoff
//! for its tunnel (`proxy/tunnel.rs`), and its body is read under the slow-body bounds (408, and
//! close, past them).
//!
//! This is hyper's service for the connection, written out rather than tower layers behind
//! hyper-util's adapter: that adapter clones the whole stack for every request (a reference count
//! for each `Arc` in it) and moves the request through a `Oneshot` that waits for readiness, which
//! none of corral's services ever lacks.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Version};
use http_body::Frame;

use crate::proxy::body::{Body, BoxError};
use crate::proxy::tunnel::Handoff;
use crate::server::idle::{Activity, InFlight};
use crate::server::slow_body::{BodyDeadline, BodyLimits};

/// A connection's requests, each handed to `api` with its body under the slow-body bounds.
pub struct ConnectionService<A> {
    api: A,
    activity: Arc<Activity>,
    limits: BodyLimits,
    /// How long a websocket tunnel on this connection may carry nothing.
    tunnel_idle: Duration,
}

impl<A> ConnectionService<A> {
    pub fn new(api: A, activity: Arc<Activity>, limits: BodyLimits, tunnel_idle: Duration) -> Self {
        ConnectionService {
            api,
            activity,
            limits,
            tunnel_idle,
        }
    }
}

impl<A, F, B> hyper::service::Service<Request<B>> for ConnectionService<A>
where
    A: Fn(Request<BodyDeadline<B>>) -> F,
    F: Future<Output = Response<Body>>,
{
    type Response = Response<InFlightBody>;
    type Error = Infallible;
    type Future = Served<F>;

    fn call(&self, req: Request<B>) -> Served<F> {
        let in_flight = self.activity.begin(req.version());
        let version = req.version();
        let accept = req.headers().get(http::header::ACCEPT).cloned();
        let (mut parts, body) = req.into_parts();
        // only HTTP/1.1 switches protocols (HTTP/2's extended CONNECT is not enabled)
        let upgrade = version == Version::HTTP_11 && crate::proxy::is_upgrade(&parts.headers);
        if upgrade {
            parts.extensions.insert(Handoff {
                keeper: self.activity.clone(),
                idle: self.tunnel_idle,
            });
        }
        let (body, too_slow) = BodyDeadline::new(body, self.limits);
        Served {
            api: (self.api)(Request::from_parts(parts, body)),
            in_flight: Some(in_flight),
            too_slow,
            version,
            accept,
            upgrade,
        }
    }
}

pin_project_lite::pin_project! {
    /// One request's answer: the API's, or 408 when its body came too slowly (whatever the API made
    /// of the cut body), with the request in flight until the answer's body is done.
    pub struct Served<F> {
        #[pin]
        api: F,
        in_flight: Option<InFlight>,
        too_slow: Arc<AtomicBool>,
        version: Version,
        accept: Option<HeaderValue>,
        // the request asked to switch protocols
        upgrade: bool,
    }
}

impl<F> Future for Served<F>
where
    F: Future<Output = Response<Body>>,
{
    type Output = Result<Response<InFlightBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = std::task::ready!(this.api.poll(cx));
        if this.too_slow.load(Ordering::Acquire) {
            resp = slow_body_response(*this.version, this.accept.as_ref());
        }
        let mut in_flight = this.in_flight.take();
        if let Some(in_flight) = &mut in_flight {
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                in_flight.upgrade();
            } else if *this.upgrade {
                in_flight.not_upgraded();
            }
            // handed over: hyper owes the body its first poll
            in_flight.polled(true);
        }
        Poll::Ready(Ok(resp.map(|body| InFlightBody { body, in_flight })))
    }
}

/// A response body that keeps its request in flight until it is dropped (hyper drops it when it
/// is done), and notes whether hyper owes it a poll (`stall.rs`). The body is wrapped, not boxed
/// once more: that would be an allocation per response and a second dynamic call per frame.
pub struct InFlightBody {
    body: Body,
    in_flight: Option<InFlight>,
}

impl http_body::Body for InFlightBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Some(in_flight) = &mut self.in_flight {
            // a frame yielded: hyper owes the next poll; otherwise the body waits for its own
            // source (bounded there), or has ended
            in_flight.polled(matches!(polled, Poll::Ready(Some(Ok(_)))));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// 408 for a body read too slowly; an HTTP/1 connection then closes (its unread rest of the body
/// cannot be skipped in time anyway).
fn slow_body_response(version: Version, accept: Option<&HeaderValue>) -> Response<Body> {
    let err = crate::proxy::error::Error::BodyTimeout("the client sent its body too slowly");
    let mut resp = crate::proxy::error::render(&err, accept);
    if version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::BodyExt;
    use hyper::service::Service;

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
    async fn reads_body<B: http_body::Body>(req: Request<B>) -> Response<Body> {
        let status = match req.into_body().collect().await {
            Ok(_) => StatusCode::OK,
            Err(_) => StatusCode::BAD_REQUEST,
        };
        let mut resp = Response::new(crate::proxy::body::full("read"));
        *resp.status_mut() = status;
        resp
    }

    fn connection<A>(api: A, activity: &Arc<Activity>, limits: BodyLimits) -> ConnectionService<A> {
        ConnectionService::new(api, activity.clone(), limits, Duration::from_secs(60))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_too_slow_is_answered_408_and_an_http1_connection_closed() {
        let limits = BodyLimits {
            stall: Duration::from_secs(2),
            min_rate: 0,
        };
        let activity = Arc::new(Activity::default());
        for (version, closes) in [(Version::HTTP_11, true), (Version::HTTP_2, false)] {
            let service = connection(reads_body::<BodyDeadline<Silent>>, &activity, limits);
            let mut req = Request::new(Silent);
            *req.version_mut() = version;
            let resp = service.call(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT, "{version:?}");
            let close = resp.headers().get(http::header::CONNECTION);
            assert_eq!(close.is_some_and(|v| v == "close"), closes, "{version:?}");
        }
        let service = connection(reads_body::<BodyDeadline<Body>>, &activity, limits);
        let quick = Request::new(crate::proxy::body::full("all at once"));
        assert_eq!(service.call(quick).await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_request_is_in_flight_until_its_response_body_is_done() {
        let activity = Arc::new(Activity::default());
        let limits = BodyLimits {
            stall: Duration::from_secs(2),
            min_rate: 0,
        };
        let answer = |status: StatusCode| {
            move |_: Request<BodyDeadline<Body>>| async move {
                let mut resp = Response::new(crate::proxy::body::full("answer"));
                *resp.status_mut() = status;
                resp
            }
        };
        let service = connection(answer(StatusCode::OK), &activity, limits);
        let resp = service
            .call(Request::new(crate::proxy::body::empty()))
            .await;
        assert!(activity.idle_since().is_none(), "the body is still to send");
        resp.unwrap().into_body().collect().await.unwrap();
        assert!(activity.idle_since().is_some());

        let service = connection(answer(StatusCode::SWITCHING_PROTOCOLS), &activity, limits);
        drop(
            service
                .call(Request::new(crate::proxy::body::empty()))
                .await
                .unwrap(),
        );
        assert!(
            activity.idle_since().is_none(),
            "an upgraded connection is never idle"
        );
    }
}
