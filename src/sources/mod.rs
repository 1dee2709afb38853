//! Model sources: where a model's weights come from, and getting them onto this machine before
//! its engine starts.
//!
//! Caches, each in the layout its own tools use so they share files with corral:
//! - Hugging Face Hub: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
//!   else `~/.cache/huggingface/hub`; endpoint `HF_ENDPOINT`, token `HF_TOKEN`.
//! - Ollama: `OLLAMA_MODELS`, else `~/.ollama/models`; the registry `https://registry.ollama.ai`,
//!   replaced by `OLLAMA_REGISTRY` (a base URL) for mirrors and tests.
//! - URLs and S3 objects: corral's own cache, `CORRAL_CACHE`, else `$XDG_CACHE_HOME/corral/models`,
//!   else `~/.cache/corral/models`: `url/<host>/<sha256 of the URL, 16 hex>/<file name>` and
//!   `s3/<bucket>/<key>`. S3 settings are the standard `AWS_*` variables.
//!
//! Caches may be shared with other users: no folder or file corral writes in them is reached
//! through a symbolic link it did not make, a file found there is checked against its digest
//! before its first use (remembered in corral's cache, `verified/`), and nothing read from a
//! server is held or written past the size it was given.
//!
//! Bytes received are counted in [`Fetcher::download_bytes`], a `corral_download_bytes_total`
//! counter by `scheme` that the metrics registry registers.

mod cache_fs;
mod disk;
mod download;
mod error;
mod fetcher;
mod flights;
mod folder;
mod found;
mod gguf_pick;
mod hf;
mod hf_cache;
mod lock;
mod ollama;
mod parse;
mod part;
mod probe;
mod progress;
mod remote;
mod transport;
mod verified;
mod verify;

use std::path::PathBuf;

pub use error::FetchError;
pub use flights::Fetcher;
pub use parse::{HfRef, Source};
pub use progress::Progress;

/// What the engine loads: one GGUF file (llama.cpp) or a model directory (vLLM, TGI, SGLang, TEI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    File,
    Directory,
}

/// What a fetch must deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub form: Form,
    /// The hex SHA-256 the file must have (`sha256:` in the config), for URL sources.
    pub sha256: Option<String>,
}

/// Where the model lies once fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The GGUF file (the first part of a split) or the snapshot directory.
    pub model: PathBuf,
    /// The multimodal projector that goes with the model, when the source has one.
    pub mmproj: Option<PathBuf>,
    /// The size of everything the model takes.
    pub bytes: u64,
}
