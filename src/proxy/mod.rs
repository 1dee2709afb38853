//! Forwarding to an upstream and streaming its answer back.
//!
//! The upstream response body is wrapped together with the request's [`Lease`]: the instance stays
//! busy until the body ends, fails, or is dropped because the client went away, and dropping it also
//! drops the upstream connection, so a disconnect reaches the engine at once. Nothing here spawns a
//! task that could outlive the client: a websocket's tunnel runs on the client's own connection
//! (`tunnel.rs`).
pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod headers;
pub(crate) mod tunnel;
pub(crate) mod upstream;

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::{FutureExt, TryFutureExt};
use http::{header, HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;

use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;
use headers::{add_forwarded_for, strip_hop_by_hop, Host, X_ACCEL_BUFFERING};
use upstream::{Origin, Upstream};

/// What to send upstream.
pub struct Outgoing {
    pub base: Arc<str>,
    /// Shared, not copied, into the request line when it is one of corral's own paths.
    pub path_and_query: Cow<'static, str>,
    pub parts: http::request::Parts,
    pub body: Body,
    pub client_addr: Option<IpAddr>,
}

/// Where a request goes: its upstream's origin, and the request line to send there.
struct Destination {
    origin: Arc<Origin>,
    uri: http::Uri,
}

/// `base` (parsed once per upstream) + `path_and_query`.
fn destination(
    upstream: &Upstream,
    base: &str,
    path_and_query: Cow<'static, str>,
) -> Result<Destination, Error> {
    let origin = upstream.origin(base)?;
    let bad = |line: &str, e| Error::Internal(format!("bad upstream path {line:?}: {e}"));
    let uri = match path_and_query {
        // one of corral's own paths: shared, not copied, and parsed once
        Cow::Borrowed(path) if origin.prefix.is_empty() => {
            own_path_uri(path).map_err(|e| bad(path, e))?
        }
        path => {
            let line = format!("{}{path}", origin.prefix);
            http::Uri::try_from(line.as_str()).map_err(|e| bad(&line, e))?
        }
    };
    Ok(Destination { origin, uri })
}

/// How many of corral's own paths a thread keeps parsed: there are about twenty.
const OWN_PATHS_KEPT: usize = 64;

thread_local! {
    /// This thread's parsed paths of corral's own, by address.
    static PARSED: RefCell<Vec<(&'static str, http::Uri)>> = const { RefCell::new(Vec::new()) };
}

/// One of corral's own paths (the model routes' `&'static str`s) as a request line, parsed once
/// per thread: it is the same text for every request it serves, and parsing it checks each byte.
/// A parsed path is kept by its address; its clone shares the static text.
fn own_path_uri(path: &'static str) -> Result<http::Uri, http::uri::InvalidUri> {
    PARSED.with_borrow_mut(|parsed| {
        if let Some((_, uri)) = parsed.iter().find(|(p, _)| std::ptr::eq(*p, path)) {
            return Ok(uri.clone());
        }
        let uri = http::Uri::from_maybe_shared(Bytes::from_static(path.as_bytes()))?;
        if parsed.len() < OWN_PATHS_KEPT {
            parsed.push((path, uri.clone()));
        }
        Ok(uri)
    })
}

/// Sends the request and returns the upstream's response with `guard` riding in its body.
///
/// Not an `async fn`: the request is made ready here, and the future returned holds the exchange
/// and the guard alone. An `async fn` would keep its arguments and locals beside the exchange, and
/// this future is moved into its callers' futures for every request.
pub fn forward<'a, G: Send + Sync + Unpin + 'static>(
    upstream: &'a Arc<Upstream>,
    out: Outgoing,
    response_header_timeout: Option<Duration>,
    guard: G,
) -> impl Future<Output = Result<Response<Body>, Error>> + Send + 'a {
    let exchange = match upstream_request(upstream, out) {
        Ok((origin, req)) => {
            let send = upstream.send(origin, req);
            Either::Left(within(send, response_header_timeout))
        }
        Err(e) => Either::Right(std::future::ready(Err(e))),
    };
    exchange.map(move |resp| Ok(answer(resp?, guard)))
}

/// The request as it goes upstream: hop-by-hop headers out, `X-Forwarded-For` and `Host` in, the
/// origin's request line.
fn upstream_request(
    upstream: &Upstream,
    out: Outgoing,
) -> Result<(Arc<Origin>, Request<Body>), Error> {
    let to = destination(upstream, &out.base, out.path_and_query)?;
    let mut parts = out.parts;
    strip_hop_by_hop(&mut parts.headers, Host::Keep);
    if let Some(ip) = out.client_addr {
        add_forwarded_for(&mut parts.headers, ip);
    }
    parts.headers.insert(header::HOST, to.origin.host.clone());
    parts.uri = to.uri;
    parts.version = http::Version::HTTP_11;
    Ok((to.origin, Request::from_parts(parts, out.body)))
}

/// The exchange, bounded by the time its response head may take.
fn within<F, T>(send: F, limit: Option<Duration>) -> impl Future<Output = Result<T, Error>>
where
    F: Future<Output = Result<T, upstream::Failure>>,
{
    match limit {
        Some(limit) => Either::Left(tokio::time::timeout(limit, send).map(move |sent| {
            sent.map_err(|_| Error::UpstreamTimeout(limit.as_secs()))?
                .map_err(Error::from)
        })),
        None => Either::Right(send.map_err(Error::from)),
    }
}

type Upstreamed = Response<upstream::UpstreamBody>;

/// The upstream's answer as it goes to the client, with `guard` in its body.
fn answer<G: Send + Sync + Unpin + 'static>(resp: Upstreamed, guard: G) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    if strip_hop_by_hop(&mut parts.headers, Host::Strip) {
        // framed by its encoding, which is undone here: a length beside it is not the body's
        // (RFC 9112 §6.3), and the answer is framed anew for the client
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    // corral's own version to its client (hyper answers a 1.0 client in 1.0): an engine that
    // answers in 1.0 would otherwise close every client's connection after its answer
    parts.version = http::Version::HTTP_11;
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_sse {
        parts
            .headers
            .insert(X_ACCEL_BUFFERING.clone(), HeaderValue::from_static("no"));
    }
    Response::from_parts(parts, BodyExt::boxed(GuardedBody::new(body, guard)))
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

/// How long a tunnel may carry nothing when its request came from no client connection (which
/// would say): the default client idle timeout.
const UNHANDED_IDLE: Duration = Duration::from_secs(60);

/// Forwards an upgrade request (websockets through `/upstream`), the engine's answer bounded as an
/// ordinary request's response head is: when the engine answers 101, the two connections are
/// joined and copied both ways until either side closes or the tunnel idles out; `guard` lives
/// as long. The tunnel runs on the client's connection, which hands itself over in the request
/// (see `tunnel.rs`).
pub async fn forward_upgrade<G: Send + 'static>(
    upstream: &Upstream,
    base: &str,
    path_and_query: &str,
    mut client_req: Request<Body>,
    response_header_timeout: Option<Duration>,
    guard: G,
) -> Result<Response<Body>, Error> {
    let to = destination(upstream, base, path_and_query.to_string().into())?;
    let client_upgrade = hyper::upgrade::on(&mut client_req);
    let handoff = client_req.extensions_mut().remove::<tunnel::Handoff>();
    let (mut parts, _) = client_req.into_parts();
    parts.headers.insert(header::HOST, to.origin.host.clone());
    parts.uri = to.uri;
    parts.version = http::Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, crate::proxy::body::empty());
    let send = upstream.send_upgrade(&to.origin.address, upstream_req);
    let mut resp = within(send, response_header_timeout).await?;
    if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as BoxError).boxed(),
        ));
    }
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    match handoff {
        Some(handoff) => {
            let joined = tunnel::join(client_upgrade, upstream_upgrade, handoff.idle, guard);
            handoff.keeper.keep(Box::pin(joined));
        }
        None => {
            let joined = tunnel::join(client_upgrade, upstream_upgrade, UNHANDED_IDLE, guard);
            tokio::spawn(joined);
        }
    }
    let (parts, _) = resp.into_parts();
    Ok(Response::from_parts(parts, crate::proxy::body::empty()))
}

