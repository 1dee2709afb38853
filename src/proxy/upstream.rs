//! Connections to engines and peers, each driven by the request that uses it.
//!
//! A pooled client runs every upstream connection as a task of its own, so each request and each
//! body chunk crosses tasks (often threads) twice on its way. Here the request's own task polls
//! the connection: while it waits for the response head and, through [`UpstreamBody`], while the
//! body streams. A connection whose body ended cleanly goes back to an idle list for the next
//! request to the same address; one dropped before its end is closed, so the engine sees the
//! client leave at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldhash::HashMap;
use futures_util::task::AtomicWaker;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::{Body, BoxError};

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
    pub fn parse(base: &str) -> Result<Origin, crate::error::Error> {
        use crate::error::Error;
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
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum Failure {
    /// The TCP connection could not be made.
    Connect(String),
    /// The connection failed or closed before a response head arrived.
    Exchange(hyper::Error),
}

impl From<Failure> for crate::error::Error {
    /// A connection never made is unreachable; one made that then failed is an upstream error.
    fn from(failure: Failure) -> crate::error::Error {
        use crate::error::Error;
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

/// One HTTP/1.1 connection: the sending half and the connection future that does the I/O.
struct Conn {
    home: u64,
    address: Address,
    sender: http1::SendRequest<Body>,
    /// `None` once the connection has ended.
    driver: Option<Pin<Box<Connection>>>,
    /// The waker the connection future is polled with: it notes that the connection has work
    /// before it wakes the task that holds the connection.
    wakeup: Arc<Wakeup>,
    waker: Waker,
}

/// Notes that a connection was woken (its socket became ready, its response body was read, a
/// request was handed to it) and wakes the task that holds it. The task polls the whole response
/// several times per frame it forwards; only a poll after such a wake-up has anything for the
/// connection to do.
#[derive(Default)]
struct Wakeup {
    woken: AtomicBool,
    /// Set while the task itself reads the response body: taking a frame makes room for the
    /// next, which wakes the connection, and the task need not be woken for it (see
    /// [`next_frame`]).
    quiet: AtomicBool,
    task: AtomicWaker,
}

impl std::task::Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if !self.quiet.load(Ordering::Acquire) {
            self.task.wake();
        }
    }
}

impl Conn {
    fn new(address: Address, sender: http1::SendRequest<Body>, driver: Connection) -> Conn {
        let wakeup = Arc::new(Wakeup::default());
        wakeup.woken.store(true, Ordering::Relaxed);
        Conn {
            home: home(),
            address,
            sender,
            driver: Some(Box::pin(driver)),
            waker: Waker::from(wakeup.clone()),
            wakeup,
        }
    }

    /// Lets the connection read and write what it can, if it was woken since it last could not;
    /// false once it has ended. The task in `cx` is woken when the connection has more to do.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_io(cx);
        self.driver.is_some()
    }

    /// [`Conn::drive`]; true when the connection was polled (it had been woken).
    fn poll_io(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        self.wakeup.task.register(cx.waker());
        if !self.wakeup.woken.swap(false, Ordering::Acquire) {
            return false;
        }
        if driver
            .as_mut()
            .poll(&mut Context::from_waker(&self.waker))
            .is_ready()
        {
            self.driver = None;
        }
        true
    }

    /// Sends `req` and waits for the response head, driving the connection meanwhile. A request
    /// the connection never took (it had closed) comes back in the error.
    ///
    /// The head is handed over only while this task drives the connection, so it is awaited with
    /// a waker that wakes nobody (see [`next_frame`]).
    async fn exchange(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Body>>> {
        // handing the request to the connection wakes it; it is driven right below, so the task
        // need not be woken for it
        self.wakeup.quiet.store(true, Ordering::Release);
        let mut pending = std::pin::pin!(self.sender.try_send_request(req));
        self.wakeup.quiet.store(false, Ordering::Release);
        self.wakeup.woken.store(true, Ordering::Relaxed);
        std::future::poll_fn(|cx| {
            self.drive(cx);
            pending
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
        })
        .await
    }
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

    /// `base` parsed, once.
    pub fn origin(&self, base: &str) -> Result<Arc<Origin>, crate::error::Error> {
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
        if conn.driver.is_none() || conn.sender.is_closed() {
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

/// An upstream response body that drives its connection and returns it to the idle list once the
/// body has ended.
pub struct UpstreamBody {
    incoming: Incoming,
    conn: Option<Conn>,
    upstream: Arc<Upstream>,
}

impl UpstreamBody {
    /// The answer is complete: the connection goes back for reuse if it is done with this
    /// exchange. One whose request body is still being sent (the upstream answered early) is
    /// closed instead: parked, nothing would drive the rest of the upload.
    fn release(&mut self, cx: &mut Context<'_>) {
        if let Some(mut conn) = self.conn.take() {
            // a poll lets the connection take in the end of the exchange and ask for the next
            conn.wakeup.woken.store(true, Ordering::Relaxed);
            if conn.drive(cx) && conn.sender.is_ready() {
                self.upstream.checkin(conn);
            }
        }
    }
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = match this.conn.as_mut() {
            Some(conn) => next_frame(&mut this.incoming, conn, cx),
            None => Pin::new(&mut this.incoming).poll_frame(cx),
        };
        match polled {
            Poll::Ready(None) => {
                this.release(cx);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.conn = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.incoming.is_end_stream() {
                    this.release(cx);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

/// The body's next frame, driving the connection only when none is waiting.
///
/// Frames reach `incoming` only while this task drives the connection, so `incoming` is polled
/// with a waker that wakes nobody: the connection handing over a frame would otherwise wake this
/// very task again, for a poll of the whole response that finds nothing. And taking a frame wakes
/// the connection (there is room for the next one) without waking the task: whoever reads this
/// body polls it again once it can take more, and that poll drives the connection.
fn next_frame(
    incoming: &mut Incoming,
    conn: &mut Conn,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
    let polled = take_frame(incoming, conn);
    if polled.is_ready() || !conn.poll_io(cx) {
        return polled;
    }
    take_frame(incoming, conn)
}

/// Polls `incoming` with a waker that wakes nobody, and without waking the task for the room that
/// taking a frame makes (see [`next_frame`]).
fn take_frame(
    incoming: &mut Incoming,
    conn: &Conn,
) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
    conn.wakeup.quiet.store(true, Ordering::Release);
    let polled = Pin::new(incoming).poll_frame(&mut Context::from_waker(Waker::noop()));
    conn.wakeup.quiet.store(false, Ordering::Release);
    polled
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // a body read to its end leaves the connection ready for another request
        if self.incoming.is_end_stream() {
            self.release(&mut Context::from_waker(Waker::noop()));
        }
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
