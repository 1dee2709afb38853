//! How a connection's first bytes tell its protocol: HTTP/2's preface, or HTTP/1. They are peeked
//! at and left in the socket, so hyper reads them as on a connection of its own (see
//! `connection.rs`); the deadlines that wrap a stream pass the peek through.

use std::io;
use std::mem::MaybeUninit;
use std::task::{ready, Context, Poll};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// HTTP/2's connection preface (RFC 9113, section 3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// What a connection's first bytes say: `None` while they are a beginning of the preface. No
/// bytes (the client closed) is HTTP/1, which reads the end and closes.
pub(crate) fn protocol(first: &[u8]) -> Option<Protocol> {
    if first.starts_with(PREFACE) {
        Some(Protocol::Http2)
    } else if !first.is_empty() && PREFACE.starts_with(first) {
        None
    } else {
        Some(Protocol::Http1)
    }
}

/// A stream whose first bytes can be looked at without taking them.
pub trait Peek {
    /// Ready once the first bytes tell the protocol.
    fn poll_protocol(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Protocol>>;
}

impl Peek for TcpStream {
    fn poll_protocol(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Protocol>> {
        // how many bytes the last peek of this poll saw
        let mut seen = None;
        loop {
            ready!(self.poll_read_ready(cx))?;
            let peeked = self.try_io(Interest::READABLE, || {
                let mut first = [MaybeUninit::uninit(); PREFACE.len()];
                let n = socket2::SockRef::from(&*self).peek(&mut first)?;
                match protocol(peeked_bytes(&first, n)) {
                    Some(told) => Ok(told),
                    // ready again with no new byte: the client closed after a beginning of the
                    // preface (a closed socket stays readable, so waiting would spin for good);
                    // HTTP/1 reads the end and closes
                    None if seen == Some(n) => Ok(Protocol::Http1),
                    // a beginning of the preface clears the readiness, as a read that would
                    // block does: the next poll waits for more bytes
                    None => {
                        seen = Some(n);
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                }
            });
            match peeked {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                told => return Poll::Ready(told),
            }
        }
    }
}

/// The first `n` bytes of `buf`, which a peek has just written.
#[allow(unsafe_code)]
fn peeked_bytes(buf: &[MaybeUninit<u8>], n: usize) -> &[u8] {
    let n = n.min(buf.len());
    // SAFETY: `recv` wrote the first `n` bytes of `buf` (and never more than its length)
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) }
}