/// A body that holds a guard until it is finished or dropped.
pub struct GuardedBody<B, G> {
    inner: B,
    _guard: G,
}

impl<B, G> GuardedBody<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        GuardedBody {
            inner,
            _guard: guard,
        }
    }
}

impl<B, G> HttpBody for GuardedBody<B, G>
where
    B: HttpBody<Data = Bytes, Error = BoxError> + Unpin,
    G: Unpin,
{
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_paths_are_parsed_once_per_thread_and_kept_apart() {
        std::thread::spawn(|| {
            for _ in 0..3 {
                for path in ["/v1/chat/completions", "/v1/embeddings"] {
                    assert_eq!(own_path_uri(path).unwrap(), path);
                }
            }
            assert!(own_path_uri("/bad path").is_err());
            let kept: Vec<_> = PARSED.with_borrow(|p| p.iter().map(|(p, _)| *p).collect());
            assert_eq!(kept, ["/v1/chat/completions", "/v1/embeddings"]);
        })
        .join()
        .unwrap();
    }

    /// An engine that takes an upgrade request and never answers fails it at the response-head
    /// bound, as an ordinary request, and the connection to it is closed.
    #[tokio::test]
    async fn an_upgrade_the_engine_never_answers_times_out() {
        use tokio::io::AsyncReadExt;
        let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", engine.local_addr().unwrap());
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut sock, _) = engine.accept().await.unwrap();
            let mut sink = Vec::new();
            let _ = sock.read_to_end(&mut sink).await;
            let _ = closed_tx.send(sink);
        });
        let upstream = Upstream::new(crate::proxy::upstream::Settings {
            connect: Duration::from_secs(5),
            tls_handshake: Duration::from_secs(5),
            keepalive: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            reuse: true,
        });
        let req = Request::get("/ws")
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "upgrade")
            .body(crate::proxy::body::empty())
            .unwrap();
        let limit = Some(Duration::from_millis(300));
        let forwarded = forward_upgrade(&upstream, &base, "/ws", req, limit, ());
        let answered = tokio::time::timeout(Duration::from_secs(10), forwarded).await;
        let err = answered.expect("bounded").unwrap_err();
        assert!(matches!(err, Error::UpstreamTimeout(_)), "{err:?}");
        let sent = tokio::time::timeout(Duration::from_secs(10), closed).await;
        let sent = sent.expect("the engine's connection is closed").unwrap();
        assert!(String::from_utf8_lossy(&sent).starts_with("GET /ws HTTP/1.1"));
    }

    #[test]
    fn destinations() {
        let upstream = Upstream::new(crate::proxy::upstream::Settings {
            connect: Duration::from_secs(1),
            tls_handshake: Duration::from_secs(1),
            keepalive: Duration::from_secs(1),
            idle: Duration::from_secs(1),
            reuse: true,
        });
        let show = |d: Destination| {
            (
                d.origin.address.to_string(),
                d.origin.host.to_str().unwrap().to_string(),
                d.uri.to_string(),
            )
        };
        let d = destination(&upstream, "http://127.0.0.1:8080", "/v1/models?x=1".into()).unwrap();
        assert_eq!(
            show(d),
            (
                "http://127.0.0.1:8080".into(),
                "127.0.0.1:8080".into(),
                "/v1/models?x=1".into()
            )
        );
        let d = destination(
            &upstream,
            "http://peer.local/api/",
            "/v1/chat/completions".into(),
        )
        .unwrap();
        assert_eq!(
            show(d),
            (
                "http://peer.local:80".into(),
                "peer.local".into(),
                "/api/v1/chat/completions".into()
            )
        );
        let d = destination(
            &upstream,
            "https://api.example.com/v1",
            "/chat/completions".into(),
        )
        .unwrap();
        assert_eq!(
            show(d),
            (
                "https://api.example.com:443".into(),
                "api.example.com".into(),
                "/v1/chat/completions".into()
            )
        );
        assert!(matches!(
            destination(&upstream, "ftp://peer", "/x".into()),
            Err(Error::Upstream(_))
        ));
        assert!(destination(&upstream, "http://bad host", "/x".into()).is_err());
        assert!(destination(&upstream, "http://user:pw@host:1", "/x".into()).is_err());
    }
}
