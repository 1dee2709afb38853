//! Forwarding to an upstream and streaming its answer back.
//!
//! The upstream response body is wrapped together with the request's [`Lease`]: the instance stays
//! busy until the body ends, fails, or is dropped because the client went away, and dropping it also
//! drops the upstream connection, so a disconnect reaches the engine at once. Nothing here spawns a
//! task that could outlive the client.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::body::{Body, BoxError};
use crate::error::Error;

pub type HttpClient = Client<HttpConnector, Body>;

/// A pooled client with the given connect timeout and TCP keepalive.
pub fn client(connect: Duration, keepalive: Duration, idle: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect));
    connector.set_keepalive(Some(keepalive));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(idle)
        .pool_max_idle_per_host(64)
        .build(connector)
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(listed.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

/// What to send upstream.
pub struct Outgoing {
    pub base: String,
    pub path_and_query: String,
    pub parts: http::request::Parts,
    pub body: Body,
    pub client_addr: Option<std::net::IpAddr>,
}

/// Sends the request and returns the upstream's response with `guard` riding in its body.
pub async fn forward<G: Send + Sync + Unpin + 'static>(
    client: &HttpClient,
    out: Outgoing,
    response_header_timeout: Option<Duration>,
    guard: G,
) -> Result<Response<Body>, Error> {
    let uri: http::Uri = format!("{}{}", out.base.trim_end_matches('/'), out.path_and_query)
        .parse()
        .map_err(|e| Error::Internal(format!("bad upstream URL: {e}")))?;
    let mut parts = out.parts;
    strip_hop_by_hop(&mut parts.headers);
    if let Some(ip) = out.client_addr {
        let value = match parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
        {
            Some(prior) => format!("{prior}, {ip}"),
            None => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            parts.headers.insert("x-forwarded-for", v);
        }
    }
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let req = Request::from_parts(parts, out.body);
    let send = client.request(req);
    let resp = match response_header_timeout {
        Some(t) => tokio::time::timeout(t, send)
            .await
            .map_err(|_| Error::UpstreamTimeout(t.as_secs()))?,
        None => send.await,
    }
    .map_err(|e| Error::Upstream(describe(&e)))?;
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse {
        parts
            .headers
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
    let body = GuardedBody {
        inner: body.map_err(|e| Box::new(e) as BoxError).boxed(),
        _guard: guard,
    };
    Ok(Response::from_parts(parts, BodyExt::boxed(body)))
}

fn describe(err: &hyper_util::client::legacy::Error) -> String {
    let mut msg = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// True for a websocket (or other) upgrade request.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.get(header::UPGRADE).is_some()
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Forwards an upgrade request (websockets through `/upstream`): when the engine answers 101, the
/// two connections are joined and copied both ways until either side closes; `guard` lives as long.
pub async fn forward_upgrade<G: Send + 'static>(
    client: &HttpClient,
    base: &str,
    path_and_query: &str,
    mut client_req: Request<Body>,
    guard: G,
) -> Result<Response<Body>, Error> {
    let uri: http::Uri = format!("{}{}", base.trim_end_matches('/'), path_and_query)
        .parse()
        .map_err(|e| Error::Internal(format!("bad upstream URL: {e}")))?;
    let client_upgrade = hyper::upgrade::on(&mut client_req);
    let (mut parts, _) = client_req.into_parts();
    parts.headers.remove(header::HOST);
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, crate::body::empty());
    let mut resp = client
        .request(upstream_req)
        .await
        .map_err(|e| Error::Upstream(describe(&e)))?;
    if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as BoxError).boxed(),
        ));
    }
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let _guard = guard;
        let (Ok(client_io), Ok(upstream_io)) = (client_upgrade.await, upstream_upgrade.await)
        else {
            return;
        };
        let mut client_io = hyper_util::rt::TokioIo::new(client_io);
        let mut upstream_io = hyper_util::rt::TokioIo::new(upstream_io);
        let _ = tokio::io::copy_bidirectional(&mut client_io, &mut upstream_io).await;
    });
    let (parts, _) = resp.into_parts();
    Ok(Response::from_parts(parts, crate::body::empty()))
}

/// A body that holds a guard until it is finished or dropped.
pub struct GuardedBody<G> {
    inner: Body,
    _guard: G,
}

impl<G> GuardedBody<G> {
    pub fn new(inner: Body, guard: G) -> Self {
        GuardedBody {
            inner,
            _guard: guard,
        }
    }
}

impl<G: Unpin> HttpBody for GuardedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
