//! One file's download: streamed to `<dest>.incomplete` beside its destination (the suffix the
//! Hub's own client uses, so either side resumes the other's part), resumed with a range request
//! after a dropped connection, digested while it streams, stopped the moment it passes the size
//! the source gave, and renamed into place only once whole and verified. The cache may be shared
//! with other users: no folder, part or lock file there is used through a link (see `cache_fs`),
//! and a file found already in place is checked against its digest before it is used. The part
//! and the version it holds are `part`'s, the lock across processes `lock`'s.

use std::io::Read;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::io::{AsyncWriteExt, BufWriter};

use super::cache_fs;
use super::lock::lock;
use super::part::{held_part, partial, read_version, record_version, remove_partial, version_file};
use super::progress::Reporter;
use super::transport::{Failure, Opened, Transport};
use super::verified::Ledger;
use super::verify::{Hasher, Verify};
use super::{disk, FetchError};

/// Tries in a row that bring no byte before a network failure is final: with the pauses between
/// them (0.2 s, doubling, at most 30 s) they ride out about 25 s of network trouble.
const ATTEMPTS: u32 = 8;
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// What to download and how to check it.
#[derive(Clone)]
pub(crate) struct Job {
    /// The model's source as shown.
    pub src: String,
    pub scheme: &'static str,
    /// The file's name within the source, for progress and errors.
    pub file: String,
    /// The cache `dest` lies in, as configured: the folders below it are never links.
    pub root: PathBuf,
    pub dest: PathBuf,
    pub size: Option<u64>,
    pub verify: Verify,
    pub transport: Transport,
}

/// Downloads `job.dest` and returns its size; a file already there is checked against the job's
/// digest instead (`ledger` remembers the files checked).
pub(crate) async fn run(
    job: &Job,
    report: &mut Reporter,
    ledger: &Arc<Ledger>,
) -> Result<u64, FetchError> {
    let dir = job.dest.parent().unwrap_or(Path::new("."));
    cache_fs::make_dirs(&job.root, dir).map_err(|e| FetchError::io(&job.src, dir, e))?;
    // one download of a file at a time across processes too (another corral, `corral pull`,
    // the Hub's own client): whoever waited finds the file whole
    let _lock = lock(&job.root, &job.dest, &job.src).await?;
    if let Some(size) = in_place(job, ledger).await? {
        report.finish();
        return Ok(size);
    }
    download(job, dir, report, ledger).await
}

/// Tries until the file is whole and verified in place, pausing after each failure, and gives up
/// once [`ATTEMPTS`] tries in a row have brought nothing.
async fn download(
    job: &Job,
    dir: &Path,
    report: &mut Reporter,
    ledger: &Ledger,
) -> Result<u64, FetchError> {
    let part = partial(&job.dest);
    let mut retries = Retries::default();
    let mut state = Digest::new(job);
    let mut version = None;
    loop {
        retries.pause(job).await?;
        let before = state.at;
        match attempt(job, &part, dir, &mut state, &mut version, report).await? {
            Attempt::Whole => return finish(job, &part, state, report, ledger).await,
            Attempt::Held => match finish(job, &part, state, report, ledger).await {
                // not the file after all (another tool's part, say): it is gone, fetch it whole
                Err(FetchError::Checksum { .. }) => state = Digest::new(job),
                done => return done,
            },
            Attempt::Failed(why) => retries.failed(why, state.at > before),
            Attempt::Again => {}
        }
    }
}

/// The size of `job.dest` when it is in place already and matches the job's digest; `None` when
/// it is missing. A link or a file that does not match is an error that leaves it as it is.
async fn in_place(job: &Job, ledger: &Arc<Ledger>) -> Result<Option<u64>, FetchError> {
    let meta = match std::fs::symlink_metadata(&job.dest) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FetchError::io(&job.src, &job.dest, e)),
    };
    if meta.file_type().is_symlink() {
        let e = cache_fs::linked(&job.dest);
        return Err(FetchError::io(&job.src, &job.dest, e));
    }
    ledger
        .check_async(&job.src, &job.file, &job.dest, &job.verify)
        .await?;
    Ok(Some(meta.len()))
}

