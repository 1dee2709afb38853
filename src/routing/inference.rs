//! The model routes: requests whose body (or query) names the model. Each finds its model, starts
//! it or waits for it, rewrites the body where asked, and forwards it to the instance or peer.

use std::borrow::Cow;
use std::future::{ready, Future, Ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::{FutureExt, TryFutureExt};
use http::{header, HeaderValue, Method, Request, Response};

use crate::config::catalog::Target;
use crate::config::ModelConfig;
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::budget;
use crate::routing::extract::{self, BodyKind};
use crate::routing::filters;
use crate::routing::forward::{forward_local, forward_to_least_loaded, rewrite_for_peer};
use crate::routing::loading;
use crate::routing::names;
use crate::routing::peers;
use crate::routing::seen::Seen;
use crate::routing::Gateway;

/// POST routes whose JSON (or form) body names the model: the route, and the path sent upstream.
pub fn model_route(path: &str) -> Option<(&'static str, &'static str)> {
    const DIRECT: &[&str] = &[
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/reranking",
        "/rerank",
        "/v1/rerank",
        "/v1/reranking",
        "/infill",
        "/completion",
        "/v1/audio/speech",
        "/v1/audio/voices",
        "/v1/images/generations",
        "/sdapi/v1/txt2img",
        "/sdapi/v1/img2img",
        "/v1/audio/transcriptions",
        "/v1/images/edits",
    ];
    const VERSIONLESS: &[&str] = &[
        "/v/chat/completions",
        "/v/responses",
        "/v/completions",
        "/v/messages",
        "/v/messages/count_tokens",
        "/v/embeddings",
        "/v/rerank",
        "/v/reranking",
    ];
    const AUDIOAPI: &str = "/audioapi/v1/tasks/run";
    if let Some(direct) = DIRECT.iter().find(|p| **p == path) {
        Some((direct, direct))
    } else if let Some(versionless) = VERSIONLESS.iter().find(|p| **p == path) {
        Some((versionless, &versionless[2..]))
    } else if path == AUDIOAPI {
        Some((AUDIOAPI, "/v1/tasks/run"))
    } else {
        None
    }
}

/// GET routes that name the model in the query: the route, sent upstream as it is.
pub fn query_route(path: &str) -> Option<&'static str> {
    const QUERY: &[&str] = &["/v1/audio/voices", "/sdapi/v1/loras", "/props"];
    QUERY.iter().find(|p| **p == path).copied()
}

/// A model request as read: its head, and for a body-carrying request the buffered body, what kind
/// it is and the model it names.
struct Incoming {
    parts: http::request::Parts,
    query: Option<String>,
    get: bool,
    /// The model the client named, before profiles and selectors.
    sent: Option<String>,
    /// The body's length as the request's `content-length` says.
    declared: Option<u64>,
    bytes: Bytes,
    kind: BodyKind,
    streaming: bool,
    /// Charged to the body budget while this request holds the bytes (to its answer's head).
    charge: budget::Charge,
}

impl Incoming {
    /// The request's head and, unless it is a GET, its whole body. Not an `async fn` (see
    /// [`crate::proxy::forward`]): the future holds the body's reading and the head alone.
    fn read<'a, B>(
        gateway: &'a Gateway,
        req: Request<B>,
    ) -> impl Future<Output = Result<Incoming, Error>> + Send + 'a
    where
        B: http_body::Body<Data = Bytes> + Send + 'a,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let (parts, body) = req.into_parts();
        let query = parts.uri.query().map(String::from);
        let get = parts.method == Method::GET || parts.method == Method::HEAD;
        let mut incoming = Incoming {
            parts,
            query,
            get,
            sent: None,
            declared: None,
            bytes: Bytes::new(),
            kind: BodyKind::Other,
            streaming: false,
            charge: budget::Charge::none(),
        };
        if get {
            incoming.sent = incoming
                .query
                .as_deref()
                .and_then(|q| extract::query_param(q, "model"));
            return Either::Left(ready(Ok(incoming)));
        }
        incoming.declared = extract::declared_length(&incoming.parts.headers);
        let declared = incoming.declared;
        let read = extract::read_body(declared, body, gateway.limits.body_bytes, &gateway.budget);
        Either::Right(read.map_ok(move |(bytes, held)| {
            incoming.kind = extract::classify(&incoming.parts.headers, &bytes);
            (incoming.sent, incoming.streaming) =
                extract::model_from_body(&mut incoming.kind, &bytes);
            (incoming.bytes, incoming.charge) = (bytes, held);
            incoming
        }))
    }
}

