//! A response body that observes what passes, without holding anything back. Each concern is a
//! part of its own: token counts ([`usage`]), the idle limit ([`idle`]), an operator's cancel, and
//! the error event that ends a broken stream; [`Metered`] composes them and, once, when its body
//! ends, hands the request to its bookkeeping ([`settle`]), done after the answer is written.

mod idle;
mod settle;
mod tokens;
pub(crate) mod usage;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};

use crate::metrics::{KeySeries, Metrics, RequestSeries};
use crate::proxy::body::{Body, BoxError};
use idle::IdleLimit;
pub use settle::{after_the_write, settle_all};
use usage::UsageTap;

/// Which request this is, for the labels.
#[derive(Clone)]
pub struct Labels {
    pub model: Arc<str>,
    /// The route as the client named it: one of the model routes, or `/upstream`.
    pub route: &'static str,
    pub status: &'static str,
    /// The label of the API key the request presented, when keys are configured.
    pub key: Option<Arc<str>>,
}

pub use crate::metrics::status_class;

impl Labels {
    fn series(&self, metrics: &Metrics) -> Arc<RequestSeries> {
        metrics
            .requests
            .series(&self.model, self.route, self.status)
    }

    fn key_series(&self, metrics: &Metrics) -> Option<KeySeries> {
        let key = self.key.as_deref()?;
        Some(metrics.requests.key_series(key, &self.model, self.status))
    }
}

/// Records a request that ended before any upstream body (an error answered by corral itself).
pub fn record_error(metrics: &Metrics, labels: &Labels, started: Instant) {
    let series = labels.series(metrics);
    series.answered.inc();
    series.duration.observe(started.elapsed().as_secs_f64());
    if let Some(by_key) = labels.key_series(metrics) {
        by_key.answered.inc();
    }
}

pub struct Metered {
    inner: Body,
    /// Where this request's counts go, resolved once.
    series: Arc<RequestSeries>,
    /// Where its counts by key go, for a request that presented a key.
    key_series: Option<KeySeries>,
    labels: Labels,
    started: Instant,
    usage: UsageTap,
    /// The body has a declared length, or the stream said `[DONE]`: nothing may be added to it.
    length_framed: bool,
    finished: bool,
    inflight: Option<crate::observe::inflight::Guard>,
    holds: Vec<Box<dyn Send + Sync>>,
    cancel: Option<Arc<crate::observe::cancel::Cancel>>,
    idle: Option<IdleLimit>,
    /// Where the finished request is logged: the log, the request path, status and content type.
    activity: Option<ActivityRecord>,
    /// Time to the first byte, for the log; `None` until the first byte.
    ttft_ms: Option<u64>,
    /// The response body kept for the request's capture (frames shared, not copied).
    recording: Option<crate::observe::captures::Recording>,
}

struct ActivityRecord {
    log: Arc<crate::observe::activity::Activity>,
    req_path: std::borrow::Cow<'static, str>,
    status: u16,
    content_type: std::borrow::Cow<'static, str>,
    /// The address the request came from.
    src: std::net::SocketAddr,
}

impl Metered {
    pub fn new(
        inner: Body,
        metrics: &Metrics,
        labels: Labels,
        started: Instant,
        content_type: &str,
    ) -> Metered {
        Metered {
            inner,
            series: labels.series(metrics),
            key_series: labels.key_series(metrics),
            labels,
            started,
            usage: UsageTap::new(content_type),
            length_framed: false,
            finished: false,
            inflight: None,
            holds: Vec::new(),
            cancel: None,
            idle: None,
            activity: None,
            ttft_ms: None,
            recording: None,
        }
    }

    /// Keeps the response body for the request's capture (captures on only).
    pub fn recording(
        &mut self,
        recording: Option<crate::observe::captures::Recording>,
    ) -> &mut Self {
        self.recording = recording;
        self
    }

    /// Logs the request in the activity log when it ends.
    pub fn logged_in(
        &mut self,
        log: Arc<crate::observe::activity::Activity>,
        req_path: std::borrow::Cow<'static, str>,
        status: http::StatusCode,
        content_type: &str,
        src: std::net::SocketAddr,
    ) -> &mut Self {
        self.activity = Some(ActivityRecord {
            log,
            req_path,
            status: status.as_u16(),
            content_type: crate::observe::activity::content_type(content_type),
            src,
        });
        self
    }