/// How one try at a download ended, when not with an error that ends it for good.
enum Attempt {
    /// Every byte is in the partial file, to be verified.
    Whole,
    /// Every byte was in the partial file already, left by an earlier run: verified, and
    /// fetched again whole if it fails.
    Held,
    /// A failure that counts against the tries, and why.
    Failed(String),
    /// The partial file was dropped; try again at once without counting a failure.
    Again,
}

/// One try: opens the source from what the partial file holds and streams the rest into it.
async fn attempt(
    job: &Job,
    part: &Path,
    dir: &Path,
    state: &mut Digest,
    version: &mut Option<String>,
    report: &mut Reporter,
) -> Result<Attempt, FetchError> {
    let have = match usable_part(job, part, version)? {
        ControlFlow::Continue(have) => have,
        ControlFlow::Break(ended) => return Ok(ended),
    };
    if have > 0 && job.size == Some(have) {
        // every byte came before a run ended short of the rename: only the check is left
        // (asked for, the rest is an empty range, which S3 refuses)
        state.rewind(job, part, have).await?;
        return Ok(Attempt::Held);
    }
    let opened = match open(job, part, have, version).await? {
        ControlFlow::Continue(opened) => opened,
        ControlFlow::Break(failed) => return Ok(failed),
    };
    transfer(job, part, dir, opened, state, version, report).await
}

/// The bytes of the partial file a try can build on. A part longer than the file is removed and
/// the try ends there, to start again at once; a part whose version is not known, with no digest
/// to catch a mix of two versions, cannot be resumed and is dropped.
fn usable_part(
    job: &Job,
    part: &Path,
    version: &mut Option<String>,
) -> Result<ControlFlow<Attempt, u64>, FetchError> {
    let mut have = held_part(part).map_err(|e| FetchError::io(&job.src, part, e))?;
    if job.size.is_some_and(|s| have > s) {
        // longer than the file: not a part of it; tried again once it is gone (and an error,
        // not another try at once, when it cannot go)
        std::fs::remove_file(part).map_err(|e| FetchError::io(&job.src, part, e))?;
        let _ = std::fs::remove_file(version_file(part));
        return Ok(ControlFlow::Break(Attempt::Again));
    }
    if have > 0 && version.is_none() {
        *version = read_version(part);
        if version.is_none() && !job.verify.is_digest() {
            // which version of the file it holds is not known, and no digest would tell a
            // part of one version followed by the rest of another: it cannot be resumed
            remove_partial(part);
            have = 0;
        }
    }
    Ok(ControlFlow::Continue(have))
}

/// Asks the source for the file from byte `have`; a refused range drops the part (and the version
/// it held), and both it and a passing failure end the try as a failed one.
async fn open(
    job: &Job,
    part: &Path,
    have: u64,
    version: &mut Option<String>,
) -> Result<ControlFlow<Attempt, Opened>, FetchError> {
    let opened = job
        .transport
        .open(&job.src, &job.file, have, version.as_deref())
        .await;
    match opened {
        Ok(o) => Ok(ControlFlow::Continue(o)),
        Err(Failure::Fatal(e)) => Err(e),
        Err(Failure::Restart) => {
            remove_partial(part);
            *version = None;
            let why = "the server refused the range of the partial file, or the file changed";
            Ok(ControlFlow::Break(Attempt::Failed(why.into())))
        }
        Err(Failure::Retry(why)) => Ok(ControlFlow::Break(Attempt::Failed(why))),
    }
}

/// Streams an opened answer into the part, once its size agrees with the listed one and the disk
/// has room for the rest; a connection that ends short is a failed try.
async fn transfer(
    job: &Job,
    part: &Path,
    dir: &Path,
    opened: Opened,
    state: &mut Digest,
    version: &mut Option<String>,
    report: &mut Reporter,
) -> Result<Attempt, FetchError> {
    let total = expected_total(job, dir, &opened)?;
    if opened.start == 0 {
        start_afresh(part, version, &opened);
    }
    state.rewind(job, part, opened.start).await?;
    report.restart(opened.start, total);
    match stream_into(job, part, opened, total, state, report).await {
        Ok(()) => {}
        Err(Step::Retry(why)) => return Ok(Attempt::Failed(why)),
        Err(Step::Fatal(e)) => return Err(e),
    }
    Ok(match total.filter(|&t| t != state.at) {
        Some(t) => Attempt::Failed(format!(
            "the connection ended after {} of {t} bytes",
            state.at
        )),
        None => Attempt::Whole,
    })
}

