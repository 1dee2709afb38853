//! Why a model's weights could not be had; every message names the source and what to do.

/// A failed fetch. `src` is the model's source as shown (secrets masked).
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("{src}: {path} does not exist; fix the path or mount the volume that holds it")]
    PathMissing { src: String, path: String },
    #[error("{src}: {what} not found (HTTP 404); check the name, the file and the revision")]
    NotFound { src: String, what: String },
    #[error(
        "{src}: no GGUF file of quantization {quant}; the repository has: {}; pick one of those",
        list_or_none(available)
    )]
    NoQuant {
        src: String,
        quant: String,
        available: Vec<String>,
    },
    #[error(
        "{src}: several GGUF files and no quantization chosen; add one, as in {src}:Q4_K_M \
         (the repository has: {})",
        list_or_none(available)
    )]
    Ambiguous { src: String, available: Vec<String> },
    #[error("{src}: access refused (HTTP {status}); {fix}")]
    Credentials {
        src: String,
        status: u16,
        fix: String,
    },
    #[error(
        "{src}: checksum mismatch for {file}: expected {expected}, got {got}; the file was \
         deleted, check the sha256 in the config or fetch again"
    )]
    Checksum {
        src: String,
        file: String,
        expected: String,
        got: String,
    },
    #[error(
        "{src}: {path} ({file}) in the cache does not match its digest: expected {expected}, got \
         {got}; it was left as it is: find out what changed it, then delete it to fetch it again"
    )]
    Tampered {
        src: String,
        file: String,
        path: String,
        expected: String,
        got: String,
    },
    #[error(
        "{src}: not enough free disk in {dir}: need {need} bytes more, {free} free; free space \
         there or point the cache elsewhere"
    )]
    DiskFull {
        src: String,
        dir: String,
        need: u64,
        free: u64,
    },
    #[error("{src}: download of {file} failed after {attempts} attempts: {detail}; check the network and the endpoint")]
    Network {
        src: String,
        file: String,
        attempts: u32,
        detail: String,
    },
    #[error("{src}: {detail}")]
    Invalid { src: String, detail: String },
    #[error("{src}: {detail}; check the cache directory's permissions and space")]
    Io { src: String, detail: String },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "no GGUF files".to_string()
    } else {
        items.join(", ")
    }
}

impl FetchError {
    /// An I/O error on a local file, with the file named.
    pub(crate) fn io(source: &str, what: &std::path::Path, e: std::io::Error) -> FetchError {
        let (what, e) = (what.display().to_string(), e.to_string());
        FetchError::Io {
            src: source.to_string(),
            // an error that names the file already is not told twice
            detail: if e.starts_with(&what) {
                e
            } else {
                format!("{what}: {e}")
            },
        }
    }

    pub(crate) fn invalid(source: &str, detail: impl Into<String>) -> FetchError {
        FetchError::Invalid {
            src: source.to_string(),
            detail: detail.into(),
        }
    }
}
