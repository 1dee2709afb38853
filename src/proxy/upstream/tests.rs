//! The connection a response body drives: how often the task reading it is woken, and that every
//! frame still arrives and the connection is reused.

use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::task::Poll;

use bytes::Bytes;
use http_body::Body as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const CHUNKS: usize = 20;

/// A server that answers each request on a connection with `CHUNKS` chunks, 2 ms apart (each
/// its own read at the other end), and counts the connections it accepted.
async fn streaming_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let mut head = Vec::new();
                loop {
                    let Ok(n @ 1..) = socket.read(&mut buf).await else {
                        return;
                    };
                    head.extend_from_slice(&buf[..n]);
                    if !head.ends_with(b"\r\n\r\n") {
                        continue;
                    }
                    head.clear();
                    let start = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                 transfer-encoding: chunked\r\n\r\n";
                    socket.write_all(start.as_bytes()).await.unwrap();
                    for i in 0..CHUNKS {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let event = format!("data: {i}\n\n");
                        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                        socket.write_all(chunk.as_bytes()).await.unwrap();
                    }
                    socket.write_all(b"0\r\n\r\n").await.unwrap();
                }
            });
        }
    });
    (addr, accepted)
}

/// Wakes the task it wraps and counts how often.
struct Counting {
    task: Waker,
    wakes: AtomicUsize,
}

impl std::task::Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.task.wake_by_ref();
    }
}

/// Reads a body to its end, polling it as hyper's server does (until it waits); returns the
/// data frames and how often the reading task was woken meanwhile.
async fn read_counting_wakes(mut body: UpstreamBody) -> (Vec<Bytes>, usize) {
    let mut frames = Vec::new();
    let mut counting: Option<Arc<Counting>> = None;
    std::future::poll_fn(|cx| {
        let counter = counting.get_or_insert_with(|| {
            Arc::new(Counting {
                task: cx.waker().clone(),
                wakes: AtomicUsize::new(0),
            })
        });
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => frames.extend(frame.into_data().ok()),
                Poll::Ready(Some(Err(e))) => panic!("{e}"),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await;
    let wakes = counting.map_or(0, |c| c.wakes.load(Ordering::Relaxed));
    (frames, wakes)
}

/// The connection is driven in the reading task, and handing a frame over, or making room for the
/// next by taking one, used to wake that task again: two or three polls of the whole response
/// per frame where one does. Only the socket's readiness wakes it now.
#[tokio::test]
async fn a_streamed_answer_wakes_its_reader_once_per_frame_and_is_read_whole() {
    let (addr, accepted) = streaming_server().await;
    let upstream = Upstream::new(Settings {
        connect: Duration::from_secs(5),
        tls_handshake: Duration::from_secs(5),
        keepalive: Duration::from_secs(5),
        idle: Duration::from_secs(5),
        reuse: true,
    });
    let origin = upstream.origin(&format!("http://{addr}")).unwrap();
    for _ in 0..2 {
        let req = Request::get("/events")
            .header(http::header::HOST, origin.host.clone())
            .body(crate::proxy::body::empty())
            .unwrap();
        let resp = upstream.send(origin.clone(), req).await.unwrap();
        let (frames, wakes) = read_counting_wakes(resp.into_body()).await;
        let text: Vec<u8> = frames.concat();
        let expected: String = (0..CHUNKS).map(|i| format!("data: {i}\n\n")).collect();
        assert_eq!(String::from_utf8(text).unwrap(), expected);
        assert!(wakes <= CHUNKS + 2, "{wakes} wake-ups for {CHUNKS} frames");
    }
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        1,
        "the connection went back for the second request"
    );
}

/// A server that answers every request on a connection with a short body, keeps the connection
/// open whatever the request asked, and keeps each request head it read.
async fn recording_server() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    Arc<Mutex<Vec<String>>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (count, kept) = (accepted.clone(), heads.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let mut head = Vec::new();
                while let Ok(n @ 1..) = socket.read(&mut buf).await {
                    head.extend_from_slice(&buf[..n]);
                    if !head.ends_with(b"\r\n\r\n") {
                        continue;
                    }
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).to_lowercase());
                    head.clear();
                    let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    socket.write_all(answer.as_bytes()).await.unwrap();
                }
            });
        }
    });
    (addr, accepted, heads)
}

/// Sends two requests one after the other, each read to its end; returns the connections the
/// server accepted and the heads it read.
async fn two_requests(reuse: bool) -> (usize, Vec<String>) {
    let (addr, accepted, heads) = recording_server().await;
    let upstream = Upstream::new(Settings {
        connect: Duration::from_secs(5),
        tls_handshake: Duration::from_secs(5),
        keepalive: Duration::from_secs(5),
        idle: Duration::from_secs(5),
        reuse,
    });
    let origin = upstream.origin(&format!("http://{addr}")).unwrap();
    for _ in 0..2 {
        let req = Request::get("/props")
            .header(http::header::HOST, origin.host.clone())
            .body(crate::proxy::body::empty())
            .unwrap();
        let resp = upstream.send(origin.clone(), req).await.unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await;
        assert_eq!(body.unwrap().to_bytes(), "ok");
    }
    let heads = heads.lock().unwrap().clone();
    (accepted.load(Ordering::Relaxed), heads)
}

/// `disableKeepAlives`: each request opens its own connection and asks for it to be closed
/// after the answer; otherwise the first connection serves the second request.
#[tokio::test]
async fn without_reuse_each_request_has_a_connection_of_its_own() {
    let (connections, heads) = two_requests(false).await;
    assert_eq!(connections, 2);
    assert!(
        heads.iter().all(|h| h.contains("connection: close\r\n")),
        "{heads:?}"
    );
    let (connections, heads) = two_requests(true).await;
    assert_eq!(connections, 1);
    assert!(
        heads.iter().all(|h| !h.contains("connection: close")),
        "{heads:?}"
    );
}
