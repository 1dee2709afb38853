//! A response body that observes what passes: time to first byte, duration, and token counts read
//! from `usage` (or llama.cpp `timings`) in JSON bodies and SSE events, without holding anything back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};

use crate::body::{Body, BoxError};
use crate::metrics::{Metrics, Tokens};

/// The most of a non-streaming JSON body kept aside to read its `usage` at the end.
const JSON_COPY_LIMIT: usize = 1 << 20;
/// The longest SSE line kept while waiting for its end.
const LINE_LIMIT: usize = 256 * 1024;

/// Which request this is, for the labels.
#[derive(Clone)]
pub struct Labels {
    pub model: String,
    pub route: String,
    pub status: &'static str,
}

pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Records a request that ended before any upstream body (an error answered by corral itself).
pub fn record_error(metrics: &Metrics, labels: &Labels, started: Instant) {
    let l = [labels.model.as_str(), labels.route.as_str()];
    metrics
        .requests
        .with_label_values(&[l[0], l[1], labels.status])
        .inc();
    metrics
        .request_duration
        .with_label_values(&l)
        .observe(started.elapsed().as_secs_f64());
}

pub struct Metered {
    inner: Body,
    metrics: Arc<Metrics>,
    labels: Labels,
    started: Instant,
    first_byte: bool,
    sse: bool,
    line: Vec<u8>,
    /// A non-streaming JSON body's chunks (shared, not copied), read for `usage` at the end.
    json: Option<Vec<Bytes>>,
    json_len: usize,
    /// The event stream said `[DONE]` or has a declared length: nothing may be added to it.
    closed_stream: bool,
    tokens: Option<Tokens>,
    finished: bool,
    inflight: Option<super::inflight::Guard>,
    holds: Vec<Box<dyn Send + Sync>>,
    cancelled: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    /// Ends a body that sends nothing for this long (`timeouts.streamIdle`).
    idle_limit: Option<std::time::Duration>,
    last_data: tokio::time::Instant,
    /// Armed while the body waits; moved on lazily when data came since.
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Where the finished request is logged: the log, the request path, status and content type.
    activity: Option<ActivityRecord>,
    /// Time to the first byte, for the log.
    ttft_ms: Option<u64>,
    /// The response body kept for the request's capture (frames shared, not copied).
    recording: Option<super::captures::Recording>,
}

struct ActivityRecord {
    log: Arc<super::activity::Activity>,
    req_path: String,
    status: u16,
    content_type: std::borrow::Cow<'static, str>,
}

impl Metered {
    pub fn new(
        inner: Body,
        metrics: Arc<Metrics>,
        labels: Labels,
        started: Instant,
        content_type: &str,
    ) -> Metered {
        let sse = content_type.starts_with("text/event-stream");
        let json = content_type.contains("json").then(Vec::new);
        Metered {
            inner,
            metrics,
            labels,
            started,
            first_byte: false,
            sse,
            line: Vec::new(),
            json,
            json_len: 0,
            closed_stream: false,
            tokens: None,
            finished: false,
            inflight: None,
            holds: Vec::new(),
            cancelled: None,
            idle_limit: None,
            last_data: tokio::time::Instant::now(),
            idle_timer: None,
            activity: None,
            ttft_ms: None,
            recording: None,
        }
    }

    /// Keeps the response body for the request's capture (captures on only).
    pub fn recording(mut self, recording: Option<super::captures::Recording>) -> Self {
        self.recording = recording;
        self
    }

    /// Logs the request in the activity log when it ends.
    pub fn logged_in(
        mut self,
        log: Arc<super::activity::Activity>,
        req_path: String,
        status: http::StatusCode,
        content_type: &str,
    ) -> Self {
        self.activity = Some(ActivityRecord {
            log,
            req_path,
            status: status.as_u16(),
            content_type: super::activity::content_type(content_type),
        });
        self
    }

    /// Ends the body when the upstream sends nothing for `limit`.
    pub fn with_idle_limit(mut self, limit: Option<std::time::Duration>) -> Self {
        self.idle_limit = limit;
        self
    }

    /// A body of declared length cannot take an added error event.
    pub fn length_framed(mut self, framed: bool) -> Self {
        self.closed_stream |= framed;
        self
    }

