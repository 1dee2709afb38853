//! HTTPS on the listener (`--tls-cert-file`, `--tls-key-file`): HTTP/1.1 and HTTP/2 chosen by
//! ALPN, the client-connection deadlines applied to the handshake, and the certificate read again
//! on SIGHUP. Certificates are made for each test by a CA the test clients trust.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A CA that signs `localhost` certificates, and clients that trust it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A new `localhost` certificate and key written to `cert.pem` and `key.pem` in `dir`.
    fn issue(&self, dir: &Path) -> (PathBuf, PathBuf, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file, cert.der().clone())
    }

    /// A TLS connection to `addr` offering `alpn`, verified against this CA.
    async fn connect(&self, addr: &str, alpn: &[u8]) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }
}

/// `host:port` of a URL.
fn addr(url: &str) -> &str {
    url.split("://").nth(1).unwrap()
}

fn request(
    method: &str,
    addr: &str,
    path: &str,
    body: Option<&Value>,
) -> http::Request<Full<Bytes>> {
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    http::Request::builder()
        .method(method)
        .uri(format!("https://{addr}{path}"))
        .header("host", addr)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap()
}

/// The status, version and body of each request, sent in turn on one connection speaking
/// what ALPN agreed.
async fn exchange(
    tls: TlsStream<TcpStream>,
    requests: Vec<http::Request<Full<Bytes>>>,
) -> Vec<(u16, http::Version, Bytes)> {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let mut out = Vec::new();
    if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        for req in requests {
            let resp = send.send_request(req).await.unwrap();
            let (status, version) = (resp.status().as_u16(), resp.version());
            out.push((status, version, resp.collect().await.unwrap().to_bytes()));
        }
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        for req in requests {
            // an HTTP/1 connection takes the next request once the last answer is done with
            send.ready().await.unwrap();
            let resp = send.send_request(req).await.unwrap();
            let (status, version) = (resp.status().as_u16(), resp.version());
            out.push((status, version, resp.collect().await.unwrap().to_bytes()));
        }
    }
    out
}

/// corral in this process, serving HTTPS with a certificate from `ca` under `server` settings.
async fn https_harness(ca: &Ca, server: &str) -> (Harness, tempfile::TempDir) {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.issue(certs.path());
    let opts = corral::Options {
        tls: Some(corral::TlsCertificate::load(&cert, &key).unwrap()),
        ..Default::default()
    };
    let yaml = format!("{server}\nmodels:\n{}", fake_model("a", "", ""));
    (Harness::start_with(&yaml, opts).await, certs)
}

/// `/health` and a chat request over HTTPS, on HTTP/1.1 and on HTTP/2, each as ALPN chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_health_and_chat_on_http1_and_http2() {
    let ca = Ca::new();
    let (h, _certs) = https_harness(&ca, "").await;
    let addr = addr(&h.url);
    for (alpn, version) in [
        (&b"http/1.1"[..], http::Version::HTTP_11),
        (&b"h2"[..], http::Version::HTTP_2),
    ] {
        let tls = ca.connect(addr, alpn).await;
        let chat = json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]});
        let answers = exchange(
            tls,
            vec![
                request("GET", addr, "/health", None),
                request("POST", addr, "/v1/chat/completions", Some(&chat)),
            ],
        )
        .await;
        let (status, got, body) = &answers[0];
        assert_eq!((*status, *got), (200, version), "{body:?}");
        assert_eq!(&body[..], b"OK");
        let (status, got, body) = &answers[1];
        assert_eq!((*status, *got), (200, version), "{body:?}");
        let answer: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(answer["object"], "chat.completion", "{answer}");
    }
    h.stop().await;
}

/// A client that starts a handshake and never finishes it is closed at `requestHeader`, as a
/// plain socket that sends nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_handshake_is_closed_at_request_header() {
    let ca = Ca::new();
    let (h, _certs) = https_harness(&ca, "clientTimeouts: {requestHeader: 1}").await;
    let mut sock = TcpStream::connect(addr(&h.url)).await.unwrap();
    // the header of a handshake record, and none of its body
    sock.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "the connection is still open");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    h.stop().await;
}

/// The corral binary serves HTTPS with the flags' files and, on SIGHUP, the files as rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate() {
    use nix::sys::signal::Signal;
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, first) = ca.issue(dir.path());
    let config = dir.path().join("config.yaml");
    let yaml = format!(
        "startPort: {}\nmodels:\n{}",
        free_port_range(4),
        fake_model("a", "", "")
    );
    std::fs::write(&config, yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
    let extra = ["-tls-cert-file", &cert_arg, "-tls-key-file", &key_arg];
    let p = process::spawn_corral_with(dir, &config, state.path(), &extra);
    assert!(p.url.starts_with("https://"), "{}", p.url);
    let shown =
        |tls: &TlsStream<TcpStream>| tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(shown(&ca.connect(addr(&p.url), b"h2").await), first);

    let (_, _, second) = ca.issue(p.dir.path());
    process::signal(&p.child, Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shown(&ca.connect(addr(&p.url), b"h2").await) != second {
        assert!(
            std::time::Instant::now() < deadline,
            "still the first certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
