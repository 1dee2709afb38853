//! Forwarding a buffered model request: to a local instance (another pool member gets a second
//! try), or to the least loaded of the peers that serve the model.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;

use crate::config::catalog::Target;
use crate::proxy::body::{full, Body};
use crate::proxy::error::Error;
use crate::proxy::{self, Outgoing};
use crate::routing::extract::BodyKind;
use crate::routing::filters;
use crate::routing::peers;
use crate::routing::Gateway;

/// Sends a buffered request to the target's instance; for a pool, a member that fails before
/// sending a byte back, or answers 503 (loading, or overloaded), is tried once more on another,
/// and taken out when it could not be reached (or, by [`crate::fleet::Fleet::report_answer`],
/// when it keeps failing).
pub async fn forward_local(
    gateway: &Arc<Gateway>,
    model: &crate::config::ModelConfig,
    target: Target,
    parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: Cow<'static, str>,
    remote: SocketAddr,
) -> Result<Response<Body>, Error> {
    let target = &target;
    let client = &gateway.clients[&*model.id];
    let timeout = model.timeouts.response_header;
    let prompt = prompt_blocks(model, target, &bytes);
    let lease = gateway
        .fleet
        .acquire_for(target, None, prompt.as_ref())
        .await?;
    if !matches!(target, Target::Pool(_)) {
        let req = outgoing(&lease, parts, path_and_query, bytes, remote);
        return proxy::forward(client, req, timeout, lease).await;
    }
    let request = (parts, path_and_query, bytes, remote);
    // boxed: the second try's state would grow every request's future
    Box::pin(forward_to_members(
        gateway, model, target, lease, request, prompt,
    ))
    .await
}

/// A pool request on its way to a member: the request itself, kept for the second try (the first
/// gets a copy), and what that try needs.
struct MemberRequest<'a> {
    gateway: &'a Arc<Gateway>,
    model: &'a crate::config::ModelConfig,
    parts: http::request::Parts,
    path_and_query: Cow<'static, str>,
    bytes: Bytes,
    remote: SocketAddr,
}

impl MemberRequest<'_> {
    /// A copy of the request for the member `lease` holds.
    fn to(&self, lease: &crate::fleet::Lease) -> Outgoing {
        let parts = clone_parts(&self.parts);
        let (path_and_query, bytes) = (self.path_and_query.clone(), self.bytes.clone());
        outgoing(lease, parts, path_and_query, bytes, self.remote)
    }

    /// The second try, with the request itself, on the member `lease` holds, after the first
    /// (`first`) failed for `why`.
    async fn retry(
        self,
        lease: crate::fleet::Lease,
        first: &str,
        why: String,
    ) -> Result<Response<Body>, Error> {
        let MemberRequest {
            gateway,
            model,
            parts,
            path_and_query,
            bytes,
            remote,
        } = self;
        let retries = &gateway.metrics.requests.retries;
        retries.with_label_values(&[&model.id]).inc();
        tracing::warn!(instance = %first, "retrying on another replica after: {why}");
        let id = lease.id().clone();
        let out = outgoing(&lease, parts, path_and_query, bytes, remote);
        let client = &gateway.clients[&*model.id];
        let answer = proxy::forward(client, out, model.timeouts.response_header, lease).await;
        if let Ok(resp) = &answer {
            gateway.fleet.report_answer(&id, resp.status());
        }
        answer
    }
}

/// A request as it goes to the member `lease` holds.
#[inline(always)]
fn outgoing(
    lease: &crate::fleet::Lease,
    parts: http::request::Parts,
    path_and_query: Cow<'static, str>,
    bytes: Bytes,
    remote: SocketAddr,
) -> Outgoing {
    Outgoing {
        base: lease.proxy(),
        path_and_query,
        parts,
        body: full(bytes),
        client_addr: Some(remote.ip()),
    }
}

