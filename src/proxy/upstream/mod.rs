//! Connections to engines and peers, each driven by the request that uses it.
//!
//! A pooled client runs every upstream connection as a task of its own, so each request and each
//! body chunk crosses tasks (often threads) twice on its way. Here the request's own task polls
//! the connection: while it waits for the response head and, through [`UpstreamBody`], while the
//! body streams. A connection whose body ended cleanly goes back to an idle list for the next
//! request to the same address; one dropped before its end is closed, so the engine sees the
//! client leave at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::proxy::body::Body;
use conn::Conn;
pub use conn::UpstreamBody;

mod conn;

type Connection = http1::Connection<TokioIo<Stream>, Body>;

/// Where to connect: `host:port`, over TLS or not. Idle connections are kept per address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub host_port: String,
    pub tls: bool,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.host_port)
    }
}

impl Address {
    /// The host, without port or IPv6 brackets: the name a TLS certificate must carry.
    fn host(&self) -> &str {
        let host = match self.host_port.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => &self.host_port,
        };
        host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// What a base URL (`proxy:`) names: where to connect, the `Host` to send, and a path prefix.
#[derive(Debug)]
pub struct Origin {
    pub address: Address,
    pub host: http::HeaderValue,
    /// Prepended to every request path (`https://host/api` → `/api`), without a trailing `/`.
    pub prefix: String,
}

impl Origin {
    /// Parses `http://host[:port][/prefix]` or `https://…`.
    pub fn parse(base: &str) -> Result<Origin, crate::proxy::error::Error> {
        use crate::proxy::error::Error;
        let bad = |why: &str| Error::Internal(format!("bad upstream URL {base:?}: {why}"));
        let (rest, tls, default_port) = if let Some(rest) = base.strip_prefix("http://") {
            (rest, false, 80)
        } else if let Some(rest) = base.strip_prefix("https://") {
            (rest, true, 443)
        } else {
            return Err(Error::Upstream(format!(
                "cannot reach {base}: only http:// and https:// upstreams are supported"
            )));
        };
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.contains('@') {
            return Err(bad(
                "credentials in the URL are not sent; use the peer's apiKey instead",
            ));
        }
        let authority: http::uri::Authority = authority.parse().map_err(|_| bad("bad host"))?;
        let host_port = match authority.port_u16() {
            Some(_) => authority.as_str().to_string(),
            None => format!("{}:{default_port}", authority.host()),
        };
        Ok(Origin {
            address: Address { host_port, tls },
            host: http::HeaderValue::from_str(authority.as_str()).map_err(|_| bad("bad host"))?,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }
}

/// A connection's byte stream: plain TCP, or TLS over it (engines and peers behind https).
type Stream =
    tokio_util::either::Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// The TLS client settings: the system's trusted roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
/// override where they are read from), HTTP/1.1 by ALPN. Built once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(format!(
                    "no trusted root certificates found (install ca-certificates, or set \
                     SSL_CERT_FILE){}",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", why.join("; "))
                    }
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

/// Idle connections kept per address.
const MAX_IDLE_PER_ADDRESS: usize = 64;

/// How connections to an upstream are made and kept.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Time allowed for the TCP connect.
    pub connect: Duration,
    /// Time allowed for the TLS handshake after it (https upstreams).
    pub tls_handshake: Duration,
    /// TCP keepalive idle time.
    pub keepalive: Duration,
    /// How long an unused connection is kept for reuse.
    pub idle: Duration,
    /// Whether a connection serves more than one request. Without, each request opens its own
    /// and asks the upstream to close it after the answer (`Connection: close`): for engines that
    /// close a connection after a streamed answer, which a reused one would meet as an error.
    pub reuse: bool,
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum Failure {
    /// The TCP connection could not be made.
    Connect(String),
    /// The connection failed or closed before a response head arrived.
    Exchange(hyper::Error),
}

impl From<Failure> for crate::proxy::error::Error {
    /// A connection never made is unreachable; one made that then failed is an upstream error.
    fn from(failure: Failure) -> crate::proxy::error::Error {
        use crate::proxy::error::Error;
        match failure {
            Failure::Connect(_) => Error::Unreachable(failure.to_string()),
            Failure::Exchange(_) => Error::Upstream(failure.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(msg) => f.write_str(msg),
            Failure::Exchange(e) => {
                write!(f, "{e}")?;
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}

/// The idle connections of one upstream (an engine's instances or a peer), by thread and address.
///
/// A connection's socket is registered with the event loop of the thread that opened it, so it
/// is reused only from that thread: anywhere else, each of its wake-ups would cross threads.
pub struct Upstream {
    settings: Settings,
    idle: Mutex<HashMap<u64, HashMap<Address, Vec<Idle>>>>,
    /// Base URLs already parsed (a model's instances, or a peer): few, and fixed by the config.
    origins: Mutex<HashMap<String, Arc<Origin>>>,
}

/// This thread's key in the idle lists.
fn home() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static HOME: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    HOME.with(|h| *h)
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Every upstream, so each thread can sweep its idle connections.
static ALL: Mutex<Vec<Weak<Upstream>>> = Mutex::new(Vec::new());

/// Closes this thread's idle connections that have expired or that their upstream has closed
/// (an engine that stopped leaves them half-closed until then).
pub fn sweep_this_thread() {
    let live: Vec<Arc<Upstream>> = {
        let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|u| u.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    };
    for upstream in live {
        upstream.sweep(home());
    }
}

impl Upstream {
    pub fn new(settings: Settings) -> Arc<Upstream> {
        let upstream = Arc::new(Upstream {
            settings,
            idle: Mutex::default(),
            origins: Mutex::default(),
        });
        ALL.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&upstream));
        upstream
    }

    /// Whether a connection serves more than one request (no `disableKeepAlives`).
    #[cfg(test)]
    pub fn reuses_connections(&self) -> bool {
        self.settings.reuse
    }

    /// `base` parsed, once.
    pub fn origin(&self, base: &str) -> Result<Arc<Origin>, crate::proxy::error::Error> {
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(origin) = origins.get(base) {
            return Ok(origin.clone());
        }
        let origin = Arc::new(Origin::parse(base)?);
        origins.insert(base.to_string(), origin.clone());
        Ok(origin)
    }

    fn sweep(&self, home: u64) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let Some(by_address) = idle.get_mut(&home) else {
            return;
        };
        for list in by_address.values_mut() {
            list.retain_mut(|i| {
                i.since.elapsed() <= self.settings.idle
                    && i.conn.drive(&mut Context::from_waker(Waker::noop()))
            });
        }
        by_address.retain(|_, list| !list.is_empty());
    }

    /// Sends `req` (origin-form URI, `Host` set) to `address` on an idle connection when one is
    /// alive, else on a new one.
    pub async fn send(
        self: &Arc<Self>,
        origin: Arc<Origin>,
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let address = &origin.address;
        if !self.settings.reuse {
            req.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        while let Some(mut conn) = self.checkout(address) {
            match conn.exchange(req).await {
                Ok(resp) => return Ok(self.wrap(conn, resp)),
                Err(mut e) => match e.take_message() {
                    // closed while idle: the request was not sent, so it can go on another
                    Some(unsent) => req = unsent,
                    None => return Err(Failure::Exchange(e.into_error())),
                },
            }
        }
        // boxed: a new connection is rare next to a pooled one, and its future would otherwise
        // grow every request's future by a kilobyte and more
        let mut conn = Box::pin(self.connect(address)).await?;
        match conn.exchange(req).await {
            Ok(resp) => Ok(self.wrap(conn, resp)),
            Err(e) => Err(Failure::Exchange(e.into_error())),
        }
    }

    /// Opens a connection for one upgrade (websocket) request; it runs as its own task so the
    /// upgraded stream outlives the response.
    pub async fn send_upgrade(
        &self,
        address: &Address,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, Failure> {
        let stream = self.tcp(address).await?;
        let (mut sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Failure::Exchange)?;
        tokio::spawn(conn.with_upgrades());
        sender.send_request(req).await.map_err(Failure::Exchange)
    }

    fn wrap(self: &Arc<Self>, conn: Conn, resp: Response<Incoming>) -> Response<UpstreamBody> {
        resp.map(|incoming| UpstreamBody {
            incoming,
            conn: Some(conn),
            upstream: self.clone(),
        })
    }

    /// The most recently used idle connection to `address` that is still open.
    fn checkout(&self, address: &Address) -> Option<Conn> {
        if !self.settings.reuse {
            return None;
        }
        loop {
            let Idle { mut conn, since } = self
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&home())?
                .get_mut(address)?
                .pop()?;
            if since.elapsed() > self.settings.idle {
                continue;
            }
            // a poll reads the close of a connection the upstream ended while it sat idle
            if conn.drive(&mut Context::from_waker(Waker::noop())) && conn.sender.is_ready() {
                return Some(conn);
            }
        }
    }

    fn checkin(&self, conn: Conn) {
        if !self.settings.reuse || conn.driver.is_none() || conn.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let lists = idle.entry(conn.home).or_default();
        if !lists.contains_key(&conn.address) {
            lists.insert(conn.address.clone(), Vec::new());
        }
        let list = lists.get_mut(&conn.address).expect("inserted above");
        let expired = list
            .iter()
            .take_while(|i| i.since.elapsed() > self.settings.idle)
            .count();
        list.drain(..expired);
        if list.len() < MAX_IDLE_PER_ADDRESS {
            list.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// A TCP connection to `address` within the connect timeout, then the TLS handshake within
    /// its own when it is https.
    async fn tcp(&self, address: &Address) -> Result<Stream, Failure> {
        let (connect, handshake) = (self.settings.connect, self.settings.tls_handshake);
        let stream = tokio::time::timeout(connect, TcpStream::connect(&address.host_port))
            .await
            .map_err(|_| {
                Failure::Connect(format!(
                    "tcp connect error: {address}: no answer within {}s",
                    connect.as_secs_f64()
                ))
            })?
            .map_err(|e| Failure::Connect(format!("tcp connect error: {address}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(self.settings.keepalive);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        if !address.tls {
            return Ok(Stream::Left(stream));
        }
        let config = tls_config().map_err(|e| Failure::Connect(format!("{address}: {e}")))?;
        let name = rustls::pki_types::ServerName::try_from(address.host().to_string())
            .map_err(|e| Failure::Connect(format!("{address}: bad TLS server name: {e}")))?;
        let connecting = tokio_rustls::TlsConnector::from(config).connect(name, stream);
        let tls = tokio::time::timeout(handshake, connecting)
            .await
            .map_err(|_| {
                Failure::Connect(format!(
                    "tls handshake error: {address}: not done within {}s",
                    handshake.as_secs_f64()
                ))
            })?
            .map_err(|e| Failure::Connect(format!("tls handshake error: {address}: {e}")))?;
        Ok(Stream::Right(Box::new(tls)))
    }

    async fn connect(&self, address: &Address) -> Result<Conn, Failure> {
        let stream = self.tcp(address).await?;
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Failure::Exchange)?;
        Ok(Conn::new(address.clone(), sender, driver))
    }
}

#[cfg(test)]
mod tests;
