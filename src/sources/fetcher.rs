//! The fetcher: caches and endpoints from the environment, each source sent to its kind (`hf`,
//! `ollama`, `remote`), and progress for whoever watches. One download per file however many
//! callers wait on it is `flights`' part.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::flights::{Flights, Inner};
use super::found::Found;
use super::progress::{Board, Progress};
use super::verified::Ledger;
use super::{hf, ollama, remote, FetchError, Fetched, Fetcher, Source, Want};

/// The first set variable of `names`, non-empty.
fn first(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()))
}

/// The HTTP client every download shares.
fn http_client() -> reqwest::Client {
    // no Referer on a redirect: a URL source's query may hold its token, and the server
    // redirected to (a CDN) has no business seeing it
    reqwest::Client::builder()
        .user_agent(concat!("corral/", env!("CARGO_PKG_VERSION")))
        .referer(false)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client with the ring provider")
}

/// The Hub's cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `huggingface/hub` under `xdg`.
fn hf_root(env: &dyn Fn(&str) -> Option<String>, xdg: &std::path::Path) -> PathBuf {
    let hf_home = first(env, &["HF_HOME"]).map_or(xdg.join("huggingface"), PathBuf::from);
    first(env, &["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"])
        .map_or(hf_home.join("hub"), PathBuf::from)
}

/// The Hub's endpoint (`HF_ENDPOINT`), without a trailing slash.
fn hf_endpoint(env: &dyn Fn(&str) -> Option<String>) -> String {
    first(env, &["HF_ENDPOINT"])
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

/// The Hub's token, trimmed: one read from a file (a Kubernetes secret) often ends in a newline.
fn hf_token(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    first(env, &["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"])
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The `AWS_*` variables that are set, for S3 sources.
fn aws_settings(env: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    remote::AWS_VARIABLES
        .iter()
        .filter_map(|n| env(n).map(|v| (n.to_string(), v)))
        .collect()
}

impl Fetcher {
    /// Caches and endpoints from the standard environment (`env` answers variables; the binary
    /// passes the process environment, tests a map).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Fetcher {
        // reqwest and object_store are built without a default TLS provider; corral uses ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let home = PathBuf::from(env("HOME").unwrap_or_else(|| "/root".into()));
        let xdg = first(env, &["XDG_CACHE_HOME"]).map_or(home.join(".cache"), PathBuf::from);
        let corral_root =
            first(env, &["CORRAL_CACHE"]).map_or(xdg.join("corral/models"), PathBuf::from);
        Fetcher {
            inner: Arc::new(Inner {
                client: http_client(),
                hf_root: hf_root(env, &xdg),
                hf_endpoint: hf_endpoint(env),
                hf_token: hf_token(env),
                ollama_root: first(env, &["OLLAMA_MODELS"])
                    .map_or(home.join(".ollama/models"), PathBuf::from),
                ollama_registry: first(env, &["OLLAMA_REGISTRY"])
                    .map(|r| r.trim_end_matches('/').to_string()),
                ledger: Arc::new(Ledger::new(corral_root.join("verified"))),
                corral_root,
                aws: aws_settings(env),
                board: Arc::new(Board::new()),
                flights: Flights::default(),
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
}
