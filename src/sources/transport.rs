//! Opening a remote file at an offset, over HTTP or S3, with failures sorted into those worth
//! another try and those that end the fetch.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use http::{HeaderMap, StatusCode};
use object_store::{GetOptions, GetRange, GetResult, ObjectStore};

use super::cache_fs::JSON_AT_MOST;
use super::FetchError;

/// Where one file's bytes come from.
#[derive(Clone)]
pub(crate) enum Transport {
    Http {
        client: reqwest::Client,
        url: String,
        headers: HeaderMap,
        /// What to tell the user on 401/403 (the variable that holds the token).
        auth_fix: &'static str,
    },
    S3 {
        store: Arc<dyn ObjectStore>,
        path: object_store::path::Path,
    },
}

/// A response under way: its bytes start at `start` (0 when a server ignored the range, or the
/// file changed since the part held was fetched).
pub(crate) struct Opened {
    pub start: u64,
    pub total: Option<u64>,
    /// What names this version of the file (a strong ETag, else its Last-Modified): a resume asks
    /// for the rest of this version only.
    pub version: Option<String>,
    pub stream: BoxStream<'static, Result<Bytes, String>>,
}

/// Why an attempt to open failed.
pub(crate) enum Failure {
    /// A dropped connection, a 5xx, a timeout: try again after a pause.
    Retry(String),
    /// The part already held does not fit the file any more (416): start from zero.
    Restart,
    /// Nothing another try would change.
    Fatal(FetchError),
}

impl Transport {
    /// Opens the file at `offset`: from there when it is still the `version` the part held
    /// was fetched from, else from its start.
    pub(crate) async fn open(
        &self,
        src: &str,
        file: &str,
        offset: u64,
        version: Option<&str>,
    ) -> Result<Opened, Failure> {
        let from = From { offset, version };
        match self {
            Transport::Http {
                client,
                url,
                headers,
                auth_fix,
            } => open_http(client, url, headers, from, src, file, auth_fix).await,
            Transport::S3 { store, path } => open_s3(store.as_ref(), path, from, src, file).await,
        }
    }
}

/// Where a download goes on from: an offset into one version of the file.
#[derive(Clone, Copy)]
struct From<'a> {
    offset: u64,
    version: Option<&'a str>,
}

/// A strong ETag names one version of the content; with no ETag at all, the time it was last
/// modified does. A weak ETag names none: a range cannot be asked of it, nor by a date instead
/// (RFC 9110 §13.1.5).
fn version_of(headers: &HeaderMap) -> Option<String> {
    let text = |name| headers.get(name)?.to_str().ok().map(str::to_string);
    match text(http::header::ETAG) {
        Some(etag) => Some(etag).filter(|etag| !etag.starts_with("W/")),
        None => text(http::header::LAST_MODIFIED),
    }
}

async fn open_http(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    from: From<'_>,
    src: &str,
    file: &str,
    auth_fix: &str,
) -> Result<Opened, Failure> {
    let resp = ranged_request(client, url, headers, from)
        .send()
        .await
        .map_err(|e| Failure::Retry(http_error(&e)))?;
    let status = resp.status();
    let Some((start, total)) = range_answered(&resp, from.offset)? else {
        let said = server_said(resp).await;
        return Err(http_failure(status, src, file, auth_fix, &said));
    };
    let version = version_of(resp.headers());
    let stream = resp.bytes_stream().map_err(|e| http_error(&e)).boxed();
    Ok(Opened {
        start,
        total,
        version,
        stream,
    })
}

/// Where the bytes of a successful answer start and the file's whole length, when known; `None`
/// for an error status. Bytes from elsewhere than `offset`, or a refused range, restart the part.
fn range_answered(
    resp: &reqwest::Response,
    offset: u64,
) -> Result<Option<(u64, Option<u64>)>, Failure> {
    match resp.status() {
        StatusCode::OK => Ok(Some((0, resp.content_length()))),
        StatusCode::PARTIAL_CONTENT => match content_range(resp.headers()) {
            Some((first, total)) if first == offset => Ok(Some((offset, total))),
            // bytes from elsewhere than the end of the part, or from where it does not say
            _ => Err(Failure::Restart),
        },
        StatusCode::RANGE_NOT_SATISFIABLE => Err(Failure::Restart),
        _ => Ok(None),
    }
}

