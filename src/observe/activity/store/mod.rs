//! The activity log on disk (`store.path`): SQLite in WAL mode, so the log outlives a restart.
//!
//! Requests never wait on the disk: a finished request hands its row to a bounded channel (a full
//! channel drops the row from the file, never the request), and one writer thread inserts what
//! arrived in one transaction every 100 ms, pruning old rows as it goes. At start the newest rows
//! are read back for the in-memory log.
//!
//! The file is corral's alone: created readable by its owner only (SQLite gives its `-wal` and
//! `-shm` files the same mode), and held by one corral at a time through an exclusive lock on
//! `<path>.lock`, since two writers would overwrite each other's rows. A file that is not a SQLite
//! database, or one SQLite finds damaged, is left as it is and corral refuses it, naming it: a
//! file someone cares about is never written over or moved.

pub(crate) mod rows;

use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use rusqlite::{Connection, ErrorCode};

use crate::observe::activity::Row;

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
    /// The lock on `<path>.lock`, held while the store is open; dropped after the writer ends.
    _lock: Flock<File>,
}

/// An opened store, the newest rows it held (oldest first) and the id the next row takes.
pub struct Opened {
    pub store: Store,
    pub rows: Vec<Row>,
    pub next_id: u64,
}

impl Store {
    /// Opens (or creates) the file at `path` and reads back its newest `keep` rows; the error
    /// names the path and what to do.
    pub fn open(path: &Path, keep: usize, retention: Retention) -> Result<Opened, OpenError> {
        let lock = lock(path)?;
        let conn = open_file(path)?;
        let failed = |why: rusqlite::Error| OpenError::Unusable {
            path: path.to_owned(),
            why: why.to_string(),
        };
        rows::prune(&conn, retention, SystemTime::now())
            .unwrap_or_else(|e| tracing::warn!("store: pruning failed: {e}"));
        let (rows, next_id) = rows::newest(&conn, keep).map_err(failed)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_MAX);
        let writer = std::thread::Builder::new()
            .name("corral-store".into())
            .spawn(move || write_loop(conn, rx, retention))
            .map_err(|e| OpenError::Unusable {
                path: path.to_owned(),
                why: format!("cannot start its writer: {e}"),
            })?;
        let store = Store {
            tx: Some(tx),
            writer: Some(writer),
            overflowed: AtomicBool::new(false),
            _lock: lock,
        };
        Ok(Opened {
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

/// Why the store cannot be used; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "store.path {path:?} is in use by another corral (it holds the lock {lock:?}): give each \
         corral a store of its own"
    )]
    Locked { path: PathBuf, lock: PathBuf },
    #[error(
        "store.path {path:?} is not a usable SQLite database ({why}); it was left as it is: move \
         it away, or set store.path to another file"
    )]
    NotSqlite { path: PathBuf, why: String },
    #[error("store.path {path:?} cannot be used: {why}")]
    Unusable { path: PathBuf, why: String },
}

/// `<path><suffix>`: the files beside the store.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Takes the exclusive lock on `<path>.lock` (made readable by its owner only), without waiting:
/// another corral holding it is an error.
fn lock(path: &Path) -> Result<Flock<File>, OpenError> {
    let lock_path = beside(path, ".lock");
    let unusable = |why: String| OpenError::Unusable {
        path: path.to_owned(),
        why,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| unusable(format!("cannot open its lock {lock_path:?}: {e}")))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
        nix::errno::Errno::EWOULDBLOCK => OpenError::Locked {
            path: path.to_owned(),
            lock: lock_path.clone(),
        },
        e => unusable(format!("cannot lock {lock_path:?}: {e}")),
    })
}

/// Opens the store's file, created readable by its owner only when it is not there yet.
fn open_file(path: &Path) -> Result<Connection, OpenError> {
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let existed = match created {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => true,
        Err(e) => {
            return Err(OpenError::Unusable {
                path: path.to_owned(),
                why: e.to_string(),
            })
        }
    };
    let conn = prepare(path).map_err(|e| match e {
        Failure::Corrupt(why) => OpenError::NotSqlite {
            path: path.to_owned(),
            why,
        },
        Failure::Other(why) => OpenError::Unusable {
            path: path.to_owned(),
            why,
        },
    })?;
    if existed {
        warn_if_shared(path);
    }
    Ok(conn)
}

/// A store made before corral created them owner-only may be readable by others: said, not
/// changed, since the file is the user's.
fn warn_if_shared(path: &Path) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if meta.is_file() && mode & 0o077 != 0 {
        tracing::warn!(
            "store: {path:?} is readable by others (mode {mode:o}), and so are its -wal and -shm \
             files: `chmod 600` it to keep the activity log private"
        );
    }
}

/// Why SQLite could not open a file: damaged or not a database, or anything else.
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
    rows::migrate(&conn)?;
    Ok(conn)
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