/// The file's size, from the answer else the listing: an error when the two disagree, or when
/// the disk cannot hold what is still to come.
fn expected_total(job: &Job, dir: &Path, opened: &Opened) -> Result<Option<u64>, FetchError> {
    let total = opened.total.or(job.size);
    if let (Some(expected), Some(got)) = (job.size, opened.total) {
        if expected != got {
            return Err(FetchError::invalid(
                &job.src,
                format!(
                    "{}: the server sends {got} bytes where {expected} were listed",
                    job.file
                ),
            ));
        }
    }
    if let Some(t) = total {
        disk::ensure_room(&job.src, dir, t.saturating_sub(opened.start))?;
    }
    Ok(total)
}

/// Drops the part held (if any) before the version of what comes is recorded, so the two never
/// disagree, however this run ends.
fn start_afresh(part: &Path, version: &mut Option<String>, opened: &Opened) {
    remove_partial(part);
    *version = opened.version.clone();
    record_version(part, version.as_deref());
}

/// Failed tries in a row, and why the last one failed (the error once they run out).
#[derive(Default)]
struct Retries {
    failures: u32,
    last_error: String,
}

impl Retries {
    /// A try failed; one that brought bytes first starts the count again, so a long download
    /// over a connection that keeps dropping goes on for as long as it advances.
    fn failed(&mut self, why: String, progressed: bool) {
        self.failures = if progressed { 1 } else { self.failures + 1 };
        self.last_error = why;
    }

    /// Waits before a try after a failure, twice as long after each (at most
    /// [`LONGEST_PAUSE`]); the final error once [`ATTEMPTS`] tries in a row have failed.
    async fn pause(&self, job: &Job) -> Result<(), FetchError> {
        if self.failures == 0 {
            return Ok(());
        }
        if self.failures >= ATTEMPTS {
            return Err(FetchError::Network {
                src: job.src.clone(),
                file: job.file.clone(),
                attempts: self.failures,
                detail: self.last_error.clone(),
            });
        }
        let pause = FIRST_PAUSE.saturating_mul(1 << (self.failures - 1).min(16));
        tokio::time::sleep(pause.min(LONGEST_PAUSE)).await;
        Ok(())
    }
}

/// The digest of the first `at` bytes of the partial file.
struct Digest {
    hasher: Hasher,
    at: u64,
}

impl Digest {
    /// The digest of nothing yet.
    fn new(job: &Job) -> Digest {
        Digest {
            hasher: Hasher::new(&job.verify, job.size),
            at: 0,
        }
    }

    /// Brings the digest to `start`: kept when it is already there (a resume within this run),
    /// else computed again from the bytes on disk (a part left by an earlier run), on a thread
    /// of its own: reading back gigabytes would otherwise hold up every task of the runtime.
    async fn rewind(&mut self, job: &Job, part: &Path, start: u64) -> Result<(), FetchError> {
        if start == self.at {
            return Ok(());
        }
        let mut fresh = Digest::new(job);
        if start > 0 {
            let path = part.to_path_buf();
            let read = tokio::task::spawn_blocking(move || {
                let done = fresh.read_from(&path, start);
                (fresh, done)
            });
            let (read, done) = read
                .await
                .map_err(|e| FetchError::invalid(&job.src, e.to_string()))?;
            done.map_err(|e| FetchError::io(&job.src, part, e))?;
            fresh = read;
        }
        *self = fresh;
        Ok(())
    }

    /// Digests the first `len` bytes of `path`.
    fn read_from(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        let file = cache_fs::open_existing(path, false)?;
        let mut reader = std::io::BufReader::new(file.take(len));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            self.hasher.update(&buf[..n]);
            self.at += n as u64;
        }
    }
}

enum Step {
    Retry(String),
    Fatal(FetchError),
}

