//! Hugging Face Hub sources: the revision's listing from the Hub API, the files the model takes,
//! each blob downloaded once into the shared cache, and the snapshot links that name them.

use std::path::{Path, PathBuf};

use http::{HeaderMap, HeaderValue};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use super::download::Job;
use super::flights::{ensure_all, missing_bytes};
use super::folder::folder_files;
use super::found::{Check, Found};
use super::gguf_pick::{self, Pick, PickError};
use super::hf_cache::{cached_pick, is_commit, within, RepoCache, Snapshot};
use super::transport::{
    http_error, http_failure, json_body, server_said, three_tries, Failure, Transport,
};
use super::verify::Verify;
use super::{disk, FetchError, Fetched, Fetcher, Form, HfRef, Source, Want};

/// Files downloaded at once for one model.
const PARALLEL: usize = 4;
const TOKEN_FIX: &str = "set HF_TOKEN to a token that can read the repository (and accept its terms on the Hub if it is gated)";

/// A path segment keeps `-`, `_`, `.`, `~`; everything else is escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

#[derive(Deserialize)]
struct Revision {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize, Clone)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize, Clone)]
struct Lfs {
    sha256: String,
    size: u64,
}

impl Sibling {
    /// The blob's name in the cache: the LFS sha256, else the git blob id (the Hub's ETag).
    fn etag(&self) -> Option<&str> {
        self.lfs
            .as_ref()
            .map(|l| l.sha256.as_str())
            .or(self.blob_id.as_deref())
    }

    fn size(&self) -> Option<u64> {
        self.lfs.as_ref().map(|l| l.size).or(self.size)
    }
}

/// The model in the snapshot its revision points at, with the blobs it takes to check against
/// the digests they are named by; `None` when anything is missing, an error when the snapshot
/// is not as the Hub's client lays it out (a link out of the repository's blobs, a folder that
/// is a link).
pub(crate) fn cached(
    f: &Fetcher,
    source: &Source,
    hf: &HfRef,
    want: &Want,
) -> Result<Option<Found>, FetchError> {
    let cache = RepoCache::new(&f.inner.hf_root, &hf.repo);
    let Some(commit) = cache.commit_of(&hf.revision) else {
        return Ok(None);
    };
    let snapshot = cache.snapshot(&commit);
    let files = match cache.files(&snapshot) {
        Ok(files) => files,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FetchError::io(&source.to_string(), &snapshot, e)),
    };
    let Some(pick) = cached_pick(&files, hf, want.form) else {
        return Ok(None);
    };
    Ok(Some(found_in(&files, &snapshot, &pick)))
}

/// The files `pick` takes out of the snapshot, their size, and the blobs among them whose names
/// are digests to check them by.
fn found_in(files: &Snapshot, snapshot: &Path, pick: &Pick) -> Found {
    let taken: Vec<_> = (pick.parts.iter().chain(&pick.mmproj))
        .filter_map(|p| files.file(p))
        .collect();
    let bytes = (taken.iter())
        .filter_map(|file| std::fs::metadata(&file.real).ok())
        .map(|m| m.len())
        .sum();
    let checks = taken.iter().filter_map(|file| {
        Some(Check {
            file: file.rel.clone(),
            path: file.real.clone(),
            verify: file.verify()?,
        })
    });
    Found {
        checks: checks.collect(),
        fetched: fetched(snapshot, pick, bytes),
    }
}

fn fetched(snapshot: &Path, pick: &Pick, bytes: u64) -> Fetched {
    let model = if pick.model.is_empty() {
        snapshot.to_path_buf()
    } else {
        snapshot.join(&pick.model)
    };
    Fetched {
        model,
        mmproj: pick.mmproj.as_ref().map(|m| snapshot.join(m)),
        bytes,
    }
}

/// Downloads the blobs of the files the model takes that the cache lacks, links them into the
/// revision's snapshot and records where the revision points.
pub(crate) async fn fetch(
    f: &Fetcher,
    source: &Source,
    hf: &HfRef,
    want: &Want,
) -> Result<Fetched, FetchError> {
    let src = source.to_string();
    let listing = revision(f, &src, hf).await?;
    let pick = select(&src, &listing, hf, want.form)?;
    let files = listed_files(&listing, &pick);
    let cache = RepoCache::new(&f.inner.hf_root, &hf.repo);
    check_names(&src, &listing.sha, &files)?;
    ensure_room_for(&src, &cache, &files)?;
    // collected first: a lazy map would keep a closure over borrowed siblings in the future,
    // which the compiler cannot prove `Send` for every lifetime (rust-lang/rust#102211)
    let jobs: Vec<Job> = files
        .iter()
        .map(|s| job(f, &src, hf, &listing.sha, &cache, s))
        .collect();
    let sizes = ensure_all(f, jobs, PARALLEL).await?;
    let snapshot = link_snapshot(&src, &cache, hf, &listing.sha, &files)?;
    Ok(fetched(&snapshot, &pick, sizes.iter().sum()))
}

