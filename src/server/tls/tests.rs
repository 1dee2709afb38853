use super::*;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::ServerName;

/// A CA that signs `localhost` certificates, and the client config that trusts it.
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

    /// A new `localhost` certificate and its key, as PEM files in `dir`.
    fn issue(&self, dir: &Path) -> (PathBuf, PathBuf, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file, cert.der().clone())
    }

    fn client(&self, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// A handshake between `client` and a listener with `tls`: the certificate the client was shown
/// and the protocol the listener's side told.
async fn handshake(
    tls: &Arc<TlsCertificate>,
    client: &tokio_rustls::TlsConnector,
) -> (CertificateDer<'static>, Protocol) {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let mut server_side = TlsStream::accept(&tls.acceptor().unwrap(), far);
    let told = std::future::poll_fn(move |cx| server_side.poll_protocol(cx));
    let name = ServerName::try_from("localhost").unwrap();
    let (connected, told) = tokio::join!(client.connect(name, near), told);
    let connected = connected.unwrap();
    let shown = connected.get_ref().1.peer_certificates().unwrap()[0].clone();
    (shown, told.unwrap())
}

#[tokio::test]
async fn alpn_tells_http2_from_http1() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.issue(dir.path());
    let tls = TlsCertificate::load(&cert, &key).unwrap();
    let (_, told) = handshake(&tls, &ca.client(&[b"h2", b"http/1.1"])).await;
    assert_eq!(told, Protocol::Http2);
    let (_, told) = handshake(&tls, &ca.client(&[b"http/1.1"])).await;
    assert_eq!(told, Protocol::Http1);
    let (_, told) = handshake(&tls, &ca.client(&[])).await;
    assert_eq!(told, Protocol::Http1, "no ALPN is HTTP/1");
}

#[tokio::test]
async fn a_reload_serves_the_new_pair_and_a_failed_one_keeps_the_old() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, first) = ca.issue(dir.path());
    let tls = TlsCertificate::load(&cert, &key).unwrap();
    let client = ca.client(&[]);
    assert_eq!(handshake(&tls, &client).await.0, first);

    let (_, _, second) = ca.issue(dir.path());
    tls.reload().unwrap();
    assert_eq!(handshake(&tls, &client).await.0, second);

    std::fs::write(&key, "not a key").unwrap();
    let err = tls.reload().unwrap_err();
    assert!(err.starts_with("--tls-key-file"), "{err}");
    assert_eq!(
        handshake(&tls, &client).await.0,
        second,
        "the pair in use stays"
    );
}

#[test]
fn a_bad_pair_names_the_flag_and_file_to_fix() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.issue(dir.path());
    let missing = dir.path().join("missing.pem");
    let err = TlsCertificate::load(&missing, &key).unwrap_err();
    assert!(
        err.starts_with(&format!(
            "--tls-cert-file {}: cannot read it",
            missing.display()
        )),
        "{err}"
    );

    let err = TlsCertificate::load(&key, &key).unwrap_err();
    let want = format!(
        "--tls-cert-file {}: no PEM certificate in it",
        key.display()
    );
    assert_eq!(err, want);

    let err = TlsCertificate::load(&cert, &cert).unwrap_err();
    let want = format!(
        "--tls-key-file {}: no PEM private key in it",
        cert.display()
    );
    assert_eq!(err, want);

    let other = tempfile::tempdir().unwrap();
    let (_, other_key, _) = ca.issue(other.path());
    let err = TlsCertificate::load(&cert, &other_key).unwrap_err();
    let want = format!(
        "--tls-key-file {}: the key does not belong to the certificate in {}",
        other_key.display(),
        cert.display()
    );
    assert_eq!(err, want);

    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n!!!\n").unwrap();
    let err = TlsCertificate::load(&cert, &key).unwrap_err();
    assert!(err.contains("not a valid PEM file"), "{err}");
}
