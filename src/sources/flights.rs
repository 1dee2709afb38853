//! The fetcher's shared state and its downloads in flight: one download per file however many
//! callers wait on it. Each kind of source (`hf`, `ollama`, `remote`) starts its downloads here;
//! `fetcher` reads the state from the environment and sends each source to its kind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::{StreamExt, TryStreamExt};

use super::download::{self, Job};
use super::part;
use super::progress::{Board, Joined, Reporter};
use super::verified::Ledger;
use super::FetchError;

type Flight = Shared<BoxFuture<'static, Result<u64, FetchError>>>;

/// Fetches model sources into their caches. One per process; clones share everything.
#[derive(Clone)]
pub struct Fetcher {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub client: reqwest::Client,
    pub hf_root: PathBuf,
    pub hf_endpoint: String,
    pub hf_token: Option<String>,
    pub ollama_root: PathBuf,
    pub ollama_registry: Option<String>,
    pub corral_root: PathBuf,
    /// `AWS_*` settings, read once.
    pub aws: Vec<(String, String)>,
    pub board: Arc<Board>,
    /// The files of the caches found to match their digest (in corral's cache, `verified/`).
    pub ledger: Arc<Ledger>,
    pub flights: Flights,
}

/// Downloads under way, by destination, with the other sources that joined each.
#[derive(Default)]
pub(crate) struct Flights(Mutex<HashMap<PathBuf, (Flight, Joined)>>);

impl Fetcher {
    /// Makes `job.dest` complete, joining the download already under way for it if there is
    /// one (its progress then names this job's source too). The download runs in its own task,
    /// so a caller that gives up leaves it going for the others (and a later fetch resumes from
    /// its partial file in any case).
    pub(crate) async fn ensure(&self, job: Job) -> Result<u64, FetchError> {
        let flight = {
            let mut flights = self.inner.flights.0.lock().unwrap();
            // in place and checked already; else the flight checks it, once for every caller
            let meta = std::fs::symlink_metadata(&job.dest)
                .ok()
                .filter(|m| m.is_file());
            if let Some(meta) = meta.filter(|_| self.inner.ledger.holds(&job.dest, &job.verify)) {
                return Ok(meta.len());
            }
            if let Some((flight, joined)) = flights.get(&job.dest) {
                let mut joined = joined.lock().unwrap();
                if !joined.contains(&job.src) {
                    joined.push(job.src.clone());
                    self.inner.board.join(&job.dest, &job.src);
                }
                flight.clone()
            } else {
                let (dest, joined) = (job.dest.clone(), Joined::default());
                let flight = self.fly(job, joined.clone());
                flights.insert(dest, (flight.clone(), joined));
                flight
            }
        };
        flight.await
    }

    /// Starts the download of `job` in a task of its own.
    fn fly(&self, job: Job, joined: Joined) -> Flight {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            let mut report = Reporter::new(
                inner.board.clone(),
                &job.dest,
                job.scheme,
                &job.src,
                &job.file,
                joined,
            );
            // gone from the flights however the download ends, a panic included, so the next
            // fetch of the file starts afresh instead of joining a flight that has failed
            let _landed = Landed(&inner, &job.dest);
            download::run(&job, &mut report, &inner.ledger).await
        });
        let flight = async move {
            task.await
                .unwrap_or_else(|e| Err(FetchError::invalid("download", e.to_string())))
        };
        flight.boxed().shared()
    }
}

/// Takes a download out of the flights when dropped.
struct Landed<'a>(&'a Inner, &'a Path);

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        let mut flights = self.0.flights.0.lock().unwrap_or_else(|e| e.into_inner());
        flights.remove(self.1);
    }
}

/// Downloads at most `parallel` of `jobs` at a time; their sizes, in no particular order.
pub(crate) async fn ensure_all(
    f: &Fetcher,
    jobs: Vec<Job>,
    parallel: usize,
) -> Result<Vec<u64>, FetchError> {
    // Boxed 'static futures keep the caller's future Send for any caller lifetime.
    let flights: Vec<BoxFuture<'static, Result<u64, FetchError>>> = jobs
        .into_iter()
        .map(|job| {
            let f = f.clone();
            async move { f.ensure(job).await }.boxed()
        })
        .collect();
    futures_util::stream::iter(flights)
        .buffer_unordered(parallel)
        .try_collect()
        .await
}

/// Bytes still to come for `dest`: nothing when complete, else its size less the partial part.
pub(crate) fn missing_bytes(dest: &Path, size: u64) -> u64 {
    if dest.exists() {
        0
    } else {
        size.saturating_sub(part::held(dest))
    }
}
