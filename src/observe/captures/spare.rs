//! Capture buffers kept for reuse by the thread that serves requests. A capture is built and
//! kept (copied into the ring) by the thread that serves its request, so its buffer comes back to
//! the same thread: with a few spares, a capture costs no `malloc`, `realloc` or `free` at all,
//! where a buffer of its own cost three (about a quarter of what a capture costs).
//!
//! Bounded: at most [`SPARES`] buffers of at most [`LARGEST`] bytes each per thread; a larger
//! one (a long conversation's) is freed.

use std::cell::RefCell;

/// Spare buffers per thread: about as many as its requests that end between two that start.
const SPARES: usize = 16;
/// The largest buffer kept: a small chat's capture takes about 1 KiB.
const LARGEST: usize = 16 << 10;
/// A new buffer's room: a request's path and head. Not more: while a thread's streams are open,
/// each holds a new buffer, and a spare grows once to what its thread's captures take.
const FIRST: usize = 256;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer: a spare when the thread has one.
pub fn take() -> Vec<u8> {
    SPARE
        .try_with(|spare| spare.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(FIRST))
}

/// Keeps `buffer` for the thread's next capture, or frees it when it is large or the thread
/// has enough spares.
pub fn give(mut buffer: Vec<u8>) {
    if buffer.capacity() > LARGEST || buffer.capacity() == 0 {
        return;
    }
    buffer.clear();
    // a thread that is ending frees it instead
    let _ = SPARE.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARES {
            spare.push(buffer);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_the_next_taken() {
        let mut first = take();
        first.extend_from_slice(b"a capture");
        let at = first.as_ptr();
        give(first);
        let again = take();
        assert!(again.is_empty(), "cleared");
        assert_eq!(again.as_ptr(), at, "the same buffer");
        assert!(
            SPARE.with(|spare| spare.borrow().is_empty()),
            "one spare, taken"
        );
    }

    #[test]
    fn large_buffers_and_more_than_enough_are_freed() {
        give(Vec::with_capacity(LARGEST + 1));
        assert_eq!(take().capacity(), FIRST, "too large to keep: a new one");
        for _ in 0..SPARES + 4 {
            give(Vec::with_capacity(64));
        }
        let kept = std::iter::from_fn(|| Some(take()))
            .take_while(|b| b.capacity() == 64)
            .count();
        assert_eq!(kept, SPARES);
    }
}
