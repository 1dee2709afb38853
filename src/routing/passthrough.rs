//! `/upstream/<model>/<path>`: any request passed to a model's own server (or a peer's) as sent,
//! body streamed, websockets upgraded, so the engine's own pages and APIs can be reached.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use crate::config::catalog::Target;
use crate::config::ModelConfig;
use crate::proxy::body::redirect;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;
use crate::proxy::{self, Outgoing};
use crate::routing::names;
use crate::routing::peers;
use crate::routing::seen::Seen;
use crate::routing::Gateway;

/// `/upstream/<model>/<path>`: the longest prefix that names a model wins; the rest goes upstream as
/// it was sent, percent-encoding included, with the request body streamed. What comes back is
/// sandboxed ([`SANDBOX`]).
pub async fn upstream_passthrough<B>(
    gateway: &Arc<Gateway>,
    req: Request<B>,
    rest: String,
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let mut resp = pass(gateway, req, rest, remote, seen).await?;
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX),
    );
    Ok(resp)
}

/// The policy of every page an engine or peer serves under `/upstream/`: a sandbox without
/// `allow-same-origin`, so that its scripts run in an origin of their own and cannot read the
/// storage of corral's origin (the dashboard keeps its key there) nor call corral's API with the
/// browser's credentials.
const SANDBOX: &str = "sandbox allow-scripts allow-forms allow-popups allow-downloads allow-modals";

/// The engine paths an inference key may reach through `/upstream/`: read-only, and holding no
/// prompt or answer (`/slots`, for one, shows every slot's conversation).
const ENGINE_READS: &[&str] = &["/health", "/props", "/models", "/v1/models", "/metrics"];

fn engine_read(method: &Method, tail: &str) -> bool {
    matches!(*method, Method::GET | Method::HEAD) && ENGINE_READS.contains(&tail)
}

/// `.` or `..`, percent-encoded or not: a gateway that normalizes the path would take it out of
/// the model's (or peer's) base path.
fn dot_segment(segment: &str) -> bool {
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    matches!(&*decoded, "." | "..")
}

