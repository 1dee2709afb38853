//! One upstream connection, driven by the task of the request that uses it ([`Conn`]), and the
//! response body that drives it while the answer streams ([`UpstreamBody`]).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;

use super::{home, Address, Connection, Upstream};
use crate::proxy::body::{Body, BoxError};

/// One HTTP/1.1 connection: the sending half and the connection future that does the I/O.
pub(super) struct Conn {
    pub(super) home: u64,
    pub(super) address: Address,
    pub(super) sender: http1::SendRequest<Body>,
    /// `None` once the connection has ended.
    pub(super) driver: Option<Pin<Box<Connection>>>,
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
    task: AtomicWaker,
}

thread_local! {
    /// The connection whose task, on this thread, is doing something to it that wakes it (see
    /// [`Wakeup::quietly`]); null outside such a window.
    static QUIETED: Cell<*const Wakeup> = const { Cell::new(std::ptr::null()) };
}

/// Ends a [`Wakeup::quietly`] window, even when what ran in it panicked.
struct Quieted(*const Wakeup);

impl Drop for Quieted {
    fn drop(&mut self) {
        QUIETED.set(self.0);
    }
}

impl Wakeup {
    /// Notes that the connection has work: the next [`Conn::drive`] polls it.
    fn mark(&self) {
        self.woken.store(true, Ordering::Release);
    }

    /// Runs `f`, something the task does to the connection itself and then drives it, without
    /// the wake-up that `f` causes waking the task. Only a wake-up on this thread is the task's
    /// own: one from another thread (a multi-thread runtime's reactor finding the socket ready
    /// meanwhile) still wakes the task, or it could sleep with work waiting.
    fn quietly<T>(&self, f: impl FnOnce() -> T) -> T {
        let _restore = Quieted(QUIETED.replace(self));
        f()
    }
}

impl std::task::Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.mark();
        if !std::ptr::eq(QUIETED.get(), Arc::as_ptr(self)) {
            self.task.wake();
        }
    }
}

impl Conn {
    pub(super) fn new(
        address: Address,
        sender: http1::SendRequest<Body>,
        driver: Connection,
    ) -> Conn {
        let wakeup = Arc::new(Wakeup::default());
        wakeup.mark();
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
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
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
    pub(super) async fn exchange(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Body>>> {
        // handing the request over wakes the connection; it is driven right below
        let mut pending = std::pin::pin!(self.wakeup.quietly(|| self.sender.try_send_request(req)));
        self.wakeup.mark();
        std::future::poll_fn(|cx| {
            self.drive(cx);
            pending
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
        })
        .await
    }
}

/// An upstream response body that drives its connection and returns it to the idle list once the
/// body has ended.
pub struct UpstreamBody {
    pub(super) incoming: Incoming,
    pub(super) conn: Option<Conn>,
    pub(super) upstream: Arc<Upstream>,
}

impl UpstreamBody {
    /// The answer is complete: the connection goes back for reuse if it is done with this
    /// exchange. One whose request body is still being sent (the upstream answered early) is
    /// closed instead: parked, nothing would drive the rest of the upload.
    fn release(&mut self, cx: &mut Context<'_>) {
        if let Some(mut conn) = self.conn.take() {
            // a poll lets the connection take in the end of the exchange and ask for the next
            conn.wakeup.mark();
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
            Poll::Ready(Some(Ok(frame))) if this.incoming.is_end_stream() => {
                this.release(cx);
                Poll::Ready(Some(Ok(frame)))
            }
            // more to come: the connection reads again before this frame is written
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame.map_data(unpinned)))),
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

/// Frames up to this size are copied out of the connection's read buffer.
const SMALL_FRAME: usize = 1024;

/// A small frame that is not the body's last (an event of a stream, most often), copied out of the
/// connection's read buffer. Held, it keeps that buffer from being reused: the client's connection
/// holds a frame until it has written it, and the upstream connection's next read comes first (the
/// writer asks for the next frame before it writes), so each event would make that read allocate
/// a new 8 KiB buffer, and the writer free the old one. Copying a few hundred bytes costs less
/// (bench/instructions.sh with SSE=1: about 5 % fewer instructions per event).
fn unpinned(data: Bytes) -> Bytes {
    if data.len() <= SMALL_FRAME {
        Bytes::copy_from_slice(&data)
    } else {
        data
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
    conn.wakeup
        .quietly(|| Pin::new(incoming).poll_frame(&mut Context::from_waker(Waker::noop())))
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
mod tests {
    use super::*;

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Inside a quiet window the task's own wake-up of its connection does not wake the task; one
    /// from another thread (the reactor of a multi-thread runtime) does, or it would be lost.
    #[test]
    fn only_the_tasks_own_wake_up_is_quiet() {
        let wakeup = Arc::new(Wakeup::default());
        let task = Arc::new(Count(Default::default()));
        wakeup.task.register(&Waker::from(task.clone()));
        let conn_waker = Waker::from(wakeup.clone());
        wakeup.quietly(|| conn_waker.wake_by_ref());
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task's own wake-up");
        assert!(wakeup.woken.swap(false, Ordering::SeqCst));
        wakeup.quietly(|| {
            std::thread::scope(|s| {
                s.spawn(|| conn_waker.wake_by_ref());
            })
        });
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "another thread's wake-up");
        conn_waker.wake_by_ref();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "woken once until registered again"
        );
    }

    /// A small frame no longer holds the read buffer it was cut from; a large one is passed on
    /// as it is.
    #[test]
    fn a_small_frame_lets_its_read_buffer_go() {
        let read_buffer = Bytes::from(vec![b'x'; 8192]);
        let small = unpinned(read_buffer.slice(..SMALL_FRAME));
        assert!(read_buffer.is_unique(), "the buffer can be read into again");
        assert_eq!(&small[..], &read_buffer[..SMALL_FRAME]);
        let large = unpinned(read_buffer.slice(..SMALL_FRAME + 1));
        assert!(!read_buffer.is_unique());
        assert_eq!(large.len(), SMALL_FRAME + 1);
    }
}
