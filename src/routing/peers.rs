//! Forwarding to peers: other OpenAI-compatible servers, other corrals or llama-swaps (§1.8).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue};

use crate::proxy::body::{full, Body};
use crate::proxy::error::Error;
use crate::proxy::headers::X_API_KEY;
use crate::proxy::{self, Outgoing};
use crate::routing::Gateway;

/// Sends a buffered (possibly rewritten) request to a peer.
pub async fn forward(
    gateway: &Arc<Gateway>,
    peer_id: &str,
    mut parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: String,
    remote: SocketAddr,
) -> Result<http::Response<Body>, Error> {
    if parts.method == http::Method::GET || parts.method == http::Method::HEAD {
        // its body, if it had one, was not read and does not go on
        parts.headers.remove(header::CONTENT_LENGTH);
    } else {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    }
    forward_body(
        gateway,
        peer_id,
        parts,
        full(bytes),
        &path_and_query,
        remote,
    )
    .await
}

/// Sends a request to a peer with its body as it comes (`/upstream/<peer model>/…`).
pub async fn forward_body(
    gateway: &Arc<Gateway>,
    peer_id: &str,
    mut parts: http::request::Parts,
    body: Body,
    path_and_query: &str,
    remote: SocketAddr,
) -> Result<http::Response<Body>, Error> {
    let peer = &gateway.config.peers[peer_id];
    // the client's own credentials for corral's origin are not the peer's to see
    parts.headers.remove(header::COOKIE);
    let path = path_and_query.split('?').next().unwrap_or_default();
    match &peer.api_key {
        // corral's key for the peer rides only where corral itself would send it
        Some(key) if (gateway.lends_peer_key)(path) => {
            let bearer = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|e| Error::Internal(e.to_string()))?;
            parts.headers.insert(header::AUTHORIZATION, bearer);
            parts.headers.insert(
                X_API_KEY.clone(),
                HeaderValue::from_str(key).map_err(|e| Error::Internal(e.to_string()))?,
            );
        }
        _ => {
            parts.headers.remove(header::AUTHORIZATION);
            parts.headers.remove(&X_API_KEY);
        }
    }
    let base = peer.proxy.trim_end_matches('/').to_string();
    let out = Outgoing {
        base: base.into(),
        path_and_query: path_and_query.to_string().into(),
        parts,
        body,
        client_addr: Some(remote.ip()),
    };
    proxy::forward(
        &gateway.peer_clients[peer_id],
        out,
        peer.timeouts.response_header,
        (),
    )
    .await
    .map_err(|e| match e {
        Error::Upstream(msg) | Error::Unreachable(msg) | Error::Internal(msg) => {
            Error::Upstream(format!("peer proxy error: {msg}"))
        }
        Error::UpstreamTimeout(s) => {
            Error::Upstream(format!("peer proxy error: no response headers within {s}s"))
        }
        other => other,
    })
}
