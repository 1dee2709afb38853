//! Forwarding a buffered model request: to a local instance (another pool member gets a second
//! try), or to the least loaded of the peers that serve the model.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};

use super::extract::BodyKind;
use super::{filters, peers, App};
use crate::body::{full, Body};
use crate::catalog::Target;
use crate::error::Error;
use crate::proxy::{self, Outgoing};

/// Sends a buffered request to the target's instance; for a pool, a member that fails before
/// sending a byte back, or answers 503 (loading, or overloaded), is tried once more on another,
/// and taken out when it could not be reached (or, by [`crate::fleet::Fleet::report_answer`],
/// when it keeps failing).
pub async fn forward_local(
    app: &Arc<App>,
    model: &crate::config::ModelConfig,
    target: Target,
    parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: Cow<'static, str>,
    remote: SocketAddr,
) -> Result<Response<Body>, Error> {
    let target = &target;
    let client = &app.clients[&*model.id];
    let timeout = model.timeouts.response_header;
    let prompt = prompt_blocks(model, target, &bytes);
    let lease = app.fleet.acquire_for(target, None, prompt.as_ref()).await?;
    if !matches!(target, Target::Pool(_)) {
        let req = Outgoing {
            base: lease.proxy(),
            path_and_query,
            parts,
            body: full(bytes),
            client_addr: Some(remote.ip()),
        };
        return proxy::forward(client, req, timeout, lease).await;
    }
    let request = (parts, path_and_query, bytes, remote);
    // boxed: the second try's state would grow every request's future
    Box::pin(forward_to_members(
        app, model, target, lease, request, prompt,
    ))
    .await
}

/// Sends a request to the pool member `lease` holds; one that fails before answering, or answers
/// 503, gets a second try on another member.
async fn forward_to_members(
    app: &Arc<App>,
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
    let client = &app.clients[&*model.id];
    let timeout = model.timeouts.response_header;
    // the request itself goes to the last try; an earlier one gets copies (a shared body's first
    // copy is an allocation)
    let out = |lease: &crate::fleet::Lease, parts, path_and_query, bytes| Outgoing {
        base: lease.proxy(),
        path_and_query,
        parts,
        body: full(bytes),
        client_addr: Some(remote.ip()),
    };
    let first = out(
        &lease,
        clone_parts(&parts),
        path_and_query.clone(),
        bytes.clone(),
    );
    let first_id = lease.id().clone();
    let retry = |lease: crate::fleet::Lease, why: String| {
        app.metrics
            .requests
            .retries
            .with_label_values(&[&model.id])
            .inc();
        tracing::warn!(instance = %first_id, "retrying on another replica after: {why}");
        let id = lease.id().clone();
        let answer = proxy::forward(
            client,
            out(&lease, parts, path_and_query, bytes),
            timeout,
            lease,
        );
        async move {
            let answer = answer.await;
            if let Ok(resp) = &answer {
                app.fleet.report_answer(&id, resp.status());
            }
            answer
        }
    };
    match proxy::forward(client, first, timeout, lease).await {
        Err(e @ (Error::Upstream(_) | Error::Unreachable(_))) => {
            report_failure(app, &first_id, &e);
            let lease = app
                .fleet
                .acquire_for(target, Some(&first_id), prompt.as_ref())
                .await?;
            retry(lease, e.to_string()).await
        }
        Ok(resp) if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE => {
            // loading (a replica that died and started again after it was picked) or
            // overloaded: another member answers if one can, else this answer stands
            app.fleet.report_answer(&first_id, resp.status());
            match app
                .fleet
                .acquire_for(target, Some(&first_id), prompt.as_ref())
                .await
            {
                Ok(lease) => {
                    drop(resp);
                    retry(lease, "503 Service Unavailable".into()).await
                }
                Err(_) => Ok(resp),
            }
        }
        Ok(resp) => {
            app.fleet.report_answer(&first_id, resp.status());
            Ok(resp)
        }
        other => other,
    }
}

/// A pool member that gave no answer: taken out when it could not be reached. One that took the
/// connection and closed it without an answer (llama-server does so now and then under load) is
/// not a dead replica, but a failure that counts towards taking it out when it keeps happening.
fn report_failure(app: &App, id: &str, error: &Error) {
    if matches!(error, Error::Unreachable(_)) {
        app.fleet.report_unreachable(id);
    } else {
        app.fleet.report_answer(id, http::StatusCode::BAD_GATEWAY);
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
    app: &Arc<App>,
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
        let body = rewrite_for_peer(app, peer, model, kind.clone(), bytes.clone())?;
        let parts = clone_parts(&parts);
        match peers::forward(app, peer, parts, body, path_and_query.clone(), remote).await {
            Err(Error::Upstream(e)) => {
                tracing::warn!(peer = %peer, "trying another peer for {model} after: {e}");
                app.peer_loads.failed(peer);
                last = Error::Upstream(e);
            }
            answer => return answer,
        }
    }
    Err(last)
}

/// A peer gets the bare model id and its own filters.
pub fn rewrite_for_peer(
    app: &App,
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
    let f = &app.config.peers[peer].filters;
    for key in &f.strip_params {
        body.remove(key);
    }
    for (k, val) in &f.set_params {
        body.set(k, val);
    }
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