/// The listing's entries for the files `pick` takes.
fn listed_files(listing: &Revision, pick: &Pick) -> Vec<Sibling> {
    let by_name: std::collections::HashMap<&str, &Sibling> = listing
        .siblings
        .iter()
        .map(|s| (s.rfilename.as_str(), s))
        .collect();
    pick.parts
        .iter()
        .chain(&pick.mmproj)
        .filter_map(|p| by_name.get(p.as_str()).map(|s| (*s).clone()))
        .collect()
}

/// Fails before any download when the cache's disk cannot hold the blobs it lacks; a file the Hub
/// lists without a blob id is refused here.
fn ensure_room_for(src: &str, cache: &RepoCache, files: &[Sibling]) -> Result<(), FetchError> {
    let mut need = 0;
    for s in files {
        let etag = s.etag().ok_or_else(|| {
            FetchError::invalid(
                src,
                format!("the Hub lists {} without a blob id", s.rfilename),
            )
        })?;
        need += missing_bytes(&cache.blob(etag), s.size().unwrap_or(0));
    }
    disk::ensure_room(src, &cache.dir, need)
}

/// Links each file into the commit's snapshot and points the revision at it; the snapshot, whose
/// folders and links are then checked: it goes to an engine whole (a model folder), so no link in
/// it may lead elsewhere.
fn link_snapshot(
    src: &str,
    cache: &RepoCache,
    hf: &HfRef,
    commit: &str,
    files: &[Sibling],
) -> Result<PathBuf, FetchError> {
    let io = |e| FetchError::io(src, &cache.dir, e);
    for s in files {
        cache
            .link(commit, &s.rfilename, s.etag().unwrap_or_default())
            .map_err(io)?;
    }
    cache.write_ref(&hf.revision, commit).map_err(io)?;
    let snapshot = cache.snapshot(commit);
    cache
        .files(&snapshot)
        .map_err(|e| FetchError::io(src, &snapshot, e))?;
    Ok(snapshot)
}

/// The names the Hub gave that become paths in the cache: the commit, each file's path in the
/// snapshot and its blob id. Anything else than a commit id, a relative path of plain names and a
/// hex digest would put a file or a link outside the cache (an endpoint that is not the Hub, or
/// one that misbehaves), so the download is refused.
fn check_names(src: &str, commit: &str, files: &[Sibling]) -> Result<(), FetchError> {
    let plain = |seg: &str| !seg.is_empty() && seg != "." && seg != ".." && !seg.contains('\\');
    let digest =
        |id: &str| matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_commit(commit) {
        let detail = format!("the Hub answered {commit:?} for the revision's commit id");
        return Err(FetchError::invalid(src, detail));
    }
    for s in files {
        if !s.rfilename.split('/').all(plain) {
            let detail = format!(
                "the Hub lists a file named {:?}, not a path in the repo",
                s.rfilename
            );
            return Err(FetchError::invalid(src, detail));
        }
        if let Some(id) = s.etag().filter(|id| !digest(id)) {
            let detail = format!(
                "the Hub lists {} with the blob id {id:?}, not a digest",
                s.rfilename
            );
            return Err(FetchError::invalid(src, detail));
        }
    }
    Ok(())
}

/// The download of one file's blob from the commit, checked against the digest it is named by.
fn job(f: &Fetcher, src: &str, hf: &HfRef, commit: &str, cache: &RepoCache, s: &Sibling) -> Job {
    let etag = s.etag().unwrap_or_default();
    Job {
        src: src.to_string(),
        scheme: "huggingface",
        file: s.rfilename.clone(),
        root: cache.root.clone(),
        dest: cache.blob(etag),
        size: s.size(),
        verify: if s.lfs.is_some() {
            Verify::Sha256(etag.to_string())
        } else {
            Verify::GitBlob(etag.to_string())
        },
        transport: Transport::Http {
            client: f.inner.client.clone(),
            url: resolve_url(f, hf, commit, &s.rfilename),
            headers: auth(f),
            auth_fix: TOKEN_FIX,
        },
    }
}

/// `<endpoint>/<repo>/resolve/<commit>/<path>`, each segment of the path escaped.
fn resolve_url(f: &Fetcher, hf: &HfRef, commit: &str, rfilename: &str) -> String {
    let path: Vec<String> = rfilename
        .split('/')
        .map(|seg| utf8_percent_encode(seg, SEGMENT).to_string())
        .collect();
    format!(
        "{}/{}/resolve/{commit}/{}",
        f.inner.hf_endpoint,
        hf.repo,
        path.join("/")
    )
}

fn auth(f: &Fetcher) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(token) = &f.inner.hf_token {
        if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {token}")) {
            v.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, v);
        }
    }
    headers
}

