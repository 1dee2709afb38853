//! An imitation of the Hugging Face Hub, the Ollama registry and a plain file server, on
//! loopback: the revision API, `resolve` with a redirect to a CDN path and the Hub's headers,
//! registry manifests and blobs, range requests, and knobs to drop a connection part way once,
//! serve wrong bytes, or ask for a token. Every request is counted.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use sha2::Digest;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One file of a repository.
#[derive(Clone)]
pub struct RepoFile {
    pub path: String,
    pub data: Bytes,
    /// Stored in LFS (named by sha256) rather than git (named by its blob id).
    pub lfs: bool,
}

impl RepoFile {
    pub fn etag(&self) -> String {
        if self.lfs {
            hex(&sha2::Sha256::digest(&self.data))
        } else {
            let mut h = sha1::Sha1::new();
            sha1::Digest::update(&mut h, format!("blob {}\0", self.data.len()).as_bytes());
            sha1::Digest::update(&mut h, &self.data);
            hex(&sha1::Digest::finalize(h))
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn sha256(b: &[u8]) -> String {
    hex(&sha2::Sha256::digest(b))
}

/// Deterministic filler bytes, different per seed.
pub fn bytes(seed: u8, len: usize) -> Bytes {
    let mut x: u32 = 0x9e37_79b9 ^ seed as u32;
    let mut out = b"GGUF".to_vec();
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.push(x as u8);
    }
    out.truncate(len);
    Bytes::from(out)
}

#[derive(Default)]
pub struct State {
    pub repos: HashMap<String, Vec<RepoFile>>,
    /// Content by CDN name (an etag or an Ollama digest's hex).
    pub blobs: HashMap<String, Bytes>,
    /// Ollama manifests by `ns/model/tag`.
    pub manifests: HashMap<String, String>,
    /// Plain files under `/files/`.
    pub files: HashMap<String, Bytes>,
    /// Requests by path.
    pub hits: HashMap<String, usize>,
    /// `Range` headers seen, by path.
    pub ranges: HashMap<String, Vec<String>>,
    /// Cut the next response for a path after this many bytes (once).
    pub drop_after: HashMap<String, usize>,
    /// Paths whose content is served with its last byte flipped.
    pub corrupt: HashSet<String>,
    /// A bearer token the Hub API and resolve insist on.
    pub token: Option<String>,
    /// Paths answered with this status and body instead.
    pub refuse: HashMap<String, (u16, String)>,
    /// Paths whose range requests get all of the file from its first byte, in a 206 that says so,
    /// as from a server that reads the range wrong.
    pub range_from_start: HashSet<String>,
    /// Every `Referer` a request came with.
    pub referers: Vec<String>,
    /// Cut each of the next responses for a path (the count) after this many bytes of it.
    pub cut_each: HashMap<String, (usize, usize)>,
    /// Hold the next response for a path after this many bytes (once), until the semaphore
    /// gives a permit.
    pub stall_after: HashMap<String, (usize, Arc<tokio::sync::Semaphore>)>,
    /// Paths served with this many bytes more than their content, in a chunked answer that
    /// declares no length.
    pub overlong: HashMap<String, usize>,
}

#[derive(Clone)]
pub struct Hub {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl Hub {
    pub async fn start() -> Hub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(serve(&state, req)) }
                    });
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
        Hub { url, state }
    }

    pub fn add_repo(&self, repo: &str, files: Vec<RepoFile>) {
        let mut s = self.state.lock().unwrap();
        for f in &files {
            s.blobs.insert(f.etag(), f.data.clone());
        }
        s.repos.insert(repo.to_string(), files);
    }

    /// An Ollama model: layers of (media type, content); returns the manifest text.
    pub fn add_ollama(&self, ns_model_tag: &str, layers: &[(&str, Bytes)]) -> String {
        let mut s = self.state.lock().unwrap();
        let config = Bytes::from_static(b"{\"model_format\":\"gguf\"}");
        let entry = |media: &str, data: &Bytes| json!({"mediaType": media, "digest": format!("sha256:{}", sha256(data)), "size": data.len()});
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": entry("application/vnd.docker.container.image.v1+json", &config),
            "layers": layers.iter().map(|(m, d)| entry(m, d)).collect::<Vec<_>>(),
        })
        .to_string();
        s.blobs.insert(sha256(&config), config);
        for (_, d) in layers {
            s.blobs.insert(sha256(d), d.clone());
        }
        s.manifests
            .insert(ns_model_tag.to_string(), manifest.clone());
        manifest
    }

    pub fn hits(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    pub fn total_hits(&self) -> usize {
        self.state.lock().unwrap().hits.values().sum()
    }

    pub fn ranges(&self, path: &str) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .ranges
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// The offsets of the range requests for a path (`bytes=N-` → N).
    pub fn resumed_at(&self, path: &str) -> Vec<u64> {
        let parse = |r: &String| r.strip_prefix("bytes=")?.trim_end_matches('-').parse().ok();
        self.ranges(path).iter().filter_map(parse).collect()
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let body = Full::new(body.into()).map_err(|never| match never {});
    Response::builder()
        .status(status)
        .body(body.boxed())
        .unwrap()
}

fn serve(state: &Mutex<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let mut s = state.lock().unwrap();
    *s.hits.entry(path.clone()).or_default() += 1;
    if let Some(referer) = req.headers().get("referer") {
        s.referers.push(referer.to_str().unwrap_or("?").to_string());
    }
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(r) = &range {
        s.ranges.entry(path.clone()).or_default().push(r.clone());
    }
    if let Some((status, body)) = s.refuse.get(&path) {
        let status = StatusCode::from_u16(*status).unwrap();
        return Response::builder()
            .status(status)
            .body(
                Full::new(Bytes::from(body.clone()))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap();
    }
    // a range of another version than the one asked for is not sent: the whole file is
    let if_range = req.headers().get("if-range").and_then(|v| v.to_str().ok());
    let range = range.filter(|_| {
        let current = |data: &Bytes| format!("\"{}\"", sha256(data));
        let served = path
            .strip_prefix("/files/")
            .and_then(|name| s.files.get(name))
            .or_else(|| {
                path.strip_prefix("/cdn/")
                    .and_then(|name| s.blobs.get(name))
            });
        if_range.is_none_or(|v| served.is_some_and(|data| current(data) == v))
    });
    let authorized = match &s.token {
        None => true,
        Some(t) => {
            req.headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                == Some(&format!("Bearer {t}"))
        }
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        return revision(&s, rest, authorized);
    }
    if let Some(name) = path.strip_prefix("/cdn/") {
        let data = s.blobs.get(name).cloned();
        return content(&mut s, &path, data, range);
    }
    if let Some(name) = path.strip_prefix("/files/") {
        let data = s.files.get(name).cloned();
        return content(&mut s, &path, data, range);
    }
    if let Some(rest) = path.strip_prefix("/v2/") {
        return registry(&s, rest);
    }
    if let Some((repo, file)) = path.trim_start_matches('/').split_once("/resolve/") {
        return resolve(&s, repo, file, authorized);
    }
    reply(StatusCode::NOT_FOUND, "no such route")
}

fn revision(s: &State, rest: &str, authorized: bool) -> Response<Body> {
    if !authorized {
        return reply(StatusCode::UNAUTHORIZED, "Invalid credentials");
    }
    let Some((repo, rev)) = rest.split_once("/revision/") else {
        return reply(StatusCode::NOT_FOUND, "");
    };
    let Some(files) = s.repos.get(repo) else {
        let mut r = reply(
            StatusCode::NOT_FOUND,
            "{\"error\":\"Repository not found\"}",
        );
        r.headers_mut()
            .insert("x-error-code", "RepoNotFound".parse().unwrap());
        return r;
    };
    if rev != "main" && rev != COMMIT {
        let mut r = reply(StatusCode::NOT_FOUND, "{\"error\":\"Invalid rev id\"}");
        r.headers_mut()
            .insert("x-error-code", "RevisionNotFound".parse().unwrap());
        return r;
    }
    let siblings: Vec<_> = files
        .iter()
        .map(|f| {
            let mut v = json!({"rfilename": f.path, "size": f.data.len(), "blobId": f.etag()});
            if f.lfs {
                v["lfs"] = json!({"sha256": f.etag(), "size": f.data.len(), "pointerSize": 134});
                v["blobId"] = json!("00000000000000000000000000000000000000aa");
            }
            v
        })
        .collect();
    reply(
        StatusCode::OK,
        json!({"id": repo, "sha": COMMIT, "siblings": siblings}).to_string(),
    )
}

fn resolve(s: &State, repo: &str, file: &str, authorized: bool) -> Response<Body> {
    if !authorized {
        return reply(StatusCode::UNAUTHORIZED, "Invalid credentials");
    }
    let (commit, path) = file.split_once('/').unwrap_or((file, ""));
    let found = s
        .repos
        .get(repo)
        .and_then(|fs| fs.iter().find(|f| f.path == path && commit == COMMIT));
    let Some(f) = found else {
        let mut r = reply(StatusCode::NOT_FOUND, "Entry not found");
        r.headers_mut()
            .insert("x-error-code", "EntryNotFound".parse().unwrap());
        return r;
    };
    let mut r = reply(StatusCode::FOUND, "");
    let h = r.headers_mut();
    h.insert("location", format!("/cdn/{}", f.etag()).parse().unwrap());
    h.insert("x-repo-commit", COMMIT.parse().unwrap());
    h.insert(
        "x-linked-etag",
        format!("\"{}\"", f.etag()).parse().unwrap(),
    );
    h.insert("x-linked-size", f.data.len().into());
    h.insert("etag", format!("\"{}\"", f.etag()).parse().unwrap());
    r
}

fn registry(s: &State, rest: &str) -> Response<Body> {
    if let Some((name, tag)) = rest.split_once("/manifests/") {
        return match s.manifests.get(&format!("{name}/{tag}")) {
            Some(m) => reply(StatusCode::OK, m.clone()),
            None => reply(
                StatusCode::NOT_FOUND,
                "{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\"}]}",
            ),
        };
    }
    match rest.split_once("/blobs/sha256:") {
        Some((_, hex)) if s.blobs.contains_key(hex) => {
            let mut r = reply(StatusCode::TEMPORARY_REDIRECT, "");
            r.headers_mut()
                .insert("location", format!("/cdn/{hex}").parse().unwrap());
            r
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "{\"errors\":[{\"code\":\"BLOB_UNKNOWN\"}]}",
        ),
    }
}

/// The bytes, honouring `Range: bytes=N-`, cut or corrupted as the knobs say.
fn content(
    s: &mut State,
    path: &str,
    data: Option<Bytes>,
    range: Option<String>,
) -> Response<Body> {
    let Some(mut data) = data else {
        return reply(StatusCode::NOT_FOUND, "not found");
    };
    let etag = format!("\"{}\"", sha256(&data));
    if s.corrupt.contains(path) {
        let mut v = data.to_vec();
        *v.last_mut().unwrap() ^= 0xff;
        data = Bytes::from(v);
    }
    let total = data.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
    let start = match start {
        Some(_) if s.range_from_start.contains(path) => Some(0),
        start => start,
    };
    let (status, body) = match start {
        Some(n) if n >= total => return reply(StatusCode::RANGE_NOT_SATISFIABLE, ""),
        Some(n) => (StatusCode::PARTIAL_CONTENT, data.slice(n..)),
        None => (StatusCode::OK, data),
    };
    let len = body.len();
    let cut_each = match s.cut_each.get_mut(path) {
        Some((cut, left)) if *left > 0 => {
            *left -= 1;
            Some(*cut)
        }
        _ => None,
    };
    let drop_after = s.drop_after.remove(path).or(cut_each);
    if let Some(&extra) = s.overlong.get(path) {
        let mut longer = body.to_vec();
        longer.resize(len + extra, 0);
        let frames = futures_util::stream::iter([Ok(Frame::data(Bytes::from(longer)))]);
        let r = Response::builder().status(status).header("etag", etag);
        return r.body(StreamBody::new(frames).boxed()).unwrap();
    }
    let body: Body = match (drop_after, s.stall_after.remove(path)) {
        (Some(cut), _) if cut < len => cut_after(body.slice(..cut)),
        (_, Some((at, gate))) if at < len => stalled(body, at, gate),
        _ => Full::new(body).map_err(|never| match never {}).boxed(),
    };
    let mut r = Response::builder()
        .status(status)
        .header("content-length", len)
        .header("accept-ranges", "bytes")
        .header("etag", etag);
    if let Some(n) = start {
        r = r.header("content-range", format!("bytes {n}-{}/{total}", total - 1));
    }
    r.body(body).unwrap()
}

/// A body that sends `body` up to `at`, then the rest once `gate` gives a permit.
fn stalled(body: Bytes, at: usize, gate: Arc<tokio::sync::Semaphore>) -> Body {
    let head = futures_util::stream::once(std::future::ready(Ok(Frame::data(body.slice(..at)))));
    let rest = futures_util::stream::once(async move {
        let _ = gate.acquire().await;
        Ok(Frame::data(body.slice(at..)))
    });
    StreamBody::new(futures_util::StreamExt::chain(head, rest)).boxed()
}

/// A body that sends `head`, then fails, which makes the server drop the connection. It yields
/// a few times in between so the server writes `head` out before the failure discards what is
/// still buffered; a client still sees at most `head`.
fn cut_after(head: Bytes) -> Body {
    let mut step = 0;
    let frames = futures_util::stream::poll_fn(move |cx| {
        step += 1;
        match step {
            1 => Poll::Ready(Some(Ok(Frame::data(head.clone())))),
            2..=20 => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            _ => Poll::Ready(Some(Err(std::io::Error::other(
                "connection dropped on purpose",
            )))),
        }
    });
    StreamBody::new(frames).boxed()
}