/// The GET of `url`, asking for the rest of the version the part held when there is a part.
fn ranged_request(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    from: From<'_>,
) -> reqwest::RequestBuilder {
    let offset = from.offset;
    let mut req = client.get(url).headers(headers.clone());
    if offset > 0 {
        req = req.header(http::header::RANGE, format!("bytes={offset}-"));
        // a file changed since comes whole (200), not as the rest of another version
        if let Some(version) = from.version {
            req = req.header(http::header::IF_RANGE, version);
        }
    }
    req
}

/// Asks up to three times, pausing 0.6 s and then 1.2 s after a failure worth another try; the
/// network error naming `file` (what was asked for) once the tries run out. For the small JSON
/// documents a fetch starts from (a listing, a manifest).
pub(crate) async fn three_tries<T, Fut>(
    src: &str,
    file: &str,
    mut ask: impl FnMut() -> Fut,
) -> Result<T, FetchError>
where
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let mut last = String::new();
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(300 << attempt)).await;
        }
        match ask().await {
            Ok(answer) => return Ok(answer),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Retry(why)) => last = why,
            Err(Failure::Restart) => {}
        }
    }
    Err(FetchError::Network {
        src: src.to_string(),
        file: file.into(),
        attempts: 3,
        detail: last,
    })
}

