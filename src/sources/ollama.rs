//! Ollama sources, kept in Ollama's own store so `ollama` sees what corral pulled and corral
//! uses what `ollama pull` fetched:
//!
//! ```text
//! <root>/manifests/<host>/<namespace>/<model>/<tag>    the image manifest (JSON)
//! <root>/blobs/sha256-<hex>                            each layer; the model layer is the GGUF
//! ```
//!
//! A model missing from the store comes from the registry's v2 API (`OLLAMA_REGISTRY` replaces
//! `https://registry.ollama.ai`), every blob checked against its digest, the manifest written last.
//! A blob found in the store is checked against the digest it is named by before its first use.

use std::path::PathBuf;

use http::{HeaderMap, HeaderValue};
use serde::Deserialize;

use super::cache_fs::{self, JSON_AT_MOST};
use super::download::Job;
use super::flights::{ensure_all, missing_bytes};
use super::found::{Check, Found};
use super::transport::{
    http_error, http_failure, json_body, server_said, three_tries, Failure, Transport,
};
use super::verify::Verify;
use super::{disk, FetchError, Fetched, Fetcher, Form, Source, Want};

const DEFAULT_HOST: &str = "registry.ollama.ai";
const MODEL: &str = "application/vnd.ollama.image.model";
const PROJECTOR: &str = "application/vnd.ollama.image.projector";
const ACCEPT: &str = "application/vnd.docker.distribution.manifest.v2+json";

#[derive(Deserialize)]
struct Manifest {
    config: Option<Layer>,
    #[serde(default)]
    layers: Vec<Layer>,
}

#[derive(Deserialize, Clone)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: u64,
}

impl Layer {
    /// The hex of `sha256:<hex>`, refused unless it is exactly that (it becomes a file name).
    fn hex(&self) -> Option<&str> {
        let hex = self.digest.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
    }
}

/// `name` → (registry host, namespace, model).
fn split_name(name: &str) -> (&str, &str, &str) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [model] => (DEFAULT_HOST, "library", model),
        [ns, model] => (DEFAULT_HOST, ns, model),
        [host, ns, model, ..] => (host, ns, model),
        [] => (DEFAULT_HOST, "library", name),
    }
}

fn manifest_path(f: &Fetcher, name: &str, tag: &str) -> PathBuf {
    let (host, ns, model) = split_name(name);
    f.inner
        .ollama_root
        .join("manifests")
        .join(host)
        .join(ns)
        .join(model)
        .join(tag)
}

fn blob_path(f: &Fetcher, hex: &str) -> PathBuf {
    f.inner
        .ollama_root
        .join("blobs")
        .join(format!("sha256-{hex}"))
}

/// The model in the store, with its blobs to check against their digests (`None` when the
/// manifest or a blob it names is missing); an error when the store's blobs folder is a link.
pub(crate) fn cached(
    f: &Fetcher,
    source: &Source,
    name: &str,
    tag: &str,
    want: &Want,
) -> Result<Option<Found>, FetchError> {
    if want.form == Form::Directory {
        return Ok(None);
    }
    let blobs = f.inner.ollama_root.join("blobs");
    match cache_fs::check_dirs(&f.inner.ollama_root, &blobs) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FetchError::io(&source.to_string(), &blobs, e)),
        Ok(()) => {}
    }
    let Ok(text) = cache_fs::read_at_most(&manifest_path(f, name, tag), JSON_AT_MOST) else {
        return Ok(None);
    };
    let Ok(manifest) = serde_json::from_slice::<Manifest>(&text) else {
        return Ok(None);
    };
    Ok(found(f, &manifest))
}

/// The model and projector layers of `manifest` when their blobs are in the store.
fn found(f: &Fetcher, manifest: &Manifest) -> Option<Found> {
    let present = |l: &Layer| {
        let hex = l.hex()?;
        let path = blob_path(f, hex);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        (meta.len() == l.size).then(|| Check {
            file: l.digest.clone(),
            path,
            verify: Verify::Sha256(hex.to_string()),
        })
    };
    let model = manifest.layers.iter().find(|l| l.media_type == MODEL)?;
    let mmproj = match manifest.layers.iter().find(|l| l.media_type == PROJECTOR) {
        Some(p) => Some(present(p)?),
        None => None,
    };
    let model_check = present(model)?;
    Some(Found {
        fetched: Fetched {
            model: model_check.path.clone(),
            mmproj: mmproj.as_ref().map(|c| c.path.clone()),
            bytes: model.size,
        },
        checks: std::iter::once(model_check).chain(mmproj).collect(),
    })
}

pub(crate) async fn fetch(
    f: &Fetcher,
    source: &Source,
    name: &str,
    tag: &str,
    want: &Want,
) -> Result<Fetched, FetchError> {
    let src = source.to_string();
    if want.form == Form::Directory {
        return Err(FetchError::invalid(
            &src,
            "an Ollama model is one GGUF file; this engine wants a model directory (use hf://)",
        ));
    }
    let registry = Registry::new(f, name);
    let raw = manifest(f, &src, &registry.manifest_url(tag), name, tag).await?;
    let layers = layers_of(&src, &raw)?;
    ensure_room_for(f, &src, &layers)?;
    let jobs: Vec<Job> = layers
        .iter()
        .map(|l| registry.blob_job(f, &src, l))
        .collect();
    ensure_all(f, jobs, 4).await?;
    write_manifest(f, &src, name, tag, &raw)?;
    stored_model(f, &src, &raw)
}

