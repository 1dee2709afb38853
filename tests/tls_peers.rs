//! Peers behind https: certificates are verified against the trusted roots (`SSL_CERT_FILE` here,
//! pointing at a CA made for the test), connections are reused, and a certificate nobody vouches
//! for is refused with a 502 that says why.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use support::*;

/// A certificate for `localhost` and its key, signed by `ca` (self-signed when `None`).
fn localhost_cert(
    ca: Option<(&rcgen::Certificate, &KeyPair)>,
) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = match ca {
        Some((ca_cert, ca_key)) => params.signed_by(&key, ca_cert, ca_key).unwrap(),
        None => params.self_signed(&key).unwrap(),
    };
    (
        cert.der().clone(),
        PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
    )
}

/// An https server on 127.0.0.1 that answers every request with what it received, as JSON.
/// Returns its port and how many TLS connections it accepted.
async fn echo_server(
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> (u16, Arc<AtomicUsize>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let service = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    let header = |name: &str| {
                        parts
                            .headers
                            .get(name)
                            .map(|v| v.to_str().unwrap().to_string())
                    };
                    let echo = json!({
                        "path": parts.uri.path(),
                        "host": header("host"),
                        "authorization": header("authorization"),
                        "body": serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
                    });
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(echo.to_string())))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_peers_are_verified_and_reused() {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "corral test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let (cert, key) = localhost_cert(Some((&ca, &ca_key)));
    let (trusted_port, accepted) = echo_server(cert, key).await;
    let (cert, key) = localhost_cert(None);
    let (untrusted_port, _) = echo_server(cert, key).await;

    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "peers:\n  secure:\n    proxy: https://localhost:{trusted_port}/api\n    apiKey: sk-peer\n    models: [remote-model]\n  \
             stranger:\n    proxy: https://localhost:{untrusted_port}\n    models: [other-model]\n"
        ),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let corral = support::process::spawn_corral_env(
        dir,
        &config,
        state.path(),
        &[],
        // one serving thread, so every request may reuse the same connection
        &[
            ("SSL_CERT_FILE", ca_file.to_str().unwrap()),
            ("CORRAL_THREADS", "1"),
        ],
    );
    let url = format!("{}/v1/chat/completions", corral.url);

    for _ in 0..3 {
        let resp = post_json(&url, &chat("remote-model")).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let echo = resp.json();
        assert_eq!(echo["path"], "/api/v1/chat/completions");
        assert_eq!(echo["host"], format!("localhost:{trusted_port}"));
        assert_eq!(echo["authorization"], "Bearer sk-peer");
        assert_eq!(echo["body"]["model"], "remote-model");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one TLS connection, reused"
    );

    let refused = post_json(&url, &chat("other-model")).await;
    assert_eq!(refused.status, 502);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("peer proxy error") && message.contains("certificate"),
        "{message}"
    );
}
