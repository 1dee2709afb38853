//! Log rings: the last 100 KiB of each stream, with live subscribers that can never block a writer.

pub mod logging;
pub mod redact;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::broadcast;

pub const RING_BYTES: usize = 100 * 1024;

/// A bounded byte history plus a broadcast of new writes. A subscriber that falls behind loses bytes
/// (and is told how many), the writer never waits.
pub struct LogRing {
    history: Mutex<History>,
    last_write: Mutex<Option<std::time::Instant>>,
    live: broadcast::Sender<Bytes>,
    capacity: usize,
}

/// The newest bytes written, and how many were ever written (so a position in the output outlives
/// the bytes that fall out of the ring).
#[derive(Default)]
struct History {
    bytes: VecDeque<u8>,
    written: u64,
}

/// A position in a ring's output: where something (one start of an engine) began writing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogMark(u64);

impl Default for LogRing {
    fn default() -> Self {
        LogRing::new(RING_BYTES)
    }
}

impl LogRing {
    pub fn new(capacity: usize) -> Self {
        LogRing {
            history: Mutex::new(History::default()),
            last_write: Mutex::new(None),
            live: broadcast::channel(1024).0,
            capacity,
        }
    }

    pub fn write(&self, data: &[u8]) {
        {
            let mut h = self.lock();
            h.written += data.len() as u64;
            let data = &data[data.len().saturating_sub(self.capacity)..];
            let overflow = (h.bytes.len() + data.len()).saturating_sub(self.capacity);
            h.bytes.drain(..overflow);
            h.bytes.extend(data);
        }
        *self.last_write.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now());
        let _ = self.live.send(Bytes::copy_from_slice(data));
    }

    /// Notes output that is not written yet (a line still being printed): progress all the same.
    pub fn touch(&self) {
        *self.last_write.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now());
    }

    /// When something was last written: a loading engine that prints is making progress.
    pub fn last_write(&self) -> Option<std::time::Instant> {
        *self.last_write.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn history(&self) -> Vec<u8> {
        self.since(LogMark::default())
    }

    /// Where the output written from now on begins.
    pub fn mark(&self) -> LogMark {
        LogMark(self.lock().written)
    }

    /// What was written since `mark`, as much of it as the ring still holds.
    pub fn since(&self, mark: LogMark) -> Vec<u8> {
        let h = self.lock();
        let new = usize::try_from(h.written - mark.0).unwrap_or(usize::MAX);
        h.bytes
            .range(h.bytes.len().saturating_sub(new)..)
            .copied()
            .collect()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Bytes> {
        self.live.subscribe()
    }

    /// The last `n` lines written since `mark`, for error messages.
    pub fn tail_lines(&self, mark: LogMark, n: usize) -> String {
        let text = String::from_utf8_lossy(&self.since(mark)).into_owned();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// corral's own log lines go here as well as to tracing, so `/logs` shows them.
#[derive(Default)]
pub struct Logs {
    pub proxy: Arc<LogRing>,
    pub upstream: Arc<LogRing>,
    /// One access line per HTTP request, kept only when `logToStdout` names `http`.
    pub http: Arc<LogRing>,
    /// What `/logs` returns: the streams chosen by `logToStdout`.
    pub combined: Arc<LogRing>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_only_the_newest_bytes() {
        let ring = LogRing::new(10);
        ring.write(b"0123456789");
        ring.write(b"abc");
        assert_eq!(ring.history(), b"3456789abc");
        ring.write(b"this is longer than ten");
        assert_eq!(ring.history(), b"r than ten");
    }

    #[test]
    fn tail_lines_skips_blank_lines() {
        let ring = LogRing::new(1000);
        ring.write(b"a\nb\n\nc\nd\n");
        assert_eq!(ring.tail_lines(LogMark::default(), 2), "c\nd");
    }

    /// A start of an engine reads back its own output only, however much came before it and
    /// however much of its own has fallen out of the ring since.
    #[test]
    fn output_since_a_mark_is_what_came_after_it() {
        let ring = LogRing::new(10);
        ring.write(b"first\n");
        let mark = ring.mark();
        assert_eq!(ring.since(mark), b"");
        ring.write(b"two\n");
        assert_eq!(ring.since(mark), b"two\n");
        assert_eq!(ring.tail_lines(mark, 20), "two");
        ring.write(b"three3\n");
        assert_eq!(
            ring.since(mark),
            b"wo\nthree3\n",
            "what the ring still holds"
        );
        assert_eq!(ring.history(), b"wo\nthree3\n");
    }

    #[tokio::test]
    async fn subscribers_see_new_writes() {
        let ring = LogRing::new(100);
        let mut rx = ring.subscribe();
        ring.write(b"hello");
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"hello"));
    }
}
