//! Forwarding to an upstream and streaming its answer back.
//!
//! The upstream response body is wrapped together with the request's [`Lease`]: the instance stays
//! busy until the body ends, fails, or is dropped because the client went away, and dropping it also
//! drops the upstream connection, so a disconnect reaches the engine at once. Nothing here spawns a
//! task that could outlive the client.
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
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;

use crate::body::{Body, BoxError};
use crate::error::Error;
use upstream::{Origin, Upstream};

/// Names compared as header names, not as text: most are standard ones, which compare by tag
/// (a name compared with a `&str` is spelled out first, for every header of every request).
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `Host` goes too: an answer loses it, while a request going upstream keeps its own
/// until the origin's replaces it (an insert, which removes it too).
#[derive(Clone, Copy)]
enum Host {
    Strip,
    Keep,
}

/// Header names corral adds, made once (a name inserted as text is copied on every insert).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

fn is_hop_by_hop(name: &HeaderName, host: Host) -> bool {
    HOP_BY_HOP.iter().any(|h| name == h) || (matches!(host, Host::Strip) && name == header::HOST)
}

/// Removes the hop-by-hop headers, and those its `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap, host: Host) {
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .filter(|name| !name.is_empty())
        .collect();
    for name in &listed {
        headers.remove(name.as_str());
    }
    // one pass over the few headers present, rather than a lookup for every hop-by-hop name
    while let Some(name) = headers.keys().find(|k| is_hop_by_hop(k, host)).cloned() {
        headers.remove(name);
    }
}

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

/// The longest text of an IP address (IPv6 with an IPv4 tail).
const IP_TEXT_MAX: usize = 45;

/// `ip` as text, written into `buf` without the formatting machinery in the usual IPv4 case (it
/// runs for every request).
fn write_ip(buf: &mut [u8; IP_TEXT_MAX], ip: IpAddr) -> &[u8] {
    let IpAddr::V4(v4) = ip else {
        use std::io::Write;
        let mut out = std::io::Cursor::new(&mut buf[..]);
        let _ = write!(out, "{ip}");
        let len = out.position() as usize;
        return &buf[..len];
    };
    let mut len = 0;
    let mut push = |b: u8| {
        buf[len] = b;
        len += 1;
    };
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            push(b'.');
        }
        if octet >= 100 {
            push(b'0' + octet / 100);
        }
        if octet >= 10 {
            push(b'0' + octet / 10 % 10);
        }
        push(b'0' + octet % 10);
    }
    &buf[..len]
}

/// `ip` as a header value. The last one made on this thread is kept: most requests come from the
/// client before them (a gateway, an app on the same host), and a new value is an allocation.
fn forwarded_for(ip: IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((known, value)) if *known == ip => value.clone(),
        _ => {
            let mut buf = [0; IP_TEXT_MAX];
            let value = HeaderValue::from_bytes(write_ip(&mut buf, ip))
                .expect("an IP address's text is a header value");
            *last = Some((ip, value.clone()));
            value
        }
    })
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
        let value = match parts.headers.get(&X_FORWARDED_FOR) {
            Some(prior) => {
                let mut buf = [0; IP_TEXT_MAX];
                let ip = write_ip(&mut buf, ip);
                HeaderValue::from_bytes(&[prior.as_bytes(), b", ", ip].concat()).ok()
            }
            None => Some(forwarded_for(ip)),
        };
        if let Some(v) = value {
            parts.headers.insert(X_FORWARDED_FOR.clone(), v);
        }
    }
    parts.headers.insert(header::HOST, to.origin.host.clone());
    parts.uri = to.uri;
    parts.version = http::Version::HTTP_11;
    Ok((to.origin, Request::from_parts(parts, out.body)))
}

/// The exchange, bounded by the time its response head may take.
fn within<F>(send: F, limit: Option<Duration>) -> impl Future<Output = Result<Upstreamed, Error>>
where
    F: Future<Output = Result<Upstreamed, upstream::Failure>>,
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
    strip_hop_by_hop(&mut parts.headers, Host::Strip);
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

/// Forwards an upgrade request (websockets through `/upstream`): when the engine answers 101, the
/// two connections are joined and copied both ways until either side closes; `guard` lives as long.
pub async fn forward_upgrade<G: Send + 'static>(
    upstream: &Upstream,
    base: &str,
    path_and_query: &str,
    mut client_req: Request<Body>,
    guard: G,
) -> Result<Response<Body>, Error> {
    let to = destination(upstream, base, path_and_query.to_string().into())?;
    let client_upgrade = hyper::upgrade::on(&mut client_req);
    let (mut parts, _) = client_req.into_parts();
    parts.headers.insert(header::HOST, to.origin.host.clone());
    parts.uri = to.uri;
    parts.version = http::Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, crate::body::empty());
    let mut resp = upstream
        .send_upgrade(&to.origin.address, upstream_req)
        .await
        .map_err(Error::from)?;
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
    fn client_addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "9.99.199.1",
            "::1",
            "fe80::1:2",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut buf = [0; IP_TEXT_MAX];
            assert_eq!(write_ip(&mut buf, ip), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn a_client_address_value_is_made_once_for_requests_in_a_row() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        let first = forwarded_for(a);
        let again = forwarded_for(a);
        assert_eq!(again, "10.0.0.1");
        assert_eq!(
            first.as_bytes().as_ptr(),
            again.as_bytes().as_ptr(),
            "the same text, not a copy"
        );
        assert_eq!(forwarded_for(b), "::1");
        assert_eq!(forwarded_for(a), "10.0.0.1");
    }

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

    #[test]
    fn destinations() {
        let upstream = Upstream::new(crate::proxy::upstream::Settings {
            connect: Duration::from_secs(1),
            tls_handshake: Duration::from_secs(1),
            keepalive: Duration::from_secs(1),
            idle: Duration::from_secs(1),
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

    #[test]
    fn hop_by_hop_headers_go_named_ones_too() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "a"),
            ("connection", "keep-alive, X-Trace"),
            ("x-trace", "1"),
            ("te", "trailers"),
            ("authorization", "Bearer k"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut request = h.clone();
        strip_hop_by_hop(&mut h, Host::Strip);
        assert_eq!(
            h.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["authorization"]
        );
        strip_hop_by_hop(&mut request, Host::Keep);
        assert_eq!(
            request.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["host", "authorization"],
            "a request's Host is left for the origin's to replace"
        );
    }
}
