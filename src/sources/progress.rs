//! Progress of downloads: the list in progress now, a broadcast of updates, and the byte counter.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts};
use tokio::sync::broadcast;

/// One download's state, as the dashboard, `/v1/models` and `corral pull` show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Progress {
    /// The model's source, secrets masked.
    pub source: String,
    /// The file within the source (a path in the repository, a layer, the object key).
    pub file: String,
    pub bytes: u64,
    pub total: Option<u64>,
    pub bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
    /// Other sources that wait on this same file (one blob that two names share is downloaded
    /// once, under the source that asked first), so that each of them can show its progress.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
}

impl Progress {
    /// A download of `file` for `source` that has not brought a byte yet.
    fn starting(source: &str, file: &str) -> Progress {
        Progress {
            source: source.to_string(),
            file: file.to_string(),
            bytes: 0,
            total: None,
            bytes_per_second: 0.0,
            eta_seconds: None,
            also: Vec::new(),
        }
    }
}

/// At most this many updates a second per download reach subscribers.
const EVERY: Duration = Duration::from_millis(250);

/// Shared by all downloads of one fetcher.
pub(crate) struct Board {
    active: Mutex<HashMap<PathBuf, Progress>>,
    tx: broadcast::Sender<Progress>,
    pub(crate) bytes: IntCounterVec,
}

impl Board {
    pub(crate) fn new() -> Board {
        let opts = Opts::new(
            "corral_download_bytes_total",
            "Bytes of model weights received, by source scheme",
        );
        let bytes = IntCounterVec::new(opts, &["scheme"]).expect("valid metric");
        Board {
            active: Mutex::default(),
            tx: broadcast::channel(256).0,
            bytes,
        }
    }

    pub(crate) fn list(&self) -> Vec<Progress> {
        let mut all: Vec<Progress> = self.active.lock().unwrap().values().cloned().collect();
        all.sort_by(|a, b| (&a.source, &a.file).cmp(&(&b.source, &b.file)));
        all
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Progress> {
        self.tx.subscribe()
    }

    /// `source` waits on the download of `key` too: it is told at once where the download
    /// stands (the next update may be a while off), and named by every update after.
    pub(crate) fn join(&self, key: &Path, source: &str) {
        let mut active = self.active.lock().unwrap();
        let Some(entry) = active.get_mut(key) else {
            return; // not reporting yet: its first update names the source
        };
        if entry.source != source && !entry.also.iter().any(|s| s == source) {
            entry.also.push(source.to_string());
            let _ = self.tx.send(entry.clone());
        }
    }
}

/// The sources that joined a download begun for another (see [`Progress::also`]).
pub(crate) type Joined = Arc<Mutex<Vec<String>>>;

/// One download's reporter; removes its entry from the list when dropped.
pub(crate) struct Reporter {
    board: Arc<Board>,
    key: PathBuf,
    scheme: &'static str,
    state: Progress,
    joined: Joined,
    started: Instant,
    /// Bytes held when this attempt began (a resumed part), left out of the rate.
    base: u64,
    last: Option<Instant>,
}

impl Reporter {
    pub(crate) fn new(
        board: Arc<Board>,
        key: &Path,
        scheme: &'static str,
        source: &str,
        file: &str,
        joined: Joined,
    ) -> Reporter {
        let state = Progress::starting(source, file);
        board
            .active
            .lock()
            .unwrap()
            .insert(key.to_path_buf(), state.clone());
        Reporter {
            board,
            key: key.to_path_buf(),
            scheme,
            state,
            joined,
            started: Instant::now(),
            base: 0,
            last: None,
        }
    }

    /// A new attempt begins with `held` bytes already on disk out of `total`.
    pub(crate) fn restart(&mut self, held: u64, total: Option<u64>) {
        self.state.bytes = held;
        self.state.total = total;
        self.base = held;
        self.started = Instant::now();
        self.publish(true);
    }

    pub(crate) fn advance(&mut self, n: u64) {
        self.state.bytes += n;
        self.board.bytes.with_label_values(&[self.scheme]).inc_by(n);
        self.publish(false);
    }

    /// The last update, whatever the rate limit.
    pub(crate) fn finish(&mut self) {
        self.publish(true);
    }

    fn publish(&mut self, force: bool) {
        let now = Instant::now();
        if !force && self.last.is_some_and(|t| now - t < EVERY) {
            return;
        }
        self.last = Some(now);
        let secs = (now - self.started).as_secs_f64();
        let fresh = self.state.bytes.saturating_sub(self.base) as f64;
        self.state.bytes_per_second = if secs > 0.0 { fresh / secs } else { 0.0 };
        self.state.eta_seconds = match self.state.total {
            Some(t) if self.state.bytes_per_second > 0.0 => {
                Some(t.saturating_sub(self.state.bytes) as f64 / self.state.bytes_per_second)
            }
            _ => None,
        };
        let joined = self.joined.lock().unwrap();
        let others = joined.iter().filter(|s| **s != self.state.source);
        self.state.also = others.cloned().collect();
        drop(joined);
        if let Some(entry) = self.board.active.lock().unwrap().get_mut(&self.key) {
            *entry = self.state.clone();
        }
        let _ = self.board.tx.send(self.state.clone());
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.board.active.lock().unwrap().remove(&self.key);
    }
}