/// The files the model takes, out of the revision's listing.
fn select(src: &str, listing: &Revision, hf: &HfRef, form: Form) -> Result<Pick, FetchError> {
    let names: Vec<&str> = listing
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .collect();
    if let Some(path) = &hf.path {
        return named_path(src, hf, path, &names);
    }
    if hf.quant.is_none() && form == Form::Directory {
        return Ok(Pick {
            model: String::new(),
            parts: folder_files(&names).iter().map(|n| n.to_string()).collect(),
            mmproj: None,
        });
    }
    gguf_pick::pick(&names, hf.quant.as_deref()).map_err(|e| match e {
        PickError::NoQuant(available) => FetchError::NoQuant {
            src: src.to_string(),
            quant: hf.quant.clone().unwrap_or_default(),
            available,
        },
        PickError::Ambiguous(available) => FetchError::Ambiguous {
            src: src.to_string(),
            available,
        },
    })
}

/// The files under the path the reference names (every part of a split GGUF); not found unless
/// the listing holds them all.
fn named_path(src: &str, hf: &HfRef, path: &str, names: &[&str]) -> Result<Pick, FetchError> {
    let parts = if gguf_pick::part_count(path) > 1 {
        gguf_pick::parts_of(path, names)
    } else {
        names
            .iter()
            .filter(|n| within(n, path))
            .map(|n| n.to_string())
            .collect()
    };
    if parts.is_empty() || parts.len() < gguf_pick::part_count(path) {
        let what = format!("file {path} in {} at revision {}", hf.repo, hf.revision);
        return Err(FetchError::NotFound {
            src: src.to_string(),
            what,
        });
    }
    Ok(Pick {
        model: path.to_string(),
        parts,
        mmproj: None,
    })
}

/// `GET /api/models/{repo}/revision/{rev}?blobs=true`: the commit and every file with its size
/// and blob id, retried a few times over a flaky network.
async fn revision(f: &Fetcher, src: &str, hf: &HfRef) -> Result<Revision, FetchError> {
    let rev = utf8_percent_encode(&hf.revision, SEGMENT);
    let url = format!(
        "{}/api/models/{}/revision/{rev}?blobs=true",
        f.inner.hf_endpoint, hf.repo
    );
    three_tries(src, "the revision's listing", || {
        ask_revision(f, src, hf, &url)
    })
    .await
}

/// One ask for the revision's listing; a refusal names the revision when the Hub says that is
/// what it lacks, else the repository.
async fn ask_revision(f: &Fetcher, src: &str, hf: &HfRef, url: &str) -> Result<Revision, Failure> {
    let resp = (f.inner.client.get(url).headers(auth(f)).send().await)
        .map_err(|e| Failure::Retry(http_error(&e)))?;
    let status = resp.status();
    if status.is_success() {
        let body = json_body(resp, src, "the Hub's listing of the revision")
            .await
            .map_err(Failure::Fatal)?;
        return serde_json::from_slice(&body).map_err(|e| {
            Failure::Fatal(FetchError::invalid(
                src,
                format!("the Hub's answer for {url}: {e}"),
            ))
        });
    }
    let what = missing_what(resp.headers(), hf);
    Err(http_failure(
        status,
        src,
        &what,
        TOKEN_FIX,
        &server_said(resp).await,
    ))
}

/// What the Hub lacks, by its `x-error-code`: the revision, else the repository (or its revision).
fn missing_what(headers: &HeaderMap, hf: &HfRef) -> String {
    let code = headers
        .get("x-error-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match code {
        "RevisionNotFound" => format!("revision {} of {}", hf.revision, hf.repo),
        _ => format!("repository {} (or its revision {})", hf.repo, hf.revision),
    }
}

/// The download of the model's GGUF (the first part of a split), whose header sizes the model
/// before anything is fetched.
pub(crate) async fn model_job(
    f: &Fetcher,
    source: &Source,
    hf: &HfRef,
    want: &Want,
) -> Result<Job, FetchError> {
    let src = source.to_string();
    let listing = revision(f, &src, hf).await?;
    let pick = select(&src, &listing, hf, want.form)?;
    let sibling = listing
        .siblings
        .iter()
        .find(|s| s.rfilename == pick.model)
        .ok_or_else(|| FetchError::invalid(&src, format!("{} is not listed", pick.model)))?;
    let cache = RepoCache::new(&f.inner.hf_root, &hf.repo);
    Ok(job(f, &src, hf, &listing.sha, &cache, sibling))
}

/// The downloads of a repository's safetensors files, whose headers give the weights' exact size.
pub(crate) async fn safetensors_jobs(
    f: &Fetcher,
    source: &Source,
    hf: &HfRef,
) -> Result<Vec<Job>, FetchError> {
    let src = source.to_string();
    let listing = revision(f, &src, hf).await?;
    let cache = RepoCache::new(&f.inner.hf_root, &hf.repo);
    let names: Vec<&str> = (listing.siblings.iter())
        .map(|s| s.rfilename.as_str())
        .collect();
    // the weights the folder takes, each once (see `folder`)
    let taken = match &hf.path {
        Some(_) => names,
        None => folder_files(&names),
    };
    Ok(listing
        .siblings
        .iter()
        .filter(|s| s.rfilename.ends_with(".safetensors") && taken.contains(&s.rfilename.as_str()))
        .filter(|s| hf.path.as_ref().is_none_or(|p| within(&s.rfilename, p)))
        .map(|s| job(f, &src, hf, &listing.sha, &cache, s))
        .collect())
}