/// The body of a JSON answer (`what`, for the error), refused past
/// [`JSON_AT_MOST`](super::cache_fs::JSON_AT_MOST) bytes: by its declared length before a byte
/// is read, else as soon as the bytes that came pass it.
pub(crate) async fn json_body(
    mut resp: reqwest::Response,
    src: &str,
    what: &str,
) -> Result<Vec<u8>, FetchError> {
    let too_long = || json_too_long(src, what);
    if resp
        .content_length()
        .is_some_and(|n| n > JSON_AT_MOST as u64)
    {
        return Err(too_long());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| FetchError::invalid(src, http_error(&e)))?
    {
        if body.len() + chunk.len() > JSON_AT_MOST {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error for a JSON answer (`what`) over [`JSON_AT_MOST`] bytes.
fn json_too_long(src: &str, what: &str) -> FetchError {
    FetchError::invalid(
        src,
        format!(
            "{what} is over {JSON_AT_MOST} bytes, more than any such answer takes; check the \
             endpoint it came from"
        ),
    )
}

/// The most of an error answer's body shown: what a server says of a refusal (an expired
/// link, a gated repository, a registry's `errors`) fits in it.
const SAID_AT_MOST: usize = 300;

/// What an error answer's body says, on one line and cut to [`SAID_AT_MOST`] characters (of at
/// most the body's first 4 KiB, however long it is).
pub(crate) async fn server_said(mut resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < 4096 {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(4096);
    let text = String::from_utf8_lossy(&body);
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(SAID_AT_MOST) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

/// Sorts an HTTP error status: 401/403 name the credentials, 404 the file, 5xx and 429 retry.
/// What the server `said` of it goes with the error.
pub(crate) fn http_failure(
    status: StatusCode,
    src: &str,
    file: &str,
    auth_fix: &str,
    said: &str,
) -> Failure {
    let with_said = |text: String| match said {
        "" => text,
        said => format!("{text} (the server said: {said})"),
    };
    match status.as_u16() {
        401 | 403 => Failure::Fatal(FetchError::Credentials {
            src: src.to_string(),
            status: status.as_u16(),
            fix: with_said(auth_fix.to_string()),
        }),
        404 => Failure::Fatal(FetchError::NotFound {
            src: src.to_string(),
            what: file.to_string(),
        }),
        429 | 500..=599 => Failure::Retry(with_said(format!("HTTP {status}"))),
        _ => Failure::Fatal(FetchError::invalid(
            src,
            with_said(format!("{file}: unexpected HTTP {status}")),
        )),
    }
}

/// `Content-Range: bytes 100-199/200` → where the bytes start (100) and, when known, the whole
/// length (200; `*` says it is unknown).
fn content_range(headers: &HeaderMap) -> Option<(u64, Option<u64>)> {
    let value = headers.get(http::header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let first = range.split_once('-')?.0.trim().parse().ok()?;
    Some((first, total.trim().parse().ok()))
}

/// The error with its causes, which is where reqwest keeps the useful part.
/// A reqwest error with its causes, the URL in it masked as sources are shown (no password, no
/// query values: a URL source may carry its token there).
pub(crate) fn http_error(e: &reqwest::Error) -> String {
    let text = error_chain(e);
    match e.url() {
        Some(url) => text.replace(url.as_str(), &super::parse::mask_url(url.as_str())),
        None => text,
    }
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

async fn open_s3(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    from: From<'_>,
    src: &str,
    file: &str,
) -> Result<Opened, Failure> {
    let resuming = from.offset > 0;
    let options = GetOptions {
        range: resuming.then_some(GetRange::Offset(from.offset)),
        // an object replaced since is refused (412), and fetched again whole
        if_match: from.version.filter(|_| resuming).map(str::to_string),
        ..Default::default()
    };
    match store.get_opts(path, options).await {
        Ok(got) => Ok(opened_object(got)),
        Err(object_store::Error::Precondition { .. }) if resuming => Err(Failure::Restart),
        Err(e) => Err(s3_failure(e, src, file)),
    }
}

/// An object's answer as an opened download: the range it sends, its size and ETag.
fn opened_object(got: GetResult) -> Opened {
    let total = Some(got.meta.size);
    let start = got.range.start;
    let version = got.meta.e_tag.clone();
    let stream = got.into_stream().map_err(|e| error_chain(&e)).boxed();
    Opened {
        start,
        total,
        version,
        stream,
    }
}

pub(crate) fn s3_failure(e: object_store::Error, src: &str, file: &str) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => Failure::Fatal(FetchError::NotFound {
            src: src.to_string(),
            what: format!("object {file}"),
        }),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            Failure::Fatal(FetchError::Credentials {
                src: src.to_string(),
                status: 403,
                fix: format!(
                    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a web identity) with read \
                     access to the object ({})",
                    error_chain(&e)
                ),
            })
        }
        E::Generic { .. } => Failure::Retry(error_chain(&e)),
        other => Failure::Fatal(FetchError::invalid(src, error_chain(&other))),
    }
}

#[cfg(test)]
mod tests {
    /// A URL's password and query values stay out of an error about it.
    #[tokio::test]
    async fn an_error_about_a_url_hides_its_secrets() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = format!("http://user:hunter2@127.0.0.1:{port}/m.gguf?token=s3cret");
        let e = reqwest::get(&url).await.unwrap_err();
        assert!(error_chain(&e).contains("s3cret"), "reqwest names the URL");
        let text = http_error(&e);
        assert!(
            !text.contains("hunter2") && !text.contains("s3cret") && text.contains("token=***"),
            "{text}"
        );
    }

    use super::*;

    /// A resume asks for the rest of a version named by a strong ETag, else by the date when there
    /// is no ETag; a weak ETag names none, and no date stands in for it.
    #[test]
    fn a_version_is_a_strong_etag_or_else_a_date() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, http::HeaderValue::from_static(v));
            }
            h
        };
        let date = ("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(
            version_of(&headers(&[("etag", "\"abc\""), date])).as_deref(),
            Some("\"abc\"")
        );
        assert_eq!(version_of(&headers(&[("etag", "W/\"abc\""), date])), None);
        assert_eq!(version_of(&headers(&[date])).as_deref(), Some(date.1));
        assert_eq!(version_of(&headers(&[])), None);
    }

    #[test]
    fn a_content_range_says_where_its_bytes_start() {
        let range = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("content-range", http::HeaderValue::from_static(v));
            content_range(&h)
        };
        assert_eq!(range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(range("bytes 0-99/*"), Some((0, None)));
        assert_eq!(
            range("bytes */200"),
            None,
            "a refusal's form names no bytes"
        );
        assert_eq!(range("items 1-2/3"), None);
        assert_eq!(content_range(&HeaderMap::new()), None);
    }
}