/// Finds the model, starts or waits for it, rewrites the body if asked, forwards and streams back.
///
/// Not an `async fn` (see [`crate::proxy::forward`]): the body is read, then [`route`] decides
/// where the request goes and gives the future that takes it there.
pub fn dispatch<'a, B>(
    gateway: &'a Arc<Gateway>,
    req: Request<B>,
    upstream_path: &'static str,
    remote: SocketAddr,
    seen: &'a mut Seen,
) -> impl Future<Output = Result<Response<Body>, Error>> + Send + 'a
where
    B: http_body::Body<Data = Bytes> + Send + 'a,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    Incoming::read(gateway, req).and_then(move |incoming| {
        if let Some(capture) = &mut seen.capture {
            capture.request_body(&incoming.bytes);
        }
        match route(gateway, incoming, upstream_path, remote, seen) {
            Ok(forwarding) => forwarding,
            Err(e) => Either::Left(Either::Left(ready(Err(e)))),
        }
    })
}

/// Where a read request goes, and the future that forwards it there: to a local model's instance
/// or the loading stream, or to peers (boxed: their futures are larger, and kept out of every
/// local request's). Kept out of line, with [`dispatch_local`] inlined into it, so that the
/// local forwarding future is built in the slot this returns rather than built and then moved.
#[inline(never)]
fn route<'a>(
    gateway: &'a Arc<Gateway>,
    mut incoming: Incoming,
    upstream_path: &'static str,
    remote: SocketAddr,
    seen: &mut Seen,
) -> Result<Forwarding<'a, impl Future<Output = Result<Response<Body>, Error>> + Send + 'a>, Error>
{
    let sent = incoming.sent.take().filter(|n| !n.is_empty());
    let sent = sent.ok_or(Error::NoModel)?;
    let (name, route) = resolve_name(gateway, &sent, seen)?;
    let selected = selected_target(gateway, &route, &name);
    let chosen = selected.as_deref().unwrap_or(&name);
    let path_and_query: Cow<'static, str> = match &incoming.query {
        Some(q) => format!("{upstream_path}?{q}").into(),
        None => upstream_path.into(),
    };
    // asked before the match, whose arms build the forwarding future in place (a peer pool's
    // member is known once ranked)
    match &route {
        names::Route::Peer { peer, model } => seen.may_use(|| format!("{peer}/{model}"))?,
        names::Route::Local { model, .. } => seen.may_use(|| model.to_string())?,
        names::Route::Peers { .. } => {}
    }
    if let (Some(q), names::Route::Local { target, model }) = (&incoming.query, &route) {
        refuse_unloaded(&gateway.fleet, q, target, model)?; // `?autoload=false`
    }
    Ok(match route {
        names::Route::Local { target, model } => {
            let model = gateway
                .config
                .models
                .get(&*model)
                .ok_or(Error::UnknownModel)?;
            seen.found(gateway, model.id.clone());
            let to = Local {
                model,
                target,
                renamed: chosen != sent,
                chosen,
                path_and_query,
                remote,
            };
            Either::Left(Either::Right(dispatch_local(gateway, incoming, to, seen)))
        }
        names::Route::Peer { peer, model } => {
            let to = (peer, model, path_and_query.into_owned(), remote);
            Either::Right(to_peer(gateway, incoming, to, seen)?)
        }
        names::Route::Peers { owners, model } => {
            let to = (owners, model, path_and_query.into_owned(), remote);
            Either::Right(to_least_loaded(gateway, incoming, to, seen)?)
        }
    })
}

/// The name a request sent, after the active profile, and where it routes; a selector's choice
/// holds its spillover place with the request.
fn resolve_name<'s>(
    gateway: &Gateway,
    sent: &'s str,
    seen: &mut Seen,
) -> Result<(Cow<'s, str>, names::Route), Error> {
    let name = names::apply_profile(&gateway.config, &gateway.profiles, sent)
        .filter(|n| !n.is_empty())
        .ok_or(Error::NoModel)?;
    seen.named(&name);
    let (route, spill) = names::resolve(
        &gateway.config,
        &gateway.catalog,
        &gateway.fleet,
        &gateway.spillover,
        &name,
    )?;
    if let Some(s) = spill {
        seen.hold(Box::new(s));
    }
    Ok((name, route))
}

