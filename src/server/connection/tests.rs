use std::future::poll_fn;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::server::peek::{protocol, PREFACE};

#[test]
fn the_first_bytes_tell_the_protocol() {
    assert_eq!(protocol(PREFACE), Some(Protocol::Http2));
    assert_eq!(protocol(b"GET / HTTP/1.1\r\n"), Some(Protocol::Http1));
    assert_eq!(
        protocol(b"POST /v1/chat/completions"),
        Some(Protocol::Http1)
    );
    assert_eq!(
        protocol(b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n"),
        Some(Protocol::Http1)
    );
    // the client closed before a byte
    assert_eq!(protocol(b""), Some(Protocol::Http1));
    // a beginning of the preface waits for more
    assert_eq!(protocol(b"P"), None);
    assert_eq!(protocol(&PREFACE[..PREFACE.len() - 1]), None);
}

/// A connected pair of loopback sockets: (client, server).
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (client, server)
}

#[tokio::test]
async fn a_peek_takes_nothing_from_the_socket() {
    let (mut client, mut server) = pair().await;
    let request = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    client.write_all(request).await.unwrap();
    let told = poll_fn(|cx| server.poll_protocol(cx)).await.unwrap();
    assert_eq!(told, Protocol::Http1);
    let mut read = vec![0; request.len()];
    server.read_exact(&mut read).await.unwrap();
    assert_eq!(read, request);
}

#[tokio::test]
async fn half_a_preface_waits_for_the_rest() {
    let (mut client, mut server) = pair().await;
    client.write_all(&PREFACE[..9]).await.unwrap();
    server.readable().await.unwrap();
    // the bytes there are a beginning of the preface: no answer, and no spin over them
    let mut peeking = std::pin::pin!(poll_fn(|cx| server.poll_protocol(cx)));
    let first = poll_fn(|cx| Poll::Ready(peeking.as_mut().poll(cx))).await;
    assert!(first.is_pending());
    client.write_all(&PREFACE[9..]).await.unwrap();
    assert_eq!(peeking.await.unwrap(), Protocol::Http2);
    let mut read = vec![0; PREFACE.len()];
    server.read_exact(&mut read).await.unwrap();
    assert_eq!(read, PREFACE);
}

/// A client that sends a beginning of the preface and closes is answered (as HTTP/1, which
/// reads the end), where the closed socket's lasting readiness used to spin the thread for good.
#[tokio::test]
async fn half_a_preface_then_a_close_is_http1() {
    let (mut client, server) = pair().await;
    client.write_all(&PREFACE[..1]).await.unwrap();
    client.shutdown().await.unwrap();
    server.readable().await.unwrap();
    // on a thread of its own, so that a spin fails this test rather than hang it
    let server = server.into_std().unwrap();
    let peeking = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut server = TcpStream::from_std(server).unwrap();
            poll_fn(|cx| server.poll_protocol(cx)).await.unwrap()
        })
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !peeking.is_finished() {
        assert!(std::time::Instant::now() < deadline, "still peeking");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(peeking.join().unwrap(), Protocol::Http1);
}

#[tokio::test]
async fn a_client_that_closes_at_once_is_http1() {
    let (client, mut server) = pair().await;
    drop(client);
    let told = poll_fn(|cx| server.poll_protocol(cx)).await.unwrap();
    assert_eq!(told, Protocol::Http1);
}

/// A service that answers nothing, for the sizes of the connections that would serve it.
struct Nothing;

impl hyper::service::Service<hyper::Request<Incoming>> for Nothing {
    type Response = hyper::Response<http_body_util::Empty<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn call(&self, _: hyper::Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(hyper::Response::new(http_body_util::Empty::new())))
    }
}

#[test]
fn an_http1_connection_does_not_carry_the_room_of_an_http2_one() {
    let http1 = std::mem::size_of::<http1::UpgradeableConnection<TokioIo<TcpStream>, Nothing>>();
    let state = std::mem::size_of::<State<TcpStream, Nothing>>();
    assert!(
        state <= http1 + 16,
        "{state} bytes against HTTP/1's {http1}"
    );
}
