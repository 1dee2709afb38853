//! The activity log on disk (`store.path`): SQLite in WAL mode, so the log outlives a restart.
//!
//! Requests never wait on the disk: a finished request hands its row to a bounded channel (a full
//! channel drops the row from the file, never the request), and one writer thread inserts what
//! arrived in one transaction every 100 ms, pruning old rows as it goes. At start the newest rows
//! are read back for the in-memory log. A file that is not a SQLite database, or one SQLite finds
//! corrupt, is renamed aside (`<path>.corrupt-<unix time>`) and a fresh one started: a file someone
//! cares about is never written over.

pub(super) mod rows;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode};

use crate::api::activity::Row;

/// How long a written row may wait for others to share its transaction.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Most rows in one transaction.
const BATCH_MAX: usize = 512;
/// Rows waiting for the writer; beyond it rows are left out of the file (the log in memory still
/// has them), so a stalled disk cannot hold memory or requests.
const QUEUE_MAX: usize = 16_384;
/// Rows written, or time passed, between two prunes.
const PRUNE_EVERY_ROWS: usize = 1000;
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How much of the log the file keeps.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_rows: u64,
    /// The bytes of the newest rows kept, as [`rows::ROW_BYTES`] counts them.
    pub max_bytes: u64,
    pub max_age: Duration,
}

impl Default for Retention {
    /// The newest 100,000 rows of the last 30 days, and of them no more than 64 MiB: rows of
    /// about 200 bytes, as most are, stay within the count, and rows made large on purpose
    /// (each is at most about 7 KiB) within the bytes.
    fn default() -> Self {
        Retention {
            max_rows: 100_000,
            max_bytes: 64 << 20,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// The open file: the channel to its writer thread.
pub struct Store {
    tx: Option<SyncSender<Row>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Set once a full channel dropped a row, so the warning is logged once.
    overflowed: AtomicBool,
}

/// An opened store, the newest rows it held (oldest first) and the id the next row takes.
pub struct Opened {
    pub store: Store,
    pub rows: Vec<Row>,
    pub next_id: u64,
}

impl Store {
    /// Opens (or creates) the file at `path` and reads back its newest `keep` rows. `None` when
    /// the file cannot be used at all (the reason is logged): the log then lives in memory only.
    pub fn open(path: &Path, keep: usize, retention: Retention) -> Option<Opened> {
        let conn = match prepare(path) {
            Ok(conn) => conn,
            Err(Failure::Corrupt(why)) => {
                let aside = quarantine(path)
                    .map_err(|e| tracing::error!("store: cannot move {path:?} aside: {e}"))
                    .ok()?;
                tracing::error!(
                    "store: {path:?} is not a usable SQLite database ({why}); moved it to \
                     {aside:?} and started a new one"
                );
                prepare(path)
                    .map_err(|e| tracing::error!("store: {path:?}: {e}"))
                    .ok()?
            }
            Err(Failure::Other(why)) => {
                tracing::error!(
                    "store: cannot open {path:?}: {why}; the activity log stays in memory"
                );
                return None;
            }
        };
        rows::prune(&conn, retention, SystemTime::now())
            .unwrap_or_else(|e| tracing::warn!("store: pruning failed: {e}"));
        let (rows, next_id) = match rows::newest(&conn, keep) {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(
                    "store: cannot read {path:?}: {e}; the activity log stays in memory"
                );
                return None;
            }
        };
        let (tx, rx) = mpsc::sync_channel(QUEUE_MAX);
        let writer = std::thread::Builder::new()
            .name("corral-store".into())
            .spawn(move || write_loop(conn, rx, retention))
            .map_err(|e| tracing::error!("store: cannot start its writer: {e}"))
            .ok()?;
        let store = Store {
            tx: Some(tx),
            writer: Some(writer),
            overflowed: AtomicBool::new(false),
        };
        Some(Opened {
            store,
            rows,
            next_id,
        })
    }

    /// Queues a row for the file; never blocks.
    pub fn save(&self, row: Row) {
        let Some(tx) = &self.tx else { return };
        if let Err(TrySendError::Full(_)) = tx.try_send(row) {
            if !self.overflowed.swap(true, Ordering::Relaxed) {
                tracing::warn!("store: the disk falls behind; some activity rows are not saved");
            }
        }
    }
}

impl Drop for Store {
    /// Closes the channel and waits for the writer to commit what it holds, so a restart right
    /// after finds every row.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Why a file could not be opened: damaged (it is moved aside), or anything else (it is left).
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("damaged: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Other(String),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                Failure::Corrupt(e.to_string())
            }
            _ => Failure::Other(e.to_string()),
        }
    }
}

/// Opens the file in WAL mode, checks it, and makes the table.
fn prepare(path: &Path) -> Result<Connection, Failure> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))?;
    let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
    if check != "ok" {
        return Err(Failure::Corrupt(check));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(rows::SCHEMA)?;
    Ok(conn)
}

/// Renames a damaged file (and its WAL and shared-memory files) to `<path>.corrupt-<unix time>`,
/// with a number added should that name be taken.
fn quarantine(path: &Path) -> std::io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let with = |suffix: &str| {
        let mut s = path.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    let aside = (0..)
        .map(|n| match n {
            0 => with(&format!(".corrupt-{secs}")),
            n => with(&format!(".corrupt-{secs}-{n}")),
        })
        .find(|p| !p.exists())
        .expect("an unbounded range has a free name");
    std::fs::rename(path, &aside)?;
    for side in ["-wal", "-shm"] {
        let from = with(side);
        if from.exists() {
            let mut to = aside.clone().into_os_string();
            to.push(side);
            std::fs::rename(from, to)?;
        }
    }
    Ok(aside)
}

/// The writer thread: waits for a row, gathers what follows within `FLUSH_EVERY`, writes it in one
/// transaction, prunes now and then; commits and prunes what is left when the channel closes.
fn write_loop(mut conn: Connection, rx: mpsc::Receiver<Row>, retention: Retention) {
    let (mut since_prune, mut pruned_at) = (0, Instant::now());
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let until = Instant::now() + FLUSH_EVERY;
        let mut closed = false;
        while batch.len() < BATCH_MAX {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(row) => batch.push(row),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if let Err(e) = rows::insert(&mut conn, &batch) {
            tracing::warn!("store: writing {} activity rows failed: {e}", batch.len());
        }
        since_prune += batch.len();
        if closed || since_prune >= PRUNE_EVERY_ROWS || pruned_at.elapsed() >= PRUNE_EVERY {
            rows::prune(&conn, retention, SystemTime::now())
                .unwrap_or_else(|e| tracing::warn!("store: pruning failed: {e}"));
            (since_prune, pruned_at) = (0, Instant::now());
        }
        if closed {
            break;
        }
    }
}

#[cfg(test)]
mod tests;
