//! A finished request's bookkeeping, done after its answer is written.
//!
//! hyper drops a response body as soon as the body's last bytes are buffered, and writes them
//! later in the same poll of the connection, so whatever a body does when it ends delays the
//! end of the answer. Reading the token counts, counting the request and logging it (about 6,500
//! instructions for a small chat answer, a ninth of corral's work on it) is therefore queued
//! while a connection is polled and done when the poll returns ([`after_the_write`]), as nginx
//! writes its access log after the response. The requests in flight and the leases are let go
//! at once, as before: only the bookkeeping waits, and for no more than the rest of the poll.
//!
//! Whatever reads what a settle writes (every management route: the metrics, the activity log,
//! its captures) settles every thread's queue first ([`settle_all`]), so an answer its client has
//! received is always counted, whichever thread serves the reader. Outside a connection's poll
//! (a body dropped elsewhere, tests) a request is settled at once.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::usage::UsageTap;
use super::ActivityRecord;
use crate::metrics::{KeySeries, RequestSeries};
use crate::observe::activity::Entry;
use crate::observe::captures::Recording;

/// A finished request, as its bookkeeping needs it.
pub(crate) struct Pending {
    pub(crate) series: Arc<RequestSeries>,
    pub(crate) key_series: Option<KeySeries>,
    /// The label of the API key the request presented, for its activity row.
    pub(crate) key: Option<Arc<str>>,
    pub(crate) model: Arc<str>,
    /// From the request's start to its body's end, taken when the body ended.
    pub(crate) elapsed: Duration,
    pub(crate) ttft_ms: Option<u64>,
    pub(crate) usage: UsageTap,
    pub(crate) activity: Option<Logged>,
    pub(crate) recording: Option<Recording>,
}

/// Where a finished request is logged, and the id and time it ended at.
pub(crate) struct Logged {
    pub(crate) record: ActivityRecord,
    pub(crate) id: u64,
    pub(crate) time: SystemTime,
}

impl Logged {
    /// The log's place for a request whose answer ends now.
    pub(crate) fn now(record: ActivityRecord) -> Logged {
        Logged {
            id: record.log.next_id(),
            time: SystemTime::now(),
            record,
        }
    }
}

impl Pending {
    /// Counts and logs the request.
    fn settle(mut self) {
        let failed = self
            .activity
            .as_ref()
            .is_some_and(|a| a.record.status >= 400);
        let (tokens, error) = self.usage.finish(failed);
        self.series.answered.inc();
        self.series.duration.observe(self.elapsed.as_secs_f64());
        if let Some(t) = tokens {
            self.series.prompt_tokens.inc_by(t.prompt);
            self.series.completion_tokens.inc_by(t.completion);
        }
        if let Some(by_key) = &self.key_series {
            by_key.answered.inc();
            if let Some(t) = tokens {
                by_key.prompt_tokens.inc_by(t.prompt);
                by_key.completion_tokens.inc_by(t.completion);
            }
        }
        let Some(Logged {
            record: a,
            id,
            time,
        }) = self.activity
        else {
            return;
        };
        let error = error.or_else(|| failed.then(|| reason(a.status)));
        let entry = Entry {
            model: self.model,
            req_path: a.req_path,
            status: a.status,
            content_type: a.content_type,
            tokens,
            duration_ms: self.elapsed.as_millis() as u64,
            ttft_ms: self.ttft_ms,
            error,
            capture: self.recording.map(Recording::finish),
            key: self.key,
            src: Some(a.src),
        };
        a.log.record_as(id, time, entry);
    }
}

/// The status line's reason, as the logged error of a failed answer without a message.
fn reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("error")
        .to_string()
}

/// One thread's finished requests, waiting for the end of the connection poll they ended in.
#[derive(Default)]
struct Queue {
    pending: Mutex<Vec<Pending>>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, pending: Pending) {
        self.lock().push(pending);
    }

    /// Settles what is queued. The lock is held throughout, so that a reader that finds the queue
    /// empty knows that everything queued before has been settled.
    fn settle(&self) {
        let mut queue = self.lock();
        for pending in queue.drain(..) {
            pending.settle();
        }
    }
}

/// Every thread's queue, for the readers.
static QUEUES: Mutex<Vec<Arc<Queue>>> = Mutex::new(Vec::new());

fn queues() -> MutexGuard<'static, Vec<Arc<Queue>>> {
    QUEUES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread's queue, listed for the readers while the thread lives.
struct Listed(Arc<Queue>);

impl Listed {
    fn new() -> Listed {
        let queue = Arc::new(Queue::default());
        queues().push(queue.clone());
        Listed(queue)
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        queues().retain(|q| !Arc::ptr_eq(q, &self.0));
        self.0.settle();
    }
}

thread_local! {
    static HERE: Listed = Listed::new();
    /// Set while a connection is polled ([`after_the_write`]).
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
    /// Something was queued in this poll.
    static QUEUED: Cell<bool> = const { Cell::new(false) };
}

/// Queues a finished request until the end of the connection poll it ended in, or settles it
/// at once outside one.
pub(crate) fn queue(pending: Pending) {
    let mut pending = Some(pending);
    if DEFERRING.try_with(Cell::get).unwrap_or(false) {
        // none while the thread's locals are being torn down
        let _ = HERE.try_with(|q| {
            if let Some(p) = pending.take() {
                q.0.push(p);
                QUEUED.set(true);
            }
        });
    }
    if let Some(p) = pending {
        p.settle();
    }
}

/// Polls a connection (`poll`), then settles what ended in the poll: hyper writes an answer's
/// last bytes in the same poll in which it drops the answer's body, so the bookkeeping comes
/// after the write.
pub fn after_the_write<R>(poll: impl FnOnce() -> R) -> R {
    let outer = DEFERRING.replace(true);
    let _settle = SettleAfter { outer };
    poll()
}

/// Ends a connection poll: the flag put back, and (unless the poll panicked) what it queued
/// settled.
struct SettleAfter {
    outer: bool,
}

impl Drop for SettleAfter {
    fn drop(&mut self) {
        DEFERRING.set(self.outer);
        if !self.outer && !std::thread::panicking() && QUEUED.replace(false) {
            HERE.with(|q| q.0.settle());
        }
    }
}

/// Settles every thread's queue: called before anything that reads the counts or the log.
pub fn settle_all() {
    // the registry, then each queue: the order every lock is taken in
    for queue in queues().iter() {
        queue.settle();
    }
}

#[cfg(test)]
mod tests;