    /// True once the upstream has been silent for the idle limit; arms the timer otherwise.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.idle_limit else {
            return false;
        };
        loop {
            let Some(due) = self.last_data.checked_add(limit) else {
                return false;
            };
            let timer = self
                .idle_timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if due <= tokio::time::Instant::now() {
                return true;
            }
            // data came while the timer ran: wait for the rest of the new period
            timer.as_mut().reset(due);
        }
    }

    /// Keeps the request listed as in flight until the body ends, and ends it if an operator cancels.
    pub fn with_inflight(
        mut self,
        guard: Option<super::inflight::Guard>,
        token: tokio_util::sync::CancellationToken,
    ) -> Self {
        self.inflight = guard;
        self.cancelled = Some(Box::pin(token.cancelled_owned()));
        self
    }

    /// Keeps these alive (selector counts) until the body ends.
    pub fn holding(mut self, holds: Vec<Box<dyn Send + Sync>>) -> Self {
        self.holds = holds;
        self
    }

    fn observe(&mut self, data: &Bytes) {
        if let Some(recording) = &mut self.recording {
            recording.push(data);
        }
        if !self.first_byte {
            self.first_byte = true;
            self.ttft_ms = Some(self.started.elapsed().as_millis() as u64);
            let l = [self.labels.model.as_str(), self.labels.route.as_str()];
            self.metrics
                .time_to_first_byte
                .with_label_values(&l)
                .observe(self.started.elapsed().as_secs_f64());
        }
        if self.sse {
            for &b in data.iter() {
                if b == b'\n' {
                    let line = std::mem::take(&mut self.line);
                    self.sse_line(&line);
                } else if self.line.len() < LINE_LIMIT {
                    self.line.push(b);
                }
            }
        } else if let Some(chunks) = &mut self.json {
            self.json_len += data.len();
            if self.json_len <= JSON_COPY_LIMIT {
                chunks.push(data.clone());
            } else {
                self.json = None;
            }
        }
    }

    fn sse_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.closed_stream = true;
            return;
        }
        // only the events that carry counts are parsed (usually the last one)
        let carries = |key: &[u8]| memchr::memmem::find(data, key).is_some();
        if data.first() != Some(&b'{') || !(carries(b"\"usage\"") || carries(b"\"timings\"")) {
            return;
        }
        if let Some(t) = Tokens::from_slice(data) {
            self.tokens = Some(t);
        }
    }

    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut error = None;
        if let Some(chunks) = self.json.take() {
            let joined;
            let body: &[u8] = match chunks.as_slice() {
                [one] => one,
                many => {
                    joined = many.concat();
                    &joined
                }
            };
            self.tokens = Tokens::from_slice(body).or(self.tokens);
            if self.activity.as_ref().is_some_and(|a| a.status >= 400) {
                error = error_message(body);
            }
        }
        let l = [self.labels.model.as_str(), self.labels.route.as_str()];
        self.metrics
            .requests
            .with_label_values(&[l[0], l[1], self.labels.status])
            .inc();
        self.metrics
            .request_duration
            .with_label_values(&l)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(t) = self.tokens {
            self.metrics
                .prompt_tokens
                .with_label_values(&[l[0]])
                .inc_by(t.prompt);
            self.metrics
                .completion_tokens
                .with_label_values(&[l[0]])
                .inc_by(t.completion);
        }
        if let Some(a) = self.activity.take() {
            let error = error.or_else(|| {
                (a.status >= 400).then(|| {
                    http::StatusCode::from_u16(a.status)
                        .ok()
                        .and_then(|s| s.canonical_reason())
                        .unwrap_or("error")
                        .to_string()
                })
            });
            a.log.record(super::activity::Entry {
                // the last use of the labels: metrics are recorded above
                model: std::mem::take(&mut self.labels.model),
                req_path: a.req_path,
                status: a.status,
                content_type: a.content_type,
                tokens: self.tokens,
                duration_ms: self.started.elapsed().as_millis() as u64,
                ttft_ms: self.ttft_ms,
                error,
                capture: self
                    .recording
                    .take()
                    .map(super::captures::Recording::finish),
            });
        }
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
        if let Some(cancelled) = &mut self.cancelled {
            if cancelled.as_mut().poll(cx).is_ready() {
                self.cancelled = None;
                self.finish();
                return Poll::Ready(Some(Err("request cancelled".into())));
            }
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.observe(&data);
                }
                if self.idle_limit.is_some() {
                    self.last_data = tokio::time::Instant::now();
                }
            }
            Poll::Pending if self.idle_expired(cx) => {
                let limit = self.idle_limit.unwrap_or_default().as_secs();
                let why = format!("no data from the upstream for {limit}s (timeouts.streamIdle)");
                tracing::warn!(model = %self.labels.model, "ending a response: {why}");
                self.finish();
                if self.sse && !self.closed_stream {
                    return Poll::Ready(Some(Ok(Frame::data(stream_error_event(&why)))));
                }
                return Poll::Ready(Some(Err(why.into())));
            }
            Poll::Ready(Some(Err(e))) if self.sse && !self.closed_stream => {
                // the engine died or the connection broke mid-stream: end the stream with an
                // error event that OpenAI clients raise, rather than a truncated response
                let event = stream_error_event(&e.to_string());
                self.finish();
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An error body's message: `error.message`, `error`, `message` or `detail`.
fn error_message(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    v.get("error")
        .and_then(|e| e.get("message").and_then(text).or_else(|| text(e)))
        .or_else(|| v.get("message").and_then(text))
        .or_else(|| v.get("detail").and_then(text))
}

/// The last event of a stream the upstream broke off.
fn stream_error_event(why: &str) -> Bytes {
    crate::error::sse_error_event(
        http::StatusCode::BAD_GATEWAY,
        &format!("the upstream stream ended early: {why}"),
    )
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.finish();
    }
}