/// Sends a request to the pool member `lease` holds; one that fails before answering, or answers
/// 503, gets a second try on another member.
async fn forward_to_members(
    gateway: &Arc<Gateway>,
    model: &crate::config::ModelConfig,
    target: &Target,
    lease: crate::fleet::Lease,
    (parts, path_and_query, bytes, remote): (
        http::request::Parts,
        Cow<'static, str>,
        Bytes,
        SocketAddr,
    ),
    prompt: Option<crate::fleet::prefix::Prefix>,
) -> Result<Response<Body>, Error> {
    let request = MemberRequest {
        gateway,
        model,
        parts,
        path_and_query,
        bytes,
        remote,
    };
    let first = request.to(&lease);
    let first_id = lease.id().clone();
    let client = &gateway.clients[&*model.id];
    let sibling = || {
        gateway
            .fleet
            .acquire_for(target, Some(&first_id), prompt.as_ref())
    };
    match proxy::forward(client, first, model.timeouts.response_header, lease).await {
        Err(e @ (Error::Upstream(_) | Error::Unreachable(_))) => {
            report_failure(gateway, &first_id, &e);
            let lease = sibling().await?;
            request.retry(lease, &first_id, e.to_string()).await
        }
        Ok(resp) if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE => {
            gateway.fleet.report_answer(&first_id, resp.status());
            let read = Box::pin(read_whole(resp, &first_id));
            match unavailable_or_sibling(read, sibling()).await {
                Ok(lease) => {
                    let why = "503 Service Unavailable".into();
                    request.retry(lease, &first_id, why).await
                }
                Err(kept) => kept,
            }
        }
        Ok(resp) => {
            gateway.fleet.report_answer(&first_id, resp.status());
            Ok(resp)
        }
        other => other,
    }
}

/// After a member's 503 (loading: a replica that died and started again after it was picked; or
/// overloaded): a sibling's lease for the second try, or, when none is to be had, the 503 answer,
/// read while the sibling is looked for, which lets the member's lease go during the wait.
async fn unavailable_or_sibling(
    mut read: Pin<Box<impl Future<Output = Result<Response<Body>, Error>>>>,
    sibling: impl Future<Output = Result<crate::fleet::Lease, Error>>,
) -> Result<crate::fleet::Lease, Result<Response<Body>, Error>> {
    tokio::pin!(sibling);
    let answer = tokio::select! {
        // an answer read to its end leaves its connection for the next request
        biased;
        answer = &mut read => answer,
        lease = &mut sibling => match lease {
            // unfinished: its connection is closed, and the lease let go
            Ok(lease) => return Ok(lease),
            Err(none) => return Err(kept_or(read.await, none)),
        },
    };
    sibling.await.map_err(|none| kept_or(answer, none))
}

/// The most of a member's 503 answer kept while a sibling is awaited; an engine's is a short JSON
/// error. One longer, or slower than [`HELD_ANSWER_WITHIN`], is dropped unread, closing its
/// connection.
const HELD_ANSWER_LIMIT: usize = 64 * 1024;
/// How long the rest of a 503 answer may take to arrive once its head has.
const HELD_ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// `resp` with its body read into memory, so that the lease riding in the body is let go; an
/// answer too long or too slow to keep is an upstream error naming the member.
async fn read_whole(resp: Response<Body>, member: &str) -> Result<Response<Body>, Error> {
    let (parts, body) = resp.into_parts();
    let limited = http_body_util::Limited::new(body, HELD_ANSWER_LIMIT);
    let unreadable =
        |why: String| Error::Upstream(format!("{member} answered {} and then {why}", parts.status));
    // boxed as `Send`: the collect future's error type otherwise trips the compiler's check of
    // every caller's future for `Send`
    let collect: futures_util::future::BoxFuture<'static, _> = Box::pin(limited.collect());
    let bytes = match tokio::time::timeout(HELD_ANSWER_WITHIN, collect).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => return Err(unreadable(format!("its body failed: {e}"))),
        Err(_) => {
            let within = HELD_ANSWER_WITHIN.as_secs();
            return Err(unreadable(format!("its body did not end within {within}s")));
        }
    };
    Ok(Response::from_parts(parts, full(bytes)))
}

/// The member's kept 503 answer when no sibling could take the request; when that answer could
/// not be kept either, why no sibling could (a busy pool's 503 with `Retry-After`, say).
fn kept_or(answer: Result<Response<Body>, Error>, none: Error) -> Result<Response<Body>, Error> {
    answer.map_err(|unkept| {
        tracing::warn!("{unkept}");
        none
    })
}

/// A pool member that gave no answer: taken out when it could not be reached. One that took the
/// connection and closed it without an answer (llama-server does so now and then under load) is
/// not a dead replica, but a failure that counts towards taking it out when it keeps happening.
fn report_failure(gateway: &Gateway, id: &str, error: &Error) {
    if matches!(error, Error::Unreachable(_)) {
        gateway.fleet.report_unreachable(id);
    } else {
        gateway
            .fleet
            .report_answer(id, http::StatusCode::BAD_GATEWAY);
    }
}

/// The prompt's chained block hashes, for a pool that balances by prefix: the JSON text of a chat
/// body's `messages` or a completion's `prompt`, read without parsing the rest of the body.
fn prompt_blocks(
    model: &crate::config::ModelConfig,
    target: &Target,
    bytes: &[u8],
) -> Option<crate::fleet::prefix::Prefix> {
    if !matches!(target, Target::Pool(_)) || model.pool.balance != crate::config::Balance::Prefix {
        return None;
    }
    let body = filters::JsonBody::parse(bytes).ok()?;
    let text = body.raw("messages").or_else(|| body.raw("prompt"))?;
    Some(crate::fleet::prefix::Prefix::of(text.as_bytes()))
}