/// A peer's work, boxed: peers' futures are larger, and kept out of every local request's.
type PeerWork<'a> = Pin<Box<dyn Future<Output = Result<Response<Body>, Error>> + Send + 'a>>;

/// The request on its way to the peer named.
fn to_peer<'a>(
    gateway: &'a Arc<Gateway>,
    incoming: Incoming,
    (peer, model, path_and_query, remote): (String, String, String, SocketAddr),
    seen: &mut Seen,
) -> Result<PeerWork<'a>, Error> {
    seen.found(gateway, format!("{peer}/{model}").into());
    let bytes = rewrite_for_peer(gateway, &peer, &model, incoming.kind, incoming.bytes)?;
    let (parts, charge) = (incoming.parts, incoming.charge);
    Ok(Box::pin(async move {
        let answer = peers::forward(gateway, &peer, parts, bytes, path_and_query, remote).await;
        drop(charge); // the body is charged until the answer's head, as a local one is
        answer
    }))
}

/// The request on its way to the least loaded of the peers that serve the model; the key must
/// reach the first of them.
fn to_least_loaded<'a>(
    gateway: &'a Arc<Gateway>,
    incoming: Incoming,
    (owners, model, path_and_query, remote): (Vec<String>, String, String, SocketAddr),
    seen: &mut Seen,
) -> Result<PeerWork<'a>, Error> {
    let ranked = gateway.peer_loads.rank(&owners, &model);
    seen.may_use(|| format!("{}/{model}", ranked[0]))?;
    seen.found(gateway, format!("{}/{model}", ranked[0]).into());
    let Incoming {
        parts,
        kind,
        bytes,
        charge,
        ..
    } = incoming;
    let request = (parts, kind, bytes, path_and_query, remote);
    Ok(Box::pin(async move {
        let answer = forward_to_least_loaded(gateway, &ranked, &model, request).await;
        drop(charge);
        answer
    }))
}

/// The future [`route`] gives: an answer at once, the local one, or a peer's.
type Forwarding<'a, L> = Either<Either<Ready<Result<Response<Body>, Error>>, L>, PeerWork<'a>>;

/// The target a selector chose, whose id the request goes on with, since it names that target
/// from here on; `None` for any other name, which stays.
fn selected_target(gateway: &Gateway, route: &names::Route, name: &str) -> Option<Arc<str>> {
    match route {
        names::Route::Local {
            target: Target::Instance(id) | Target::Pool(id),
            ..
        } if gateway.config.selectors.contains_key(name) => Some(id.clone()),
        _ => None,
    }
}

/// Where a request for a local model goes.
struct Local<'m, 'c> {
    model: &'m ModelConfig,
    target: Target,
    /// The name after profiles and selectors: filters are matched against it.
    chosen: &'c str,
    /// Whether `chosen` differs from what the client sent, so the body must name it instead.
    renamed: bool,
    path_and_query: Cow<'static, str>,
    remote: SocketAddr,
}

