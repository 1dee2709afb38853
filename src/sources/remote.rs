//! Plain paths, URLs and S3 objects: one file each, URLs and objects cached under corral's cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, RetryConfig};

use super::cache_fs;
use super::download::Job;
use super::found::{Check, Found};
use super::transport::{s3_failure, Failure, Transport};
use super::verify::{sha256_hex, Verify};
use super::{FetchError, Fetched, Fetcher, Form, Source, Want};

/// The variables S3 settings are read from (object_store's names for them).
pub(crate) const AWS_VARIABLES: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT",
    "AWS_ALLOW_HTTP",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_METADATA_ENDPOINT",
    "AWS_IMDSV1_FALLBACK",
    "AWS_SKIP_SIGNATURE",
    "AWS_REQUEST_PAYER",
];

pub(crate) fn cached_path(path: &Path, want: &Want) -> Option<Fetched> {
    let meta = std::fs::metadata(path).ok()?;
    let fits = match want.form {
        Form::File => meta.is_file(),
        Form::Directory => true,
    };
    fits.then(|| Fetched {
        model: path.to_path_buf(),
        mmproj: None,
        bytes: meta.len(),
    })
}

pub(crate) fn path_missing(
    source: &Source,
    path: &Path,
    want: &Want,
) -> Result<Fetched, FetchError> {
    if path.is_dir() && want.form == Form::File {
        return Err(FetchError::invalid(
            &source.to_string(),
            format!(
                "{} is a directory; name the .gguf file in it",
                path.display()
            ),
        ));
    }
    Err(FetchError::PathMissing {
        src: source.to_string(),
        path: path.display().to_string(),
    })
}

/// `url/<host>/<16 hex of the sha256 of the URL and the expected sha256>/<last path segment>`:
/// the file keeps its name (an engine may read the quantization from it), two URLs never share a
/// folder, and a changed `sha256:` in the config is a new download rather than a stale hit.
fn url_dest(f: &Fetcher, url: &str, want: &Want) -> PathBuf {
    let parsed = reqwest::Url::parse(url).ok();
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str())
        .unwrap_or("unknown")
        .to_string();
    let name = parsed
        .as_ref()
        .and_then(|u| u.path_segments()?.next_back().map(str::to_string))
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .unwrap_or_else(|| "model".into());
    let name = percent_encoding::percent_decode_str(&name)
        .decode_utf8_lossy()
        .replace('/', "_");
    f.inner
        .corral_root
        .join("url")
        .join(host)
        .join(&sha256_hex(format!("{url}\n{:?}", want.sha256).as_bytes())[..16])
        .join(name)
}

pub(crate) fn cached_url(f: &Fetcher, url: &str, want: &Want) -> Option<Found> {
    let dest = url_dest(f, url, want);
    let file = dest.file_name()?.to_string_lossy().into_owned();
    cached_file(f, dest, file, want)
}

/// A file of corral's cache when it is there (a plain file, in folders that are no links), to
/// be checked against the `sha256:` the config gives.
fn cached_file(f: &Fetcher, dest: PathBuf, file: String, want: &Want) -> Option<Found> {
    cache_fs::check_dirs(&f.inner.corral_root, dest.parent()?).ok()?;
    let meta = std::fs::symlink_metadata(&dest)
        .ok()
        .filter(|m| m.is_file())?;
    let checks = want.sha256.as_ref().map(|h| Check {
        file,
        path: dest.clone(),
        verify: Verify::Sha256(h.trim_start_matches("sha256:").to_string()),
    });
    Some(Found {
        fetched: Fetched {
            model: dest,
            mmproj: None,
            bytes: meta.len(),
        },
        checks: checks.into_iter().collect(),
    })
}

pub(crate) async fn fetch_url(
    f: &Fetcher,
    source: &Source,
    url: &str,
    want: &Want,
) -> Result<Fetched, FetchError> {
    fetch_one(f, url_job(f, source, url, want)?).await
}

/// Fetches a one-file source: the model is the job's destination.
async fn fetch_one(f: &Fetcher, job: Job) -> Result<Fetched, FetchError> {
    let model = job.dest.clone();
    let bytes = f.ensure(job).await?;
    Ok(Fetched {
        model,
        mmproj: None,
        bytes,
    })
}

/// The download of a URL's file.
pub(crate) fn url_job(
    f: &Fetcher,
    source: &Source,
    url: &str,
    want: &Want,
) -> Result<Job, FetchError> {
    let src = source.to_string();
    one_file(&src, want, "a URL gives one file")?;
    let dest = url_dest(f, url, want);
    let job = Job {
        src,
        scheme: "url",
        file: dest
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
        root: f.inner.corral_root.clone(),
        dest: dest.clone(),
        size: None,
        verify: url_verify(want),
        transport: url_transport(f, url),
    };
    Ok(job)
}

/// A URL's file is checked against the `sha256:` the config gives, else by its size alone.
fn url_verify(want: &Want) -> Verify {
    match &want.sha256 {
        Some(h) => Verify::Sha256(h.trim_start_matches("sha256:").to_string()),
        None => Verify::Size,
    }
}

/// A plain GET of the URL; what credentials it needs, it carries itself.
fn url_transport(f: &Fetcher, url: &str) -> Transport {
    Transport::Http {
        client: f.inner.client.clone(),
        url: url.to_string(),
        headers: Default::default(),
        auth_fix: "put the credentials the server wants in the URL, or download it to a path",
    }
}

