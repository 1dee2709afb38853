use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIRST: Duration = Duration::from_millis(300);
const IDLE: Duration = Duration::from_millis(600);

fn pipe() -> (
    tokio::io::DuplexStream,
    IdleDeadline<tokio::io::DuplexStream>,
    Arc<Activity>,
) {
    let (client, server) = tokio::io::duplex(64);
    let activity = Arc::new(Activity::default());
    let io = IdleDeadline::new(server, activity.clone(), FIRST, IDLE);
    (client, io, activity)
}

/// Reads until the stream fails; returns how long that took.
async fn time_to_failure(io: &mut IdleDeadline<tokio::io::DuplexStream>) -> Duration {
    let started = Instant::now();
    let mut buf = [0; 8];
    loop {
        match io.read(&mut buf).await {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
                return started.elapsed();
            }
        }
    }
}

/// A peer with no request is cut off at the first deadline, even while it trickles bytes.
#[tokio::test]
async fn a_peer_with_no_request_is_cut_off_at_the_first_deadline() {
    let (mut client, mut io, _activity) = pipe();
    let trickle = tokio::spawn(async move {
        while client.write_all(b"P").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let took = time_to_failure(&mut io).await;
    assert!(took >= FIRST && took < IDLE, "{took:?}");
    trickle.abort();
}

/// No deadline applies while a request is in flight; the idle one starts when it ends.
#[tokio::test]
async fn the_idle_deadline_starts_when_the_last_request_ends() {
    let (_client, mut io, activity) = pipe();
    let request = activity.begin(http::Version::HTTP_2);
    let mut buf = [0; 8];
    let read = tokio::time::timeout(IDLE * 2, io.read(&mut buf)).await;
    assert!(
        read.is_err(),
        "nothing closes a connection with a request in flight"
    );
    drop(request);
    let took = time_to_failure(&mut io).await;
    assert!(took >= IDLE && took < IDLE * 2, "{took:?}");
}

/// Counts the wake-ups of the task a future is polled in.
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A stand-in for a connection: each poll runs `step` on the connection's reads.
fn connection(
    io: IdleDeadline<tokio::io::DuplexStream>,
    step: impl FnMut(&mut IdleDeadline<tokio::io::DuplexStream>, &mut Context<'_>) + Unpin,
) -> impl Future<Output = ()> {
    let mut state = (io, step);
    std::future::poll_fn(move |cx| {
        let (io, step) = &mut state;
        step(io, cx);
        Poll::Pending
    })
}

/// A connection whose request ends in its second poll, which reads nothing after it; its first
/// poll reads, and so do those after the second when `reads_later`.
fn ending_in_second_poll(reads_later: bool) -> (impl Future<Output = ()>, Arc<Activity>) {
    let (client, io, activity) = pipe();
    let mut request = Some(activity.begin(http::Version::HTTP_2));
    let mut polls = 0;
    let conn = connection(io, move |io, cx| {
        let _open = &client;
        polls += 1;
        if polls == 2 {
            request.take();
        } else if polls == 1 || reads_later {
            let mut buf = [0; 8];
            let _ = Pin::new(io).poll_read(cx, &mut ReadBuf::new(&mut buf));
        }
    });
    (conn, activity)
}

/// A request that ends while its connection is polled, which then reads, wakes nobody; one
/// that ends while the connection waits wakes it. One that ends in a poll that reads nothing
/// after it has the connection polled again at once, and wakes it (once) only if that poll
/// reads nothing either.
#[tokio::test]
async fn a_request_wakes_its_connection_only_when_the_deadline_needs_a_look() {
    let counter = Arc::new(CountingWaker(Default::default()));
    let waker = std::task::Waker::from(counter.clone());
    let wakes = || counter.0.load(Ordering::SeqCst);
    let mut cx = Context::from_waker(&waker);
    let read = |io: &mut IdleDeadline<tokio::io::DuplexStream>, cx: &mut Context<'_>| {
        let mut buf = [0; 8];
        let _ = Pin::new(io).poll_read(cx, &mut ReadBuf::new(&mut buf));
    };

    // ends in the poll, then reads: as an HTTP/1 response body's end does
    let (_client, io, activity) = pipe();
    let mut request = Some(activity.begin(http::Version::HTTP_2));
    let conn = connection(io, move |io, cx| {
        read(io, cx);
        request.take();
        read(io, cx);
    });
    let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert_eq!(wakes(), 0);

    // ends while the connection waits
    let (_client, io, activity) = pipe();
    let request = activity.begin(http::Version::HTTP_2);
    let mut polled = std::pin::pin!(Polled::new(connection(io, read), activity.clone()));
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    drop(request);
    assert_eq!(wakes(), 1);

    // ends in a poll that reads nothing after it
    let (conn, activity) = ending_in_second_poll(false);
    let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert_eq!(wakes(), 2, "woken to look at the deadline");
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert_eq!(wakes(), 2, "once");

    // ends in a poll that reads nothing after it, and the next poll reads
    let (conn, activity) = ending_in_second_poll(true);
    let mut polled = std::pin::pin!(Polled::new(conn, activity.clone()));
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert!(polled.as_mut().poll(&mut cx).is_pending());
    assert_eq!(wakes(), 2, "polled again at once, not woken");
    assert!(
        !activity.ended.load(Ordering::SeqCst),
        "the deadline was looked at"
    );
}

/// Eviction closes an idle connection at once, and never one with a request in flight.
#[tokio::test]
async fn eviction_closes_only_idle_connections() {
    let (_client, mut io, activity) = pipe();
    let request = activity.begin(http::Version::HTTP_2);
    activity.evict();
    let mut buf = [0; 8];
    let read = tokio::time::timeout(FIRST * 2, io.read(&mut buf)).await;
    assert!(read.is_err(), "a connection with a request in flight stays");
    drop(request);
    assert!(time_to_failure(&mut io).await < FIRST);
}

/// The timer armed at the first deadline is moved on, not fired, while requests keep coming
/// before each deadline; the connection closes one idle timeout after the last of them.
#[tokio::test(start_paused = true)]
async fn requests_before_each_deadline_keep_the_connection() {
    let (_client, mut io, activity) = pipe();
    let requests = tokio::spawn(async move {
        for _ in 0..8 {
            tokio::time::sleep(FIRST * 2 / 3).await;
            drop(activity.begin(http::Version::HTTP_2));
        }
    });
    let took = time_to_failure(&mut io).await;
    let last_request = FIRST * 2 / 3 * 8;
    assert!(took >= last_request + IDLE, "{took:?}");
    assert!(took < last_request + IDLE * 2, "{took:?}");
    requests.await.unwrap();
}

/// On HTTP/1.1 the wait for the next request is a wait for its head: it ends at the head
/// timeout when that is the shorter; an HTTP/2 connection waits for the idle one.
#[tokio::test(start_paused = true)]
async fn an_http1_connection_waits_for_its_next_head_no_longer_than_the_head_timeout() {
    let (head, idle) = (Duration::from_secs(2), Duration::from_secs(10));
    for (version, bound) in [
        (http::Version::HTTP_11, head),
        (http::Version::HTTP_2, idle),
    ] {
        let (_client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleDeadline::new(server, activity.clone(), head, idle);
        drop(activity.begin(version));
        let took = time_to_failure(&mut io).await;
        assert!(
            took >= bound && took < bound + head,
            "{version:?}: {took:?}"
        );
    }
}

/// An idle timeout shorter than the head one is kept, though the timer was armed for the head.
#[tokio::test(start_paused = true)]
async fn a_shorter_idle_timeout_is_not_overslept() {
    let (_client, server) = tokio::io::duplex(64);
    let activity = Arc::new(Activity::default());
    let (head, idle) = (Duration::from_secs(10), Duration::from_secs(1));
    let mut io = IdleDeadline::new(server, activity.clone(), head, idle);
    let mut buf = [0; 8];
    let first = tokio::time::timeout(Duration::from_millis(100), io.read(&mut buf)).await;
    assert!(first.is_err(), "the head deadline is 10 s away");
    drop(activity.begin(http::Version::HTTP_2));
    let took = time_to_failure(&mut io).await;
    assert!(took >= idle && took < idle * 2, "{took:?}");
}
