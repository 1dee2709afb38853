//! HTTPS on the listener (`--tls-cert-file`, `--tls-key-file`).
//!
//! A connection's handshake runs in its serving thread, as the first step of the connection: a
//! [`TlsStream`] tells the connection's protocol (see `connection.rs`) by finishing the handshake
//! and reading what ALPN agreed (`h2` or `http/1.1`). The deadlines around that wait bound the
//! handshake as they bound the first bytes of a plain connection (the request-header timeout), so
//! a client that never finishes it is closed, and a drain closes a connection still in it.
//! Everything after (HTTP/1 or HTTP/2, timeouts, admission) is what a plain connection gets.
//!
//! The certificate and key are read at start and again on SIGHUP ([`TlsCertificate::reload`]).
//! Each handshake asks for the pair in force, so a reload applies from the next connection and
//! leaves open ones as they are; a reload that fails keeps the pair in use.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::{server, Accept, TlsAcceptor};

use crate::server::peek::{Peek, Protocol};

/// The listener's certificate chain and private key, as read from their PEM files.
pub struct TlsCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for TlsCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCertificate")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl TlsCertificate {
    /// Reads the pair; an error names the flag and file to fix.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<TlsCertificate>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let pair = read_pair(cert_file, key_file, &provider)?;
        Ok(Arc::new(TlsCertificate {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(pair)),
        }))
    }

    /// Reads the files again, for the handshakes from now on; on error the pair in use stays.
    pub fn reload(&self) -> Result<(), String> {
        let pair = read_pair(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        Ok(())
    }

    /// What the listener's handshakes need: this pair, TLS 1.2 and 1.3, and ALPN offering
    /// HTTP/2 before HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor, String> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for TlsCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// The chain in `cert_file` and the key in `key_file`, checked to belong together.
fn read_pair(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let cert_err = |e| pem_error("--tls-cert-file", cert_file, "certificate", e);
    let chain = CertificateDer::pem_file_iter(cert_file)
        .map_err(cert_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(cert_err)?;
    if chain.is_empty() {
        return Err(cert_err(rustls::pki_types::pem::Error::NoItemsFound));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| pem_error("--tls-key-file", key_file, "private key", e))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "--tls-key-file {}: the key does not belong to the certificate in {}",
            key_file.display(),
            cert_file.display()
        ),
        e => format!("--tls-key-file {}: {e}", key_file.display()),
    })
}

/// Why a PEM file could not be used, naming its flag and path.
fn pem_error(flag: &str, path: &Path, what: &str, e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    let why = match e {
        Error::Io(e) => format!("cannot read it: {e}"),
        Error::NoItemsFound => format!("no PEM {what} in it"),
        e => format!("not a valid PEM file: {e}"),
    };
    format!("{flag} {}: {why}", path.display())
}

/// A client connection that speaks TLS: its handshake, then the decrypted stream.
pub enum TlsStream<IO> {
    Handshaking(Accept<IO>),
    Open(server::TlsStream<IO>),
}

impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// The handshake of `io`, run when the stream is first polled.
    pub fn accept(acceptor: &TlsAcceptor, io: IO) -> Self {
        TlsStream::Handshaking(acceptor.accept(io))
    }

    /// The decrypted stream, once the handshake is done.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut server::TlsStream<IO>>> {
        if let TlsStream::Handshaking(accept) = self {
            let tls = ready!(Pin::new(accept).poll(cx)).inspect_err(|e| {
                tracing::debug!("TLS handshake failed: {e}");
            })?;
            *self = TlsStream::Open(tls);
        }
        match self {
            TlsStream::Open(tls) => Poll::Ready(Ok(tls)),
            TlsStream::Handshaking(_) => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Peek for TlsStream<IO> {
    /// What ALPN agreed, once the handshake is done; HTTP/1 when the client offered nothing
    /// (as Go's server, HTTP/2 over TLS is only spoken when negotiated).
    fn poll_protocol(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Protocol>> {
        let tls = ready!(self.poll_open(cx))?;
        Poll::Ready(Ok(match tls.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        }))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let tls = ready!(self.poll_open(cx))?;
        Pin::new(tls).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let tls = ready!(self.poll_open(cx))?;
        Pin::new(tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let tls = ready!(self.poll_open(cx))?;
        Pin::new(tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            TlsStream::Open(tls) => tls.is_write_vectored(),
            TlsStream::Handshaking(_) => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let tls = ready!(self.poll_open(cx))?;
        Pin::new(tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            TlsStream::Open(tls) => Pin::new(tls).poll_shutdown(cx),
            // nothing was said over TLS yet: the socket just closes
            TlsStream::Handshaking(_) => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests;
