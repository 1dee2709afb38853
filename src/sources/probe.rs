//! Sizing a model before its download. The first bytes of a GGUF hold its whole header
//! (architecture, layers, every tensor's type and shape): corral writes them to a sparse file as
//! long as the real one, so the memory estimator reads it as it reads any model file. A
//! safetensors file starts with the length of a JSON header naming each tensor's dtype and shape:
//! their sum is the weights' exact size. Either way placement knows a model's size before a byte
//! of its weights is fetched.

use std::io::Write;
use std::path::PathBuf;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::download::Job;
use super::transport::Failure;
use super::{hf, remote, FetchError, Fetcher, Form, Source, Want};

/// The most of a file read for its header: tokenizers of 250k tokens take some 10 MiB.
const MOST: usize = 64 << 20;

impl Fetcher {
    /// A sparse stand-in for the model's GGUF (its header, at the file's full length), made from
    /// the remote file's first bytes; `None` for sources that are not one remote GGUF (a path, a
    /// model directory, the Ollama registry).
    pub async fn probe_gguf(
        &self,
        source: &Source,
        want: &Want,
    ) -> Option<Result<PathBuf, FetchError>> {
        if want.form != Form::File {
            return None;
        }
        let job = match source {
            Source::Url(url) => remote::url_job(self, source, url, want),
            Source::HuggingFace(h) => hf::model_job(self, source, h, want).await,
            Source::S3 { bucket, key } => remote::s3_job(self, source, bucket, key, want).await,
            Source::Path(_) | Source::Ollama { .. } => return None,
        };
        Some(match job {
            Ok(job) => self.header_file(&job).await,
            Err(e) => Err(e),
        })
    }

    /// `headers/<hash>.gguf` in corral's cache, made once per remote file.
    async fn header_file(&self, job: &Job) -> Result<PathBuf, FetchError> {
        let name = Sha256::digest(job.dest.display().to_string().as_bytes());
        let hex: String = name.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let path = self
            .inner
            .corral_root
            .join("headers")
            .join(format!("{hex}.gguf"));
        if path.exists() {
            return Ok(path);
        }
        let (head, total) = read_header_bytes(job).await?;
        let io = |e| FetchError::io(&job.src, &path, e);
        let dir = path.parent().expect("under the cache");
        super::cache_fs::make_dirs(&self.inner.corral_root, dir).map_err(io)?;
        // written under a new name of its own, never through a link, and renamed into place
        let mut part = tempfile::Builder::new()
            .prefix(super::cache_fs::TMP)
            .tempfile_in(dir)
            .map_err(io)?;
        part.write_all(&head).map_err(io)?;
        part.as_file()
            .set_len(total.max(head.len() as u64))
            .map_err(io)?;
        part.persist(&path).map_err(|e| io(e.error))?;
        Ok(path)
    }
}

