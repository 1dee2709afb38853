//! The body type used on both sides of the proxy: boxed, so streamed and buffered bodies mix.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// An empty answer that sends the client on to `to`.
pub fn redirect(status: http::StatusCode, to: &str) -> http::Response<Body> {
    http::Response::builder()
        .status(status)
        .header(http::header::LOCATION, to)
        .body(empty())
        .expect("valid response")
}

/// Ends a task when the body that streams its output is dropped (the client went away), so no
/// detached task outlives its request.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A `text/event-stream` response whose body is what `task` sends on `rx`; the task is aborted
/// when the client goes away.
pub fn sse_from_task(
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    task: tokio::task::JoinHandle<()>,
) -> http::Response<Body> {
    use http_body_util::StreamBody;
    let guard = AbortOnDrop(task);
    let frames = futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let data = rx.recv().await?;
        Some((Ok::<_, BoxError>(http_body::Frame::data(data)), (rx, guard)))
    });
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, "text/event-stream")
        .header(http::header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(StreamBody::new(frames).boxed())
        .expect("static response parts are valid")
}
