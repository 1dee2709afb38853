//! Sizing a model before its download: the first bytes of its GGUF, read with a range request,
//! hold the whole header (architecture, layers, every tensor's type and shape). corral writes them
//! to a sparse file as long as the real one, so the memory estimator reads it as it reads any
//! model file, and placement knows the model's size before a byte of weights is fetched.

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
        std::fs::create_dir_all(path.parent().expect("under the cache")).map_err(io)?;
        let part = path.with_extension("gguf.incomplete");
        let mut file = std::fs::File::create(&part).map_err(io)?;
        file.write_all(&head).map_err(io)?;
        file.set_len(total.max(head.len() as u64)).map_err(io)?;
        std::fs::rename(&part, &path).map_err(io)?;
        Ok(path)
    }
}

/// Reads the file from its start until a whole GGUF header has come; with the file's length.
async fn read_header_bytes(job: &Job) -> Result<(Vec<u8>, u64), FetchError> {
    let opened = match job.transport.open(&job.src, &job.file, 0).await {
        Ok(o) => o,
        Err(Failure::Fatal(e)) => return Err(e),
        Err(Failure::Retry(why)) => return Err(FetchError::invalid(&job.src, why)),
        Err(Failure::Restart) => {
            return Err(FetchError::invalid(
                &job.src,
                "the server refused to send the file's start",
            ))
        }
    };
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