/// Tries the peers that serve `model`, least loaded first: one that fails before answering (it
/// could not be reached, or broke before its response head) is held out, and the next one gets the
/// request, since nothing has reached the client yet.
pub async fn forward_to_least_loaded(
    gateway: &Arc<Gateway>,
    ranked: &[String],
    model: &str,
    (parts, kind, bytes, path_and_query, remote): (
        http::request::Parts,
        BodyKind,
        Bytes,
        String,
        SocketAddr,
    ),
) -> Result<Response<Body>, Error> {
    let mut last = Error::UnknownModel;
    for peer in ranked {
        let body = rewrite_for_peer(gateway, peer, model, kind.clone(), bytes.clone())?;
        let parts = clone_parts(&parts);
        let sending = gateway.peer_loads.sending(peer, model);
        match peers::forward(gateway, peer, parts, body, path_and_query.clone(), remote).await {
            Err(Error::Upstream(e)) => {
                tracing::warn!(peer = %peer, "trying another peer for {model} after: {e}");
                gateway.peer_loads.failed(peer);
                last = Error::Upstream(e);
            }
            // the request counts as the peer's work until its answer's body ends
            Ok(answer) => {
                return Ok(answer.map(|body| BodyExt::boxed(proxy::GuardedBody::new(body, sending))))
            }
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// A peer gets the bare model id and its own filters.
pub fn rewrite_for_peer(
    gateway: &Gateway,
    peer: &str,
    model: &str,
    kind: BodyKind,
    bytes: Bytes,
) -> Result<Bytes, Error> {
    let BodyKind::Json { .. } = kind else {
        return Ok(bytes);
    };
    let mut body = filters::JsonBody::parse(&bytes).map_err(Error::BadRequest)?;
    body.set("model", &serde_json::Value::String(model.to_string()));
    filters::apply_filters(&mut body, &gateway.config.peers[peer].filters, None);
    Ok(body.to_bytes())
}

/// A copy of a request's head, for a second try of a request already handed to the first.
pub fn clone_parts(parts: &http::request::Parts) -> http::request::Parts {
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version);
    if let Some(h) = req.headers_mut() {
        *h = parts.headers.clone();
    }
    req.body(())
        .expect("copied from a valid request")
        .into_parts()
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: Body) -> Response<Body> {
        Response::builder().status(503).body(body).unwrap()
    }

    #[tokio::test]
    async fn a_short_answer_is_kept_whole() {
        let kept = read_whole(answer(full("Loading model")), "chat-0")
            .await
            .unwrap();
        assert_eq!(kept.status(), 503);
        let body = kept.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "Loading model");
    }

    /// What rides in the body (a member's lease, in a pool) is let go once the answer is kept.
    #[tokio::test]
    async fn what_rides_in_the_body_is_let_go() {
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guarded = proxy::GuardedBody::new(full("Loading model"), Flag(dropped.clone()));
        let kept = read_whole(answer(guarded.boxed()), "chat-0").await.unwrap();
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        let body = kept.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "Loading model");
    }

    /// An answer that could not be kept gives way to why no sibling could take the request.
    #[test]
    fn an_unkept_answer_gives_way_to_a_busy_pool() {
        let busy = || Error::Busy {
            status: 503,
            message: "no replica of chat had a free slot within 1s".into(),
            retry_after: 1,
        };
        let unkept = Err(Error::Upstream("chat-0 answered 503 and then ...".into()));
        let answer = kept_or(unkept, busy());
        assert!(matches!(answer, Err(Error::Busy { status: 503, .. })));
        let kept = kept_or(Ok(answer_of(503)), busy()).unwrap();
        assert_eq!(kept.status(), 503);
    }

    fn answer_of(status: u16) -> Response<Body> {
        Response::builder().status(status).body(full("")).unwrap()
    }

    #[tokio::test]
    async fn an_answer_too_long_to_keep_names_the_member() {
        let long = vec![b'x'; HELD_ANSWER_LIMIT + 1];
        let err = read_whole(answer(full(long)), "chat-0").await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("chat-0 answered 503"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_never_ends_is_given_up() {
        let endless = http_body_util::StreamBody::new(futures_util::stream::pending::<
            Result<http_body::Frame<Bytes>, crate::proxy::body::BoxError>,
        >());
        let err = read_whole(answer(endless.boxed()), "chat-0")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("did not end within 10s"), "{text}");
    }
}
