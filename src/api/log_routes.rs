//! `GET /logs` and `GET /logs/stream[/<id>]`: the log rings as plain text, with this config's
//! secrets masked, the streams live until the client leaves or shutdown starts.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, Response, StatusCode, Uri};
use http_body_util::{BodyExt, StreamBody};

use crate::api::App;
use crate::config::catalog::Target;
use crate::logs::LogRing;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// `GET /logs`: the combined history; a browser is sent to the UI instead.
pub fn history(app: &App, headers: &HeaderMap) -> Response<Body> {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if wants_html {
        return Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, "/ui/")
            .body(crate::proxy::body::empty())
            .expect("valid");
    }
    let history = Bytes::from(app.logs.combined.history());
    plain_stream(app.config.redactor.bytes(history), None)
}

/// `GET /logs/stream[/<id>]`: one log live, after its history unless the query has `no-history`.
pub fn stream(app: &App, uri: &Uri) -> Result<Response<Body>, Error> {
    let ring = ring(app, stream_id(uri.path()))?;
    let with_history = !uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|p| p == "no-history" || p.starts_with("no-history="));
    Ok(log_stream(&ring, with_history, app))
}

/// The id after `/logs/stream`, slashes before it dropped.
fn stream_id(path: &str) -> &str {
    path.trim_start_matches("/logs/stream")
        .trim_start_matches('/')
}

/// The ring an id names: none is all logs, `proxy` and `upstream` are corral's and the engines',
/// anything else a model (percent-decoded) whose instance's log it is.
fn ring(app: &App, id: &str) -> Result<Arc<LogRing>, Error> {
    Ok(match id {
        "" => app.logs.combined.clone(),
        "proxy" => app.logs.proxy.clone(),
        "upstream" => app.logs.upstream.clone(),
        other => {
            let decoded = percent_encoding::percent_decode_str(other)
                .decode_utf8_lossy()
                .into_owned();
            let catalog = app.fleet.catalog();
            let (target, _) = catalog
                .resolve(&decoded)
                .ok_or_else(|| Error::BadRequest(format!("unknown log stream {decoded:?}")))?;
            let (Target::Instance(id) | Target::Pool(id)) = target;
            app.fleet.instance_logs(id).ok_or(Error::UnknownModel)?
        }
    })
}

fn log_stream(ring: &Arc<LogRing>, with_history: bool, app: &App) -> Response<Body> {
    let history = if with_history {
        Some(app.config.redactor.bytes(Bytes::from(ring.history())))
    } else {
        None
    };
    let live = LiveLog {
        rx: ring.subscribe(),
        replaced: app.replaced.clone(),
        redactor: app.config.redactor.clone(),
    };
    plain_stream(history.unwrap_or_default(), Some(live))
}

/// A log's new writes, with this config's secrets masked, until a reload or shutdown.
struct LiveLog {
    rx: tokio::sync::broadcast::Receiver<Bytes>,
    replaced: tokio_util::sync::CancellationToken,
    redactor: crate::config::Redactor,
}

impl LiveLog {
    /// The next write, or a note of how many were dropped while this reader lagged; none once the
    /// log closes, or the config it masks with is replaced or the server closes.
    async fn next(&mut self) -> Option<Bytes> {
        let received = tokio::select! {
            r = self.rx.recv() => r,
            _ = self.replaced.cancelled() => return None,
        };
        match received {
            Ok(data) => Some(self.redactor.bytes(data)),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                Some(Bytes::from(format!("\n--- {n} messages dropped ---\n")))
            }
            Err(_) => None,
        }
    }
}

/// A chunked text/plain body: `first`, then whatever the log brings, until the client leaves.
fn plain_stream(first: Bytes, live: Option<LiveLog>) -> Response<Body> {
    use futures_util::stream;
    let first = stream::iter((!first.is_empty()).then(|| Ok(http_body::Frame::data(first))));
    let body: Body = match live {
        None => StreamBody::new(first).boxed(),
        Some(live) => {
            let rest = stream::unfold(live, |mut live| async move {
                let data = live.next().await?;
                Some((Ok(http_body::Frame::data(data)), live))
            });
            StreamBody::new(futures_util::StreamExt::chain(first, rest)).boxed()
        }
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("x-accel-buffering", "no")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("valid")
}
