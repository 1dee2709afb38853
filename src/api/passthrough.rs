//! `/upstream/<model>/<path>`: any request passed to a model's own server (or a peer's) as sent,
//! body streamed, websockets upgraded, so the engine's own pages and APIs can be reached.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::seen::Seen;
use super::{peers, redirect, routing, App};
use crate::body::{Body, BoxError};
use crate::catalog::Target;
use crate::config::ModelConfig;
use crate::error::Error;
use crate::proxy::{self, Outgoing};

/// `/upstream/<model>/<path>`: the longest prefix that names a model wins; the rest goes upstream as
/// it was sent, percent-encoding included, with the request body streamed.
pub async fn upstream_passthrough<B>(
    app: &Arc<App>,
    req: Request<B>,
    rest: String,
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let segments: Vec<&str> = rest.split('/').collect();
    let (route, n) = longest_model_prefix(app, &segments).ok_or(Error::UnknownModel)?;
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (peer, model) = match route {
        routing::Route::Local { target, model } => {
            return to_model(
                app,
                req,
                (target, model),
                (&segments, n, &query),
                remote,
                seen,
            )
            .await
        }
        routing::Route::Peer { peer, model } => (peer, model),
        // a streamed body cannot be sent twice: the least loaded peer gets it, no retry
        routing::Route::Peers { owners, model } => {
            (app.peer_loads.rank(&owners, &model).swap_remove(0), model)
        }
    };
    to_peer(
        app,
        req,
        (&peer, &model),
        (&segments, n, &query),
        remote,
        seen,
    )
    .await
}

/// Passes the request to a local model's instance, loading it first unless the path is one that
/// must not load it.
async fn to_model<B>(
    app: &Arc<App>,
    req: Request<B>,
    (target, model_id): (Target, Arc<str>),
    (segments, n, query): (&[&str], usize, &str),
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    seen.found(app, model_id.clone());
    if n == segments.len() {
        return Ok(slash_redirect(req.method(), &segments.join("/"), query));
    }
    let tail = format!("/{}", segments[n..].join("/"));
    if app.config.ignore_paths.iter().any(|re| re.is_match(&tail)) && !app.fleet.is_ready(&target) {
        return Err(Error::Conflict(format!(
            "{model_id} is not loaded and {tail} does not load it"
        )));
    }
    let model = app
        .config
        .models
        .get(&*model_id)
        .ok_or(Error::UnknownModel)?;
    let path = format!("{tail}{query}");
    if proxy::is_upgrade(req.headers()) {
        return upgrade(app, model, &target, &path, req).await;
    }
    to_local(app, model, &target, &path, req, remote).await
}

/// The longest run of leading segments that names a model, alias or peer model, after the active
/// profile's pins, and how many segments it took.
fn longest_model_prefix(app: &App, segments: &[&str]) -> Option<(routing::Route, usize)> {
    let catalog = app.fleet.catalog();
    let reach = within_reach(segments, routing::longest_name(&app.config, &catalog));
    (1..=reach).rev().find_map(|n| {
        let raw = segments[..n].join("/");
        let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8_lossy();
        let name = routing::apply_profile(&app.config, &app.profiles, &decoded)?;
        routing::resolve_plain(&app.config, &catalog, &name)
            .ok()
            .map(|route| (route, n))
    })
}

/// How many leading segments a name of at most `longest` bytes could span: those whose joined
/// text is at most three times as long (`%XX` decodes to one byte). Trying every prefix of a path
/// of a few thousand segments would cost its length squared, from a request that needs no key.
fn within_reach(segments: &[&str], longest: usize) -> usize {
    let mut joined = 0;
    let fits = |s: &&&str| {
        joined += s.len() + 1;
        joined <= 3 * longest + 1
    };
    segments.iter().take_while(fits).count()
}

/// Passes the request to the peer that serves the model, the path after the model as sent.
async fn to_peer<B>(
    app: &Arc<App>,
    req: Request<B>,
    (peer, model): (&str, &str),
    (segments, n, query): (&[&str], usize, &str),
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    seen.found(app, format!("{peer}/{model}").into());
    if n == segments.len() {
        return Ok(slash_redirect(req.method(), &segments.join("/"), query));
    }
    let tail = format!("/{}{query}", segments[n..].join("/"));
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    peers::forward_body(app, peer, parts, body, &tail, remote).await
}

/// A websocket upgrade to a local model, loading it first unless the model's websockets are set
/// to reach it only while it is up.
async fn upgrade<B>(
    app: &App,
    model: &ModelConfig,
    target: &Target,
    path: &str,
    req: Request<B>,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let req = req.map(|b| b.map_err(Into::into).boxed());
    let client = &app.clients[&*model.id];
    // the engine's 101 is waited for as an ordinary answer's head is
    let limit = model.timeouts.response_header;
    if model.ignore_websockets {
        // these never load, queue or count: they reach the model only while it is up
        let Some(base) = app.fleet.ready_proxy(target) else {
            return Err(Error::Conflict(format!(
                "{} is not loaded; websockets do not load it",
                model.id
            )));
        };
        return proxy::forward_upgrade(client, &base, path, req, limit, ()).await;
    }
    let lease = app.fleet.acquire(target, None).await?;
    let base = lease.proxy();
    proxy::forward_upgrade(client, &base, path, req, limit, lease).await
}

/// Forwards the request, body streamed, to an instance of the local model once it is up.
async fn to_local<B>(
    app: &App,
    model: &ModelConfig,
    target: &Target,
    path_and_query: &str,
    req: Request<B>,
    remote: SocketAddr,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let lease = app.fleet.acquire(target, None).await?;
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    let out = Outgoing {
        base: lease.proxy(),
        path_and_query: path_and_query.to_string().into(),
        parts,
        body,
        client_addr: Some(remote.ip()),
    };
    let client = &app.clients[&*model.id];
    proxy::forward(client, out, model.timeouts.response_header, lease).await
}

/// `/upstream/<model>` without the trailing slash: 301 for GET and HEAD, 308 otherwise.
fn slash_redirect(method: &Method, rest: &str, query: &str) -> Response<Body> {
    let status = if matches!(*method, Method::GET | Method::HEAD) {
        StatusCode::MOVED_PERMANENTLY
    } else {
        StatusCode::PERMANENT_REDIRECT
    };
    redirect(status, &format!("/upstream/{rest}/{query}"))
}

#[cfg(test)]
mod tests {
    use super::within_reach;

    #[test]
    fn only_prefixes_a_name_could_span_are_tried() {
        let path = ["org", "model", "v1", "chat", "completions"];
        assert_eq!(
            within_reach(&path, 3),
            2,
            "'org/model': 9 bytes, 3 of them %XX"
        );
        assert_eq!(within_reach(&path, 2), 1);
        assert_eq!(within_reach(&path, 6), 4, "'org/model/v1/chat': 18 bytes");
        assert_eq!(within_reach(&path, 1000), path.len());
        let slashes = vec![""; 60_000];
        assert_eq!(within_reach(&slashes, 20), 61);
    }
}