/// Streams the answer into the part from `opened.start`, stopping with an error the moment it
/// passes `total`, the size the source gave: more is not the file, and would fill the disk.
async fn stream_into(
    job: &Job,
    part: &Path,
    opened: Opened,
    total: Option<u64>,
    state: &mut Digest,
    report: &mut Reporter,
) -> Result<(), Step> {
    let io = |e| Step::Fatal(FetchError::io(&job.src, part, e));
    let mut file = open_part(part, opened.start).await.map_err(io)?;
    let dropped = copy_stream(job, part, opened.stream, total, &mut file, state, report).await?;
    file.flush().await.map_err(io)?;
    file.get_mut().sync_data().await.map_err(io)?;
    match dropped {
        Some(why) => Err(Step::Retry(why)),
        None => Ok(()),
    }
}

/// The part, opened for writing at `start`: a fresh part is a new file (the old one was
/// removed), never a link's target; a resumed one is the file that is there, never through a link.
async fn open_part(part: &Path, start: u64) -> std::io::Result<BufWriter<tokio::fs::File>> {
    let file = match start {
        0 => cache_fs::create_new(part),
        _ => cache_fs::open_existing(part, true),
    };
    let file = tokio::fs::File::from_std(file?);
    file.set_len(start).await?;
    let mut file = BufWriter::with_capacity(1 << 20, file);
    tokio::io::AsyncSeekExt::seek(&mut file, std::io::SeekFrom::Start(start)).await?;
    Ok(file)
}

/// Writes the stream's chunks to `file`, digesting and counting them; why the connection dropped
/// when it did (`None` when the stream ended). Passing `total` removes the part and is fatal.
async fn copy_stream(
    job: &Job,
    part: &Path,
    mut stream: BoxStream<'static, Result<Bytes, String>>,
    total: Option<u64>,
    file: &mut BufWriter<tokio::fs::File>,
    state: &mut Digest,
    report: &mut Reporter,
) -> Result<Option<String>, Step> {
    while let Some(chunk) = stream.next().await {
        let data = match chunk {
            Ok(data) => data,
            Err(why) => return Ok(Some(why)),
        };
        if let Some(t) = total.filter(|&t| state.at + data.len() as u64 > t) {
            remove_partial(part);
            return Err(Step::Fatal(too_long(job, t)));
        }
        let io = |e| Step::Fatal(FetchError::io(&job.src, part, e));
        file.write_all(&data).await.map_err(io)?;
        state.hasher.update(&data);
        state.at += data.len() as u64;
        report.advance(data.len() as u64);
    }
    Ok(None)
}

/// The error for an answer that goes on past the `size` its source gave.
fn too_long(job: &Job, size: u64) -> FetchError {
    FetchError::invalid(
        &job.src,
        format!(
            "{}: the server sent more than the {size} bytes the file has; the download was \
             stopped there and its part removed",
            job.file
        ),
    )
}

/// Checks the whole part against the job's digest and renames it into place; a part that does
/// not match is removed.
async fn finish(
    job: &Job,
    part: &Path,
    state: Digest,
    report: &mut Reporter,
    ledger: &Ledger,
) -> Result<u64, FetchError> {
    if let Err((expected, got)) = state.hasher.check(&job.verify) {
        remove_partial(part);
        return Err(mismatch(job, expected, got));
    }
    tokio::fs::rename(part, &job.dest)
        .await
        .map_err(|e| FetchError::io(&job.src, &job.dest, e))?;
    let _ = std::fs::remove_file(version_file(part));
    // checked as it streamed: not read again before its first use
    ledger.record(&job.dest, &job.verify);
    report.finish();
    Ok(state.at)
}

/// The error for a file whose digest is not the one expected; an S3 ETag says what it is.
fn mismatch(job: &Job, mut expected: String, got: String) -> FetchError {
    if matches!(job.verify, Verify::Md5(_)) {
        expected = format!(
            "{expected} (the object's ETag, its MD5 unless it was encrypted with SSE-KMS or \
             SSE-C: give such a model `sha256:`)"
        );
    }
    FetchError::Checksum {
        src: job.src.clone(),
        file: job.file.clone(),
        expected,
        got,
    }
}