    /// Ends the body when the upstream sends nothing for `limit`.
    pub fn with_idle_limit(&mut self, limit: Option<std::time::Duration>) -> &mut Self {
        self.idle = limit.map(IdleLimit::new);
        self
    }

    /// A body of declared length cannot take an added error event.
    pub fn length_framed(&mut self, framed: bool) -> &mut Self {
        self.length_framed |= framed;
        self
    }

    /// Keeps the request listed as in flight until the body ends, and ends it if an operator cancels.
    pub fn with_inflight(
        &mut self,
        guard: Option<crate::observe::inflight::Guard>,
        cancel: Arc<crate::observe::cancel::Cancel>,
    ) -> &mut Self {
        self.inflight = guard;
        self.cancel = Some(cancel);
        self
    }

    /// Keeps these alive (selector counts) until the body ends.
    pub fn holding(&mut self, holds: Vec<Box<dyn Send + Sync>>) -> &mut Self {
        self.holds = holds;
        self
    }

    fn observe(&mut self, data: &Bytes) {
        if let Some(recording) = &mut self.recording {
            recording.push(data);
        }
        if self.ttft_ms.is_none() {
            let elapsed = self.started.elapsed();
            self.ttft_ms = Some(elapsed.as_millis() as u64);
            self.series
                .time_to_first_byte
                .observe(elapsed.as_secs_f64());
        }
        self.usage.observe(data);
    }

    /// True when the body may still get an error event: an event stream, not yet closed.
    fn open_stream(&self) -> bool {
        self.usage.is_sse() && !self.usage.done && !self.length_framed
    }

    /// True once an operator cancelled the request.
    fn cancelled(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.cancel.as_ref().is_some_and(|c| c.poll_cancelled(cx)) {
            return false;
        }
        self.cancel = None;
        true
    }

    /// Hands the request to its bookkeeping ([`settle`]), once.
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        settle::queue(settle::Pending {
            series: self.series.clone(),
            key_series: self.key_series.take(),
            key: self.labels.key.clone(),
            model: self.labels.model.clone(),
            elapsed: self.started.elapsed(),
            ttft_ms: self.ttft_ms,
            usage: std::mem::replace(&mut self.usage, UsageTap::new("")),
            activity: self.activity.take().map(settle::Logged::now),
            recording: self.recording.take(),
        });
    }

    /// The upstream went quiet for the idle limit: an open event stream ends with an error event,
    /// anything else with an error.
    fn end_idle(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let limit = self.idle.as_ref().map(IdleLimit::limit).unwrap_or_default();
        let why = format!(
            "no data from the upstream for {}s (timeouts.streamIdle)",
            limit.as_secs()
        );
        tracing::warn!(model = %self.labels.model, "ending a response: {why}");
        let open = self.open_stream();
        self.finish();
        if open {
            return Poll::Ready(Some(Ok(Frame::data(stream_error_event(&why)))));
        }
        Poll::Ready(Some(Err(why.into())))
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.finished {
            // an event stream that failed was closed with an error event
            return Poll::Ready(None);
        }
        if self.cancelled(cx) {
            self.finish();
            return Poll::Ready(Some(Err("request cancelled".into())));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.observe(data);
                }
                if let Some(idle) = &mut self.idle {
                    idle.touch();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending if self.idle.as_mut().is_some_and(|i| i.expired(cx)) => self.end_idle(),
            Poll::Ready(Some(Err(e))) if self.open_stream() => {
                // the engine died or the connection broke mid-stream: end the stream with an
                // error event that OpenAI clients raise, rather than a truncated response
                let event = stream_error_event(&e.to_string());
                self.finish();
                Poll::Ready(Some(Ok(Frame::data(event))))
            }
            end @ (Poll::Ready(None) | Poll::Ready(Some(Err(_)))) => {
                self.finish();
                end
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The last event of a stream the upstream broke off.
pub(crate) fn stream_error_event(why: &str) -> Bytes {
    crate::proxy::error::sse_error_event(
        http::StatusCode::BAD_GATEWAY,
        &format!("the upstream stream ended early: {why}"),
    )
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.finish();
    }
}