/// The model the manifest names, as the store now holds it.
fn stored_model(f: &Fetcher, src: &str, raw: &[u8]) -> Result<Fetched, FetchError> {
    let manifest: Manifest = serde_json::from_slice(raw)
        .map_err(|e| FetchError::invalid(src, format!("the registry's manifest: {e}")))?;
    found(f, &manifest)
        .map(|found| found.fetched)
        .ok_or_else(|| FetchError::invalid(src, "the store lacks a layer just downloaded"))
}

/// Writes the manifest into the store, once its blobs are there: `ollama` then lists the model.
fn write_manifest(
    f: &Fetcher,
    src: &str,
    name: &str,
    tag: &str,
    raw: &[u8],
) -> Result<(), FetchError> {
    let path = manifest_path(f, name, tag);
    let io = |e| FetchError::io(src, &path, e);
    let folder = path.parent().expect("a manifest has a folder");
    cache_fs::make_dirs(&f.inner.ollama_root, folder).map_err(io)?;
    cache_fs::write_atomic(&path, raw).map_err(io)
}

/// Where a model lives on its registry: `OLLAMA_REGISTRY` stands in for the default host.
struct Registry<'a> {
    base: String,
    ns: &'a str,
    model: &'a str,
}

impl<'a> Registry<'a> {
    fn new(f: &Fetcher, name: &'a str) -> Self {
        let (host, ns, model) = split_name(name);
        let base = match (&f.inner.ollama_registry, host) {
            (Some(r), DEFAULT_HOST) => r.clone(),
            _ => format!("https://{host}"),
        };
        Registry { base, ns, model }
    }

    fn manifest_url(&self, tag: &str) -> String {
        let Registry { base, ns, model } = self;
        format!("{base}/v2/{ns}/{model}/manifests/{tag}")
    }

    /// The download of one layer into the store's blobs, checked against its digest.
    fn blob_job(&self, f: &Fetcher, src: &str, l: &Layer) -> Job {
        let Registry { base, ns, model } = self;
        let hex = l.hex().unwrap_or_default();
        Job {
            src: src.to_string(),
            scheme: "ollama",
            file: l.digest.clone(),
            root: f.inner.ollama_root.clone(),
            dest: blob_path(f, hex),
            size: Some(l.size),
            verify: Verify::Sha256(hex.to_string()),
            transport: Transport::Http {
                client: f.inner.client.clone(),
                url: format!("{base}/v2/{ns}/{model}/blobs/{}", l.digest),
                headers: HeaderMap::new(),
                auth_fix: "check the model's name; a private registry needs its credentials",
            },
        }
    }
}

/// The manifest's config and layers, refused when it has no model layer.
fn layers_of(src: &str, raw: &[u8]) -> Result<Vec<Layer>, FetchError> {
    let parsed: Manifest = serde_json::from_slice(raw)
        .map_err(|e| FetchError::invalid(src, format!("the registry's manifest: {e}")))?;
    if !parsed.layers.iter().any(|l| l.media_type == MODEL) {
        return Err(FetchError::invalid(
            src,
            "the manifest has no model layer; is this an Ollama model?",
        ));
    }
    Ok(parsed
        .config
        .iter()
        .chain(&parsed.layers)
        .cloned()
        .collect())
}

/// Fails before any download when the store's disk cannot hold the layers it lacks; a layer
/// whose digest is not `sha256:<hex>` is refused here, before it could name a file.
fn ensure_room_for(f: &Fetcher, src: &str, layers: &[Layer]) -> Result<(), FetchError> {
    let mut need = 0;
    for l in layers {
        let hex = l.hex().ok_or_else(|| {
            FetchError::invalid(src, format!("bad digest {:?} in the manifest", l.digest))
        })?;
        need += missing_bytes(&blob_path(f, hex), l.size);
    }
    disk::ensure_room(src, &f.inner.ollama_root, need)
}

/// The manifest's bytes as the registry sent them (written to the store unchanged).
async fn manifest(
    f: &Fetcher,
    src: &str,
    url: &str,
    name: &str,
    tag: &str,
) -> Result<Vec<u8>, FetchError> {
    three_tries(src, "the manifest", || ask_manifest(f, src, url, name, tag)).await
}

/// One ask for the manifest.
async fn ask_manifest(
    f: &Fetcher,
    src: &str,
    url: &str,
    name: &str,
    tag: &str,
) -> Result<Vec<u8>, Failure> {
    let accept = HeaderValue::from_static(ACCEPT);
    let req = f.inner.client.get(url).header(http::header::ACCEPT, accept);
    let resp = (req.send().await).map_err(|e| Failure::Retry(http_error(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return (json_body(resp, src, "the registry's manifest").await).map_err(Failure::Fatal);
    }
    let what = format!("model {name}:{tag} in the registry");
    let said = server_said(resp).await;
    Err(http_failure(
        status,
        src,
        &what,
        "check the model's name and tag",
        &said,
    ))
}