impl Fetcher {
    /// The bytes of a model directory's weights, from the headers of its safetensors files (a few
    /// kilobytes each); `None` for sources that are not a Hugging Face repository given whole.
    pub async fn probe_safetensors(
        &self,
        source: &Source,
        want: &Want,
    ) -> Option<Result<u64, FetchError>> {
        let (Source::HuggingFace(h), Form::Directory) = (source, want.form) else {
            return None;
        };
        let jobs = match hf::safetensors_jobs(self, source, h).await {
            Ok(jobs) if jobs.is_empty() => return None,
            Ok(jobs) => jobs,
            Err(e) => return Some(Err(e)),
        };
        let mut total = 0;
        for job in &jobs {
            match safetensors_bytes(job).await {
                Ok(n) => total += n,
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(total))
    }
}

/// The largest safetensors header read (the format caps it at 100 MB; real ones are far smaller).
const MOST_JSON: u64 = 100_000_000;

/// The bytes of the tensors one safetensors file holds, from its header alone.
async fn safetensors_bytes(job: &Job) -> Result<u64, FetchError> {
    let bad = |why: String| FetchError::invalid(&job.src, format!("{}: {why}", job.file));
    let mut stream = open(job).await?.stream;
    let mut head = Vec::new();
    let mut wanted = 8u64;
    while (head.len() as u64) < wanted {
        let Some(chunk) = stream.next().await else {
            return Err(bad("ends inside its header".into()));
        };
        head.extend_from_slice(&chunk.map_err(bad)?);
        if wanted == 8 && head.len() >= 8 {
            let len = u64::from_le_bytes(head[..8].try_into().expect("eight bytes"));
            if len > MOST_JSON {
                return Err(bad(format!("a header of {len} bytes")));
            }
            wanted = 8 + len;
        }
    }
    let json = &head[8..wanted as usize];
    tensor_bytes(json).map_err(bad)
}

/// The sum of each tensor's element count times its dtype's size.
fn tensor_bytes(json: &[u8]) -> Result<u64, String> {
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("its header is not JSON: {e}"))?;
    let mut total: u64 = 0;
    for (name, tensor) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let dtype = tensor["dtype"].as_str().unwrap_or_default();
        let size = dtype_size(dtype).ok_or_else(|| format!("{name}: unknown dtype {dtype:?}"))?;
        let shape = tensor["shape"]
            .as_array()
            .ok_or_else(|| format!("{name}: no shape"))?;
        let elements = shape
            .iter()
            .try_fold(1u64, |n, d| d.as_u64().and_then(|d| n.checked_mul(d)))
            .ok_or_else(|| format!("{name}: a bad shape"))?;
        total = total.saturating_add(elements.saturating_mul(size));
    }
    Ok(total)
}

/// Bytes per element of a safetensors dtype.
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "F8_E4M3" | "F8_E5M2" | "I8" | "U8" | "BOOL" => 1,
        _ => return None,
    })
}

/// Opens the file at its start.
async fn open(job: &Job) -> Result<super::transport::Opened, FetchError> {
    match job.transport.open(&job.src, &job.file, 0, None).await {
        Ok(o) => Ok(o),
        Err(Failure::Fatal(e)) => Err(e),
        Err(Failure::Retry(why)) => Err(FetchError::invalid(&job.src, why)),
        Err(Failure::Restart) => Err(FetchError::invalid(
            &job.src,
            "the server refused to send the file's start",
        )),
    }
}

/// Reads the file from its start until a whole GGUF header has come; with the file's length.
async fn read_header_bytes(job: &Job) -> Result<(Vec<u8>, u64), FetchError> {
    let opened = open(job).await?;
    let total = opened.total.or(job.size).unwrap_or(0);
    let mut stream = opened.stream;
    let mut head = Vec::new();
    let mut next_try = 1 << 20;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| FetchError::invalid(&job.src, e))?;
        head.extend_from_slice(&chunk);
        if head.len() >= next_try || head.len() as u64 >= total {
            if gguf::read_header(head.as_slice()).is_ok() {
                return Ok((head, total));
            }
            next_try = head.len() * 2;
        }
        if head.len() > MOST {
            break;
        }
    }
    Err(FetchError::invalid(
        &job.src,
        format!(
            "no whole GGUF header in the first {} bytes of {}",
            head.len(),
            job.file
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_safetensors_header_sums_its_tensors() {
        let json = br#"{"__metadata__": {"format": "pt"},
            "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
            "b": {"dtype": "F32", "shape": [3], "data_offsets": [64, 76]},
            "c": {"dtype": "F8_E4M3", "shape": [], "data_offsets": [76, 77]}}"#;
        assert_eq!(tensor_bytes(json), Ok(64 + 12 + 1));
        let odd = br#"{"x": {"dtype": "Q4", "shape": [2]}}"#;
        assert!(tensor_bytes(odd).unwrap_err().contains("unknown dtype"));
    }
}