async fn pass<B>(
    gateway: &Arc<Gateway>,
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
    if segments.iter().any(|s| dot_segment(s)) {
        return Err(Error::BadRequest(
            "/upstream/ paths may not hold `.` or `..` segments".into(),
        ));
    }
    let (route, n, name) = longest_model_prefix(gateway, &segments).ok_or(Error::UnknownModel)?;
    seen.named(&name);
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (peer, model) = match route {
        names::Route::Local { target, model } => {
            return to_model(
                gateway,
                req,
                (target, model),
                (&segments, n, &query),
                remote,
                seen,
            )
            .await
        }
        names::Route::Peer { peer, model } => (peer, model),
        // a streamed body cannot be sent twice: the least loaded peer gets it, no retry
        names::Route::Peers { owners, model } => {
            let peer = gateway.peer_loads.rank(&owners, &model).swap_remove(0);
            // counted as in flight to that peer until the answer ends, as a model route's is
            seen.hold(Box::new(gateway.peer_loads.sending(&peer, &model)));
            (peer, model)
        }
    };
    to_peer(
        gateway,
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
    gateway: &Arc<Gateway>,
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
    seen.may_use(|| model_id.to_string())?;
    seen.found(gateway, model_id.clone());
    if n == segments.len() {
        return Ok(slash_redirect(req.method(), &segments.join("/"), query));
    }
    let tail = format!("/{}", segments[n..].join("/"));
    if !engine_read(req.method(), &tail) {
        seen.needs_admin(&format!("{} {tail} on an engine", req.method()))?;
    }
    if gateway
        .config
        .ignore_paths
        .iter()
        .any(|re| re.is_match(&tail))
        && !gateway.fleet.is_ready(&target)
    {
        return Err(Error::Conflict(format!(
            "{model_id} is not loaded and {tail} does not load it"
        )));
    }
    let model = gateway
        .config
        .models
        .get(&*model_id)
        .ok_or(Error::UnknownModel)?;
    let path = format!("{tail}{query}");
    if proxy::is_upgrade(req.headers()) {
        return upgrade(gateway, model, &target, &path, req).await;
    }
    to_local(gateway, model, &target, &path, req, remote).await
}

/// The longest run of leading segments that names a model, alias or peer model, after the active
/// profile's pins, how many segments it took, and the name.
fn longest_model_prefix(
    gateway: &Gateway,
    segments: &[&str],
) -> Option<(names::Route, usize, String)> {
    let catalog = gateway.fleet.catalog();
    let reach = within_reach(segments, names::longest_name(&gateway.config, &catalog));
    (1..=reach).rev().find_map(|n| {
        let raw = segments[..n].join("/");
        let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8_lossy();
        let name = names::apply_profile(&gateway.config, &gateway.profiles, &decoded)?;
        names::resolve_plain(&gateway.config, &catalog, &name)
            .ok()
            .map(|route| (route, n, name.to_string()))
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
    gateway: &Arc<Gateway>,
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
    seen.may_use(|| format!("{peer}/{model}"))?;
    seen.found(gateway, format!("{peer}/{model}").into());
    seen.needs_admin("passing a request through to a peer")?;
    if n == segments.len() {
        return Ok(slash_redirect(req.method(), &segments.join("/"), query));
    }
    let tail = format!("/{}{query}", segments[n..].join("/"));
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    peers::forward_body(gateway, peer, parts, body, &tail, remote).await
}

/// A websocket upgrade to a local model, loading it first unless the model's websockets are set
/// to reach it only while it is up.
async fn upgrade<B>(
    gateway: &Gateway,
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
    let client = &gateway.clients[&*model.id];
    // the engine's 101 is waited for as an ordinary answer's head is
    let limit = model.timeouts.response_header;
    if model.ignore_websockets {
        // these never load, queue or count: they reach the model only while it is up
        let Some(base) = gateway.fleet.ready_proxy(target) else {
            return Err(Error::Conflict(format!(
                "{} is not loaded; websockets do not load it",
                model.id
            )));
        };
        return proxy::forward_upgrade(client, &base, path, req, limit, ()).await;
    }
    let lease = gateway.fleet.acquire(target, None).await?;
    let base = lease.proxy();
    proxy::forward_upgrade(client, &base, path, req, limit, lease).await
}

/// Forwards the request, body streamed, to an instance of the local model once it is up.
async fn to_local<B>(
    gateway: &Gateway,
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
    let lease = gateway.fleet.acquire(target, None).await?;
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    let out = Outgoing {
        base: lease.proxy(),
        path_and_query: path_and_query.to_string().into(),
        parts,
        body,
        client_addr: Some(remote.ip()),
    };
    let client = &gateway.clients[&*model.id];
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
    use super::{dot_segment, engine_read, within_reach};
    use http::Method;

    #[test]
    fn dot_segments_are_found_encoded_or_not() {
        for dot in [".", "..", "%2e", "%2E%2e", ".%2E"] {
            assert!(dot_segment(dot), "{dot}");
        }
        for plain in ["...", "a.", ".a", "", "%2f", "v1"] {
            assert!(!dot_segment(plain), "{plain}");
        }
    }

    #[test]
    fn only_prompt_free_reads_are_engine_reads() {
        for path in ["/health", "/props", "/models", "/v1/models", "/metrics"] {
            assert!(engine_read(&Method::GET, path), "{path}");
            assert!(engine_read(&Method::HEAD, path), "{path}");
        }
        assert!(!engine_read(&Method::POST, "/props"));
        for path in [
            "/slots",
            "/slots/0",
            "/api/delete",
            "/v1/chat/completions",
            "/health/",
            "//health",
            "/",
        ] {
            assert!(!engine_read(&Method::GET, path), "{path}");
        }
    }

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
