//! The fetcher: caches and endpoints from the environment, one download per file however many
//! callers wait on it, and progress for whoever watches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::broadcast;

use super::download::{self, Job};
use super::progress::{Board, Joined, Progress, Reporter};
use super::verified::Ledger;
use super::verify::Verify;
use super::{hf, ollama, remote, FetchError, Fetched, Source, Want};

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
    /// Downloads under way, by destination, with the other sources that joined each.
    flights: Mutex<HashMap<PathBuf, (Flight, Joined)>>,
}

/// What the caches hold complete for a source: where it lies, and the files in it whose digest is
/// known, to check before their first use.
pub(crate) struct Found {
    pub fetched: Fetched,
    pub checks: Vec<Check>,
}

/// A file to check against its digest.
pub(crate) struct Check {
    /// Its name within the source, for errors.
    pub file: String,
    pub path: PathBuf,
    pub verify: Verify,
}

impl Found {
    /// A file of a source whose content cannot be checked (a path, a URL without `sha256:`).
    pub(crate) fn unchecked(fetched: Fetched) -> Found {
        Found {
            fetched,
            checks: Vec::new(),
        }
    }
}

/// The first set variable of `names`, non-empty.
fn first(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()))
}

impl Fetcher {
    /// Caches and endpoints from the standard environment (`env` answers variables; the binary
    /// passes the process environment, tests a map).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Fetcher {
        // reqwest and object_store are built without a default TLS provider; corral uses ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let home = PathBuf::from(env("HOME").unwrap_or_else(|| "/root".into()));
        let xdg = first(env, &["XDG_CACHE_HOME"]).map_or(home.join(".cache"), PathBuf::from);
        let hf_home = first(env, &["HF_HOME"]).map_or(xdg.join("huggingface"), PathBuf::from);
        let hf_root = first(env, &["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"])
            .map_or(hf_home.join("hub"), PathBuf::from);
        // no Referer on a redirect: a URL source's query may hold its token, and the server
        // redirected to (a CDN) has no business seeing it
        let client = reqwest::Client::builder()
            .user_agent(concat!("corral/", env!("CARGO_PKG_VERSION")))
            .referer(false)
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .build()
            .expect("an HTTP client with the ring provider");
        let aws = remote::AWS_VARIABLES
            .iter()
            .filter_map(|n| env(n).map(|v| (n.to_string(), v)))
            .collect();
        let corral_root =
            first(env, &["CORRAL_CACHE"]).map_or(xdg.join("corral/models"), PathBuf::from);
        Fetcher {
            inner: Arc::new(Inner {
                client,
                hf_root,
                hf_endpoint: first(env, &["HF_ENDPOINT"])
                    .unwrap_or_else(|| "https://huggingface.co".into())
                    .trim_end_matches('/')
                    .to_string(),
                // a token read from a file (a Kubernetes secret) often ends in a newline
                hf_token: first(env, &["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"])
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty()),
                ollama_root: first(env, &["OLLAMA_MODELS"])
                    .map_or(home.join(".ollama/models"), PathBuf::from),
                ollama_registry: first(env, &["OLLAMA_REGISTRY"])
                    .map(|r| r.trim_end_matches('/').to_string()),
                ledger: Arc::new(Ledger::new(corral_root.join("verified"))),
                corral_root,
                aws,
                board: Arc::new(Board::new()),
                flights: Mutex::default(),
            }),
        }
    }

    /// Downloads what is missing (one download per file however many callers wait on it),
    /// verifies it, and returns where it lies. What the caches hold complete is used without
    /// asking the network, once checked against its digest where that is known (a file that
    /// does not match is an error, and is left as it is).
    pub async fn fetch(&self, source: &Source, want: &Want) -> Result<Fetched, FetchError> {
        if let Some(found) = self.find(source, want)? {
            let src = source.to_string();
            for c in &found.checks {
                let ledger = &self.inner.ledger;
                ledger
                    .check_async(&src, &c.file, &c.path, &c.verify)
                    .await?;
            }
            return Ok(found.fetched);
        }
        match source {
            Source::Path(p) => remote::path_missing(source, p, want),
            Source::Url(url) => remote::fetch_url(self, source, url, want).await,
            Source::HuggingFace(h) => hf::fetch(self, source, h, want).await,
            Source::S3 { bucket, key } => remote::fetch_s3(self, source, bucket, key, want).await,
            Source::Ollama { name, tag } => ollama::fetch(self, source, name, tag, want).await,
        }
    }

    /// What is already complete in the caches and checked against its digest, without touching
    /// the network or reading any file whole (`None` when anything is missing, or not checked
    /// yet: [`Fetcher::fetch`] checks it).
    pub fn cached(&self, source: &Source, want: &Want) -> Option<Fetched> {
        let found = self.find(source, want).ok()??;
        let ledger = &self.inner.ledger;
        let checked = found
            .checks
            .iter()
            .all(|c| ledger.holds(&c.path, &c.verify));
        checked.then_some(found.fetched)
    }

    /// What the caches hold complete, checked or not: enough to read a model's headers for its
    /// memory estimate (a tampered file can only make that estimate wrong, and is refused by
    /// [`Fetcher::fetch`] before an engine reads it), so a model whose files another tool put in
    /// the cache is sized before its first start without the network.
    pub fn cached_for_sizing(&self, source: &Source, want: &Want) -> Option<Fetched> {
        Some(self.find(source, want).ok()??.fetched)
    }

    /// What the caches hold complete, with the files to check; an error for a cache laid out as
    /// no tool lays it out (a link where corral makes folders, a snapshot link out of its blobs).
    fn find(&self, source: &Source, want: &Want) -> Result<Option<Found>, FetchError> {
        Ok(match source {
            Source::Path(p) => remote::cached_path(p, want).map(Found::unchecked),
            Source::Url(url) => remote::cached_url(self, url, want),
            Source::HuggingFace(h) => hf::cached(self, source, h, want)?,
            Source::S3 { bucket, key } => remote::cached_s3(self, bucket, key, want),
            Source::Ollama { name, tag } => ollama::cached(self, source, name, tag, want)?,
        })
    }

    /// The Ollama store this fetcher fills (`OLLAMA_MODELS`), which an `ollama serve` must read.
    pub fn ollama_store(&self) -> PathBuf {
        self.inner.ollama_root.clone()
    }

    /// Downloads in progress now (for the dashboard and `/v1/models`).
    pub fn downloads(&self) -> Vec<Progress> {
        self.inner.board.list()
    }

    /// Progress updates as they happen (at most four a second per download).
    pub fn subscribe(&self) -> broadcast::Receiver<Progress> {
        self.inner.board.subscribe()
    }

    /// `corral_download_bytes_total{scheme}`: bytes received, unregistered; the metrics
    /// registry registers a clone.
    pub fn download_bytes(&self) -> prometheus::IntCounterVec {
        self.inner.board.bytes.clone()
    }

    /// Makes `job.dest` complete, joining the download already under way for it if there is
    /// one (its progress then names this job's source too). The download runs in its own task,
    /// so a caller that gives up leaves it going for the others (and a later fetch resumes from
    /// its partial file in any case).
    pub(crate) async fn ensure(&self, job: Job) -> Result<u64, FetchError> {
        let flight = {
            let mut flights = self.inner.flights.lock().unwrap();
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
        let mut flights = self.0.flights.lock().unwrap_or_else(|e| e.into_inner());
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
        size.saturating_sub(download::held(dest))
    }
}