fn s3_dest(f: &Fetcher, bucket: &str, key: &str) -> PathBuf {
    let mut dest = f.inner.corral_root.join("s3").join(bucket);
    for seg in key
        .split('/')
        .filter(|s| !s.is_empty() && *s != "." && *s != "..")
    {
        dest.push(seg);
    }
    dest
}

pub(crate) fn cached_s3(f: &Fetcher, bucket: &str, key: &str, want: &Want) -> Option<Found> {
    cached_file(f, s3_dest(f, bucket, key), key.to_string(), want)
}

fn s3_store(f: &Fetcher, src: &str, bucket: &str) -> Result<Arc<dyn ObjectStore>, FetchError> {
    let retry = RetryConfig {
        max_retries: 3,
        ..Default::default()
    };
    // Client options first: setting them later would replace what the variables set.
    let builder = AmazonS3Builder::new()
        // no limit on a whole download, but one on a stalled read, as for HTTP sources
        .with_client_options(
            ClientOptions::new()
                .with_timeout_disabled()
                .with_read_timeout(std::time::Duration::from_secs(120)),
        )
        .with_retry(retry)
        .with_bucket_name(bucket);
    let store = with_aws_settings(builder, &f.inner.aws)
        .build()
        .map_err(|e| {
            FetchError::invalid(src, format!("S3 settings: {e}; check the AWS_* variables"))
        })?;
    Ok(Arc::new(store))
}

/// The `AWS_*` settings, each under object_store's name for it.
fn with_aws_settings(mut builder: AmazonS3Builder, aws: &[(String, String)]) -> AmazonS3Builder {
    for (name, value) in aws {
        if let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(key, value);
        }
        // A plain-HTTP endpoint (MinIO, a test server) is meant as written.
        if name.starts_with("AWS_ENDPOINT") && value.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    builder
}

pub(crate) async fn fetch_s3(
    f: &Fetcher,
    source: &Source,
    bucket: &str,
    key: &str,
    want: &Want,
) -> Result<Fetched, FetchError> {
    fetch_one(f, s3_job(f, source, bucket, key, want).await?).await
}

/// The key as the bucket stores it. `Path::from` would escape the characters it deems unsafe
/// (`~`, `%`, `[`, ...) and so ask for another key; a key with an empty, `.` or `..` segment cannot
/// be asked for at all.
fn object_key(src: &str, key: &str) -> Result<object_store::path::Path, FetchError> {
    object_store::path::Path::parse(key).map_err(|e| {
        FetchError::invalid(
            src,
            format!("the key {key:?} cannot be fetched from S3 ({e})"),
        )
    })
}

/// The download of an S3 object, with its size and checksum from the object's metadata.
pub(crate) async fn s3_job(
    f: &Fetcher,
    source: &Source,
    bucket: &str,
    key: &str,
    want: &Want,
) -> Result<Job, FetchError> {
    let src = source.to_string();
    one_file(&src, want, "an S3 object is one file")?;
    let store = s3_store(f, &src, bucket)?;
    let path = object_key(&src, key)?;
    let meta = head_object(store.as_ref(), &path, &src, key).await?;
    let dest = s3_dest(f, bucket, key);
    let job = Job {
        verify: object_verify(want, &meta),
        src,
        scheme: "s3",
        file: key.to_string(),
        root: f.inner.corral_root.clone(),
        dest: dest.clone(),
        size: Some(meta.size),
        transport: Transport::S3 { store, path },
    };
    Ok(job)
}

/// The object's metadata; a failure worth another try is final here (object_store has retried).
async fn head_object(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    src: &str,
    key: &str,
) -> Result<ObjectMeta, FetchError> {
    match store.head(path).await {
        Ok(m) => Ok(m),
        Err(e) => match s3_failure(e, src, key) {
            Failure::Fatal(e) => Err(e),
            Failure::Retry(why) => Err(FetchError::Network {
                src: src.to_string(),
                file: key.into(),
                attempts: 4,
                detail: why,
            }),
            Failure::Restart => Err(FetchError::invalid(src, "unexpected range answer")),
        },
    }
}

/// The sha256 the config gives, else the ETag: a single-part upload's is the MD5 of the content
/// (unless encrypted with SSE-KMS or SSE-C); a multipart one's has a `-N` suffix, and checks only
/// the size.
fn object_verify(want: &Want, meta: &ObjectMeta) -> Verify {
    let etag = meta
        .e_tag
        .as_deref()
        .map(|e| e.trim_matches('"').to_ascii_lowercase());
    match (&want.sha256, etag) {
        (Some(h), _) => Verify::Sha256(h.trim_start_matches("sha256:").to_string()),
        (None, Some(e)) if e.len() == 32 && e.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Verify::Md5(e)
        }
        _ => Verify::Size,
    }
}

/// A source of one file cannot serve an engine that wants a model directory.
fn one_file(src: &str, want: &Want, what: &str) -> Result<(), FetchError> {
    if want.form == Form::Directory {
        let why = format!("{what}; this engine wants a model directory (use hf:// or a path)");
        return Err(FetchError::invalid(src, why));
    }
    Ok(())
}
