//! Forwarding to peers: other OpenAI-compatible servers, other corrals or llama-swaps (§1.8).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue};

use super::App;
use crate::body::{full, Body};
use crate::error::Error;
use crate::proxy::{self, Outgoing};

pub async fn forward(
    app: &Arc<App>,
    peer_id: &str,
    mut parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: String,
    remote: SocketAddr,
) -> Result<http::Response<Body>, Error> {
    let peer = &app.config.peers[peer_id];
    if parts.method != http::Method::GET && parts.method != http::Method::HEAD {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    }
    if let Some(key) = &peer.api_key {
        let bearer = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|e| Error::Internal(e.to_string()))?;
        parts.headers.insert(header::AUTHORIZATION, bearer);
        parts.headers.insert(
            "x-api-key",
            HeaderValue::from_str(key).map_err(|e| Error::Internal(e.to_string()))?,
        );
    } else {
        parts.headers.remove(header::AUTHORIZATION);
        parts.headers.remove("x-api-key");
    }
    let base = peer.proxy.trim_end_matches('/').to_string();
    let out = Outgoing {
        base: base.into(),
        path_and_query: &path_and_query,
        parts,
        body: full(bytes),
        client_addr: Some(remote.ip()),
    };
    proxy::forward(
        &app.peer_clients[peer_id],
        out,
        peer.timeouts.response_header,
        (),
    )
    .await
    .map_err(|e| match e {
        Error::Upstream(msg) | Error::Internal(msg) => {
            Error::Upstream(format!("peer proxy error: {msg}"))
        }
        Error::UpstreamTimeout(s) => {
            Error::Upstream(format!("peer proxy error: no response headers within {s}s"))
        }
        other => other,
    })
}