/// Rewrites the body for a local model and forwards it; a chat stream that asked to see the
/// model load gets the loading stream while the target is not yet ready.
///
/// Not an `async fn`: everything before forwarding is done here, so the future returned holds
/// the forwarding and the body's charge alone (see [`crate::proxy::forward`]).
#[inline(always)]
fn dispatch_local<'a>(
    gateway: &'a Arc<Gateway>,
    incoming: Incoming,
    to: Local<'a, '_>,
    seen: &mut Seen,
) -> impl Future<Output = Result<Response<Body>, Error>> + Send + 'a {
    let Incoming {
        mut parts,
        get,
        declared,
        bytes,
        kind,
        streaming,
        charge,
        ..
    } = incoming;
    let model = to.model;
    let bytes = match rewrite_local_body(model, to.chosen, to.renamed, kind, bytes) {
        Ok(bytes) => bytes,
        Err(e) => return Either::Right(ready(Err(e))),
    };
    if get {
        // its body, if it had one, was not read and does not go on
        parts.headers.remove(header::CONTENT_LENGTH);
    } else {
        declare_length(&mut parts.headers, declared, bytes.len());
    }
    let path_and_query = to.path_and_query;
    let loading_state =
        model.send_loading_state && streaming && path_and_query.starts_with("/v1/chat/completions");
    if loading_state && !gateway.fleet.is_ready(&to.target) {
        seen.hold(Box::new(charge)); // the loading stream holds the body until it sends it
        let (id, target, remote) = (model.id.to_string(), to.target, to.remote);
        let stream = loading::stream(
            gateway.clone(),
            id,
            target,
            parts,
            bytes,
            path_and_query,
            remote,
        );
        return Either::Right(ready(Ok(stream)));
    }
    let forwarded = forward_local(
        gateway,
        model,
        to.target,
        parts,
        bytes,
        path_and_query,
        to.remote,
    );
    // the body is charged until the answer's head
    Either::Left(forwarded.map(move |answer| {
        drop(charge);
        answer
    }))
}

/// Sets `content-length` to the body's length, unless it already says so (`declared`, read from
/// these headers as the body came; a body sent as it came): a new value is an allocation.
fn declare_length(headers: &mut http::HeaderMap, declared: Option<u64>, len: usize) {
    if declared != Some(len as u64) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// A JSON body names the chosen model where it was renamed, and gets the model's filters; a form
/// gets the model's upstream name. Anything else, or a body nothing changes, goes as sent.
fn rewrite_local_body(
    model: &ModelConfig,
    chosen: &str,
    renamed: bool,
    kind: BodyKind,
    bytes: Bytes,
) -> Result<Bytes, Error> {
    Ok(match kind {
        BodyKind::Json { .. } if renamed || filters::may_apply(model, chosen) => {
            let mut body = filters::JsonBody::parse(&bytes).map_err(Error::BadRequest)?;
            if renamed {
                body.set("model", &serde_json::Value::String(chosen.to_string()));
            }
            let changed = filters::apply(model, chosen, &mut body) || renamed;
            let rewritten = changed.then(|| body.to_bytes());
            drop(body);
            rewritten.unwrap_or(bytes)
        }
        BodyKind::Multipart(boundary) => match &model.use_model_name {
            Some(upstream_name) => {
                extract::rewrite_multipart_model(&bytes, &boundary, upstream_name).unwrap_or(bytes)
            }
            None => bytes,
        },
        _ => bytes,
    })
}

/// `autoload=false` (or `0`) in a model request's query: it may not start a model that does not
/// run. The router refuses with 400 "model is not loaded"; this names the model and how to load it.
fn refuse_unloaded(
    fleet: &crate::fleet::Fleet,
    query: &str,
    target: &Target,
    model: &str,
) -> Result<(), Error> {
    let autoload = crate::routing::extract::query_param(query, "autoload");
    if !matches!(autoload.as_deref(), Some("false" | "0")) || fleet.is_ready(target) {
        return Ok(());
    }
    Err(Error::BadRequest(format!(
        "model is not loaded: {model:?} does not run and autoload=false was asked; load it with \
         POST /models/load {{\"model\": {model:?}}} or send the request without autoload=false"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_is_declared_as_the_body_goes() {
        let length = |h: &http::HeaderMap| h[header::CONTENT_LENGTH].to_str().unwrap().to_string();
        let mut headers = http::HeaderMap::new();
        declare_length(&mut headers, None, 12);
        assert_eq!(length(&headers), "12", "added when missing");
        declare_length(&mut headers, Some(12), 7);
        assert_eq!(length(&headers), "7", "replaced when the body changed");
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static(" 7"));
        let unreadable = extract::declared_length(&headers);
        declare_length(&mut headers, unreadable, 7);
        assert_eq!(length(&headers), "7", "an unreadable value is replaced");
        let kept = HeaderValue::from_static("7");
        headers.insert(header::CONTENT_LENGTH, kept.clone());
        declare_length(&mut headers, Some(7), 7);
        assert!(
            std::ptr::eq(headers[header::CONTENT_LENGTH].as_bytes(), kept.as_bytes()),
            "a length already right is kept as it came"
        );
    }
}
