//! The HTTP server: state, routing, endpoint handlers and the streaming body.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::args::Config;
use crate::events::Events;
use crate::imitate;
use crate::multipart;

const LOADING_BODY: &[u8] =
    br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
const HEALTH_OK: &[u8] = br#"{"status":"ok"}"#;
const JSON: &str = "application/json; charset=utf-8";
/// A 1x1 transparent PNG.
const TINY_PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
/// An ID3 tag followed by one silent-ish MPEG frame header: "a few bytes" of audio/mpeg.
const FAKE_MP3: &[u8] =
    b"ID3\x04\x00\x00\x00\x00\x00\x00\xff\xfb\x90\x64\x00\x00\x00\x00\x00\x00\x00\x00";

pub(crate) struct State {
    cfg: Config,
    port: u16,
    pid: u32,
    loaded: AtomicBool,
    active: AtomicUsize,
    waiting: AtomicUsize,
    sem: Arc<Semaphore>,
    busy: Vec<AtomicBool>,
    /// Per slot: until when (ms since `born`) `/slots` still reports it busy (`--slots-lag-ms`).
    lag_until: Vec<AtomicU64>,
    born: Instant,
    events: Option<Arc<Events>>,
    port_hv: HeaderValue,
    models_body: Bytes,
    props_body: Bytes,
    prompt_tokens_total: AtomicU64,
    predicted_total: AtomicU64,
    /// Asleep or awake (vLLM's sleep mode, SGLang's memory release).
    rest: crate::sleep::Rest,
    /// llama-server's own idle sleep (`--sleep-idle-seconds`).
    idle: crate::sleep::Idle,
}

/// Runs the whole server; returns the exit code.
pub(crate) async fn run(cfg: Config, args: Vec<String>) -> i32 {
    let start = Instant::now();
    let pid = std::process::id();
    let events = match &cfg.events_file {
        Some(path) => match Events::open(path, pid, cfg.port) {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => {
                elog!("warning: cannot open events file '{path}': {e}");
                None
            }
        },
        None => None,
    };
    if let Some(ev) = &events {
        // the devices it was given, as an engine's GPU runtime would read them
        let visible: serde_json::Map<String, Value> = [
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
            "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES",
            "ONEAPI_DEVICE_SELECTOR",
            "GGML_VK_VISIBLE_DEVICES",
        ]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), json!(std::env::var(k).ok()?))))
        .collect();
        ev.emit(
            "spawned",
            &[("args", json!(args)), ("visible", Value::Object(visible))],
        );
    }
    for i in 1..=cfg.stderr_lines {
        elog!("stderr line {i}");
    }

    if let Some(model) = &cfg.model {
        match std::fs::metadata(model) {
            Ok(md) => elog!("loading model from {model} ({} bytes)", md.len()),
            Err(_) if cfg.require_model => {
                elog!("error: failed to open model file '{model}'");
                return 1;
            }
            Err(_) => elog!("warning: model file '{model}' not found, pretending to load it"),
        }
    }

    if cfg.fork_grandchild || cfg.setpgrp_grandchild {
        spawn_grandchild(&cfg, events.as_deref());
    }

    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<i32>();

    if cfg.ignore_sigterm {
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    } else {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                let tx = exit_tx.clone();
                let ev = events.clone();
                tokio::spawn(async move {
                    sig.recv().await;
                    elog!("received SIGTERM, exiting");
                    if let Some(ev) = ev {
                        ev.emit("sigterm", &[]);
                    }
                    let _ = tx.send(0);
                });
            }
            Err(e) => elog!("warning: cannot install the SIGTERM handler: {e}"),
        }
    }

    let oom_now = cfg
        .fail_oom_once
        .as_ref()
        .is_some_and(|f| std::fs::File::create_new(f).is_ok());
    if cfg.fail_oom || cfg.fail_port || oom_now {
        return imitate::fail(&cfg, start).await;
    }
    let listener = match imitate::bind(&cfg, start).await {
        Ok(l) => l,
        Err(e) => {
            for line in imitate::port_lines(cfg.imitate, &cfg.host, cfg.port, &e.to_string()) {
                elog!("{line}");
            }
            return 1;
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(cfg.port);
    if let Some(ev) = &events {
        ev.set_port(port);
        ev.emit("listening", &[("host", json!(cfg.host))]);
    }
    elog!(
        "main: HTTP server is listening, hostname: {}, port: {}, http threads: {}",
        cfg.host,
        port,
        cfg.threads
    );

    let models_body = Bytes::from(
        json!({"object":"list","data":[{"id":cfg.alias,"object":"model","owned_by":"llamacpp"}]})
            .to_string(),
    );
    let props_body = Bytes::from(
        json!({
            "total_slots": cfg.slots,
            "model_path": cfg.model,
            "model_alias": cfg.alias,
            "default_generation_settings": {"n_ctx": request_context(&cfg)},
        })
        .to_string(),
    );
    let st = Arc::new(State {
        port,
        pid,
        loaded: AtomicBool::new(imitate::ready_at_bind(&cfg)),
        active: AtomicUsize::new(0),
        waiting: AtomicUsize::new(0),
        sem: Arc::new(Semaphore::new(cfg.slots)),
        busy: (0..cfg.slots).map(|_| AtomicBool::new(false)).collect(),
        lag_until: (0..cfg.slots).map(|_| AtomicU64::new(0)).collect(),
        born: start,
        events,
        port_hv: HeaderValue::from(port),
        models_body,
        props_body,
        prompt_tokens_total: AtomicU64::new(0),
        predicted_total: AtomicU64::new(0),
        rest: Default::default(),
        idle: Default::default(),
        cfg,
    });

    tokio::spawn(loader(st.clone(), start));

    if let Some(ms) = st.cfg.exit_after_ms {
        let st2 = st.clone();
        let tx = exit_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
            let code = st2.cfg.exit_code;
            elog!("fatal: exiting as told (code {code})");
            if let Some(ev) = &st2.events {
                ev.emit("exit", &[("code", json!(code))]);
            }
            let _ = tx.send(code);
        });
    }

    tokio::spawn(accept_loop(st.clone(), listener));

    exit_rx.recv().await.unwrap_or(0)
}

fn spawn_grandchild(cfg: &Config, events: Option<&Events>) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("3600")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit());
    if cfg.setpgrp_grandchild {
        cmd.process_group(0);
    }
    match cmd.spawn() {
        Ok(child) => {
            let gpid = child.id();
            elog!(
                "spawned grandchild pid {gpid}{}",
                if cfg.setpgrp_grandchild {
                    " (own process group)"
                } else {
                    ""
                }
            );
            if let Some(ev) = events {
                ev.emit(
                    "grandchild",
                    &[
                        ("grandchild_pid", json!(gpid)),
                        ("setpgrp", json!(cfg.setpgrp_grandchild)),
                    ],
                );
            }
            // Dropping a Child neither kills nor waits for it.
            drop(child);
        }
        Err(e) => elog!("warning: cannot spawn grandchild: {e}"),
    }
}

/// `--health-progress`: the share of `--loading-ms` passed, in whole `--progress-ms` steps, as a
/// loading report. Never 1, the load being done at 1: past the loading time but not yet marked
/// loaded (a busy machine wakes the loader late), it stays at the last step before 1.
fn loading_report(st: &State) -> Bytes {
    let cfg = &st.cfg;
    let elapsed = st.born.elapsed().as_millis() as u64;
    let last = cfg.loading_ms.saturating_sub(1);
    let mut at = elapsed.min(last);
    if let Some(step) = at.checked_div(cfg.progress_ms) {
        at = step * cfg.progress_ms;
    }
    let fraction = if cfg.loading_ms == 0 {
        0.0
    } else {
        at as f64 / cfg.loading_ms as f64
    };
    let report = json!({"progress": fraction, "message": "loading tensors"});
    Bytes::from(report.to_string())
}

async fn loader(st: Arc<State>, start: Instant) {
    let cfg = &st.cfg;
    let loading = cfg.never_healthy || cfg.loading_ms > 0;
    if loading {
        elog!("main: loading model");
    }
    if loading && cfg.progress_ms > 0 {
        let st2 = st.clone();
        tokio::spawn(async move {
            let every = Duration::from_millis(st2.cfg.progress_ms);
            let mut next = start + every;
            loop {
                tokio::time::sleep_until(next).await;
                next += every;
                if st2.loaded.load(Ordering::Acquire) {
                    break;
                }
                let pct = (start.elapsed().as_millis() as u64 * 100)
                    .checked_div(st2.cfg.loading_ms)
                    .unwrap_or(0)
                    .min(99);
                elog!("loading: {pct}%");
            }
        });
    }
    if cfg.never_healthy {
        return;
    }
    tokio::time::sleep_until(start + Duration::from_millis(cfg.loading_ms)).await;
    if loading && cfg.progress_ms > 0 {
        elog!("loading: 100%");
    }
    if cfg.buffer_report {
        buffer_report(cfg);
    }
    st.loaded.store(true, Ordering::Release);
    elog!("main: model loaded");
    elog!(
        "main: server is listening on http://{}:{} - starting the main loop",
        cfg.host,
        st.port
    );
    elog!("srv  update_slots: all slots are idle");
}

fn buffer_report(cfg: &Config) {
    let mut out = String::new();
    let mut line = |prefix: &str, dev: &str, what: &str, mib: f64| {
        let _ = writeln!(
            out,
            "{prefix}: {dev:>12} {what} buffer size = {mib:>8.2} MiB"
        );
    };
    line("load_tensors", "CPU_Mapped", "model", cfg.report_model_mib);
    for d in &cfg.report_devices {
        line("load_tensors", d, "model", cfg.report_model_mib);
    }
    line("llama_kv_cache", "CPU", "KV", cfg.report_kv_mib);
    for d in &cfg.report_devices {
        line("llama_kv_cache", d, "KV", cfg.report_kv_mib);
    }
    line("llama_context", "CPU", "compute", cfg.report_compute_mib);
    for d in &cfg.report_devices {
        line("llama_context", d, "compute", cfg.report_compute_mib);
    }
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(out.as_bytes());
}

async fn accept_loop(st: Arc<State>, listener: TcpListener) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // e.g. EMFILE: back off a little instead of spinning.
                elog!("warning: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Some(ev) = &st.events {
            ev.emit("connection", &[]);
        }
        let st = st.clone();
        tokio::spawn(async move {
            let idle_close = st.cfg.idle_close_ms.map(Duration::from_millis);
            let svc = service_fn(move |req: Request<Incoming>| {
                let st = st.clone();
                let origin = st.cfg.cors.then(|| req.headers().get("origin").cloned());
                async move {
                    let mut resp = handle(st, req).await;
                    if let Some(origin) = origin {
                        llama_server_cors(resp.headers_mut(), origin);
                    }
                    Ok::<_, Infallible>(resp)
                }
            });
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).keep_alive(true);
            if let Some(idle) = idle_close {
                // the header-read timer also runs while a keep-alive connection waits
                builder.header_read_timeout(idle);
            }
            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// llama-server's CORS headers on every answer: the request's `Origin` echoed, present but empty
/// without one, and credentials allowed.
fn llama_server_cors(headers: &mut HeaderMap, origin: Option<HeaderValue>) {
    let origin = origin.unwrap_or(HeaderValue::from_static(""));
    headers.insert("access-control-allow-origin", origin);
    headers.insert(
        "access-control-allow-credentials",
        HeaderValue::from_static("true"),
    );
}

// ---------------------------------------------------------------------------
// Request tracking

/// Tracks one request from arrival until its response body is finished (or
/// dropped early, which means the peer went away).
struct Tracker {
    st: Arc<State>,
    path: Option<Box<str>>,
    done: bool,
    slot: Option<SlotGuard>,
}

impl Tracker {
    fn new(st: Arc<State>, path: &str) -> Tracker {
        st.active.fetch_add(1, Ordering::AcqRel);
        let path = st.events.as_ref().map(|_| path.into());
        Tracker {
            st,
            path,
            done: false,
            slot: None,
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.st.active.fetch_sub(1, Ordering::AcqRel);
        if let (Some(ev), Some(path)) = (&self.st.events, &self.path) {
            let name = if self.done { "done" } else { "peer_closed" };
            ev.emit(name, &[("path", json!(&**path))]);
        }
    }
}

struct SlotGuard {
    st: Arc<State>,
    idx: usize,
    _permit: OwnedSemaphorePermit,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        // Runs before the permit is released, so a new holder finds a free flag.
        self.st.busy[self.idx].store(false, Ordering::Release);
        if self.st.cfg.slots_lag_ms > 0 {
            let until = self.st.born.elapsed().as_millis() as u64 + self.st.cfg.slots_lag_ms;
            self.st.lag_until[self.idx].store(until, Ordering::Release);
        }
    }
}

struct WaitCount<'a>(&'a AtomicUsize);

impl Drop for WaitCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits (FIFO) for a free slot.
async fn acquire_slot(st: &Arc<State>) -> SlotGuard {
    st.waiting.fetch_add(1, Ordering::AcqRel);
    let w = WaitCount(&st.waiting);
    let permit = st
        .sem
        .clone()
        .acquire_owned()
        .await
        .expect("semaphore never closed");
    drop(w);
    let idx = st
        .busy
        .iter()
        .position(|b| {
            b.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
        .expect("a permit guarantees a free slot");
    SlotGuard {
        st: st.clone(),
        idx,
        _permit: permit,
    }
}

// ---------------------------------------------------------------------------
// Response body

/// The response body: either a full buffer or a timed SSE stream. It owns the
/// request's [`Tracker`], so finishing it records `done` and dropping it early
/// records `peer_closed`.
pub(crate) struct FBody {
    inner: Inner,
    tracker: Option<Tracker>,
}

enum Inner {
    Full(Option<Bytes>),
    Sse(Box<Sse>),
}

impl FBody {
    fn full(b: Bytes, mut tracker: Option<Tracker>) -> FBody {
        if b.is_empty() {
            if let Some(t) = tracker.as_mut() {
                t.done = true;
            }
            return FBody {
                inner: Inner::Full(None),
                tracker,
            };
        }
        FBody {
            inner: Inner::Full(Some(b)),
            tracker,
        }
    }

    fn mark_done(&mut self) {
        if let Some(t) = self.tracker.as_mut() {
            t.done = true;
        }
    }
}

impl Body for FBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let r = match &mut this.inner {
            Inner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Inner::Sse(s) => s.poll(cx, this.tracker.as_ref()),
        };
        match &r {
            Poll::Ready(None) => this.mark_done(),
            Poll::Ready(Some(_)) if matches!(this.inner, Inner::Full(None)) => this.mark_done(),
            Poll::Ready(Some(_)) => {
                if let Inner::Sse(s) = &this.inner {
                    if s.phase == Phase::End {
                        this.mark_done();
                    }
                }
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Sse(s) => s.phase == Phase::End,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Sse(_) => SizeHint::default(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Content,
    Final,
    Done,
    End,
}

struct Sse {
    /// `data: {...,"delta":{"content":"tok` — the number and the rest follow.
    prefix: String,
    final_chunk: Bytes,
    n: u64,
    next: u64,
    interval: Duration,
    start: Instant,
    phase: Phase,
    sleep: Option<Pin<Box<Sleep>>>,
    abort_after: Option<u64>,
    abort_at: Option<Instant>,
    /// Stop sending (but keep the connection open) after this many chunks.
    stall_after: Option<u64>,
}

impl Sse {
    /// Polls the timer until `deadline`; `Ready` once it has passed.
    fn wait(&mut self, cx: &mut Context<'_>, deadline: Instant) -> Poll<()> {
        if deadline <= Instant::now() {
            return Poll::Ready(());
        }
        match &mut self.sleep {
            Some(s) => {
                if s.deadline() != deadline {
                    s.as_mut().reset(deadline);
                }
            }
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.sleep.as_mut().expect("set above").as_mut().poll(cx)
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        tracker: Option<&Tracker>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.phase {
            Phase::Content | Phase::Final => {
                if self.stall_after == Some(self.next) {
                    // hangs until the peer goes away, like an engine stuck mid-generation
                    return Poll::Pending;
                }
                if self.abort_after == Some(self.next) {
                    let at = *self.abort_at.get_or_insert_with(|| {
                        let natural = self.start + self.interval * self.next as u32;
                        natural.max(Instant::now() + Duration::from_millis(20))
                    });
                    if self.wait(cx, at).is_pending() {
                        return Poll::Pending;
                    }
                    elog!(
                        "fatal: aborting with SIGKILL after {} chunks as told",
                        self.next
                    );
                    if let Some(t) = tracker {
                        if let Some(ev) = &t.st.events {
                            ev.emit("abort", &[("chunks", json!(self.next))]);
                        }
                    }
                    // SAFETY: kill(2) on our own pid; it does not return.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                    return Poll::Pending;
                }
                let k = if self.phase == Phase::Content {
                    self.next
                } else {
                    self.n
                };
                if k > 0 && !self.interval.is_zero() {
                    let deadline = self.start + self.interval * k as u32;
                    if self.wait(cx, deadline).is_pending() {
                        return Poll::Pending;
                    }
                }
                if self.phase == Phase::Content && self.next < self.n {
                    let mut s = String::with_capacity(self.prefix.len() + 32);
                    s.push_str(&self.prefix);
                    let _ = write!(s, "{} \"}}}}]}}\n\n", self.next);
                    self.next += 1;
                    if self.next == self.n {
                        self.phase = Phase::Final;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(s)))));
                }
                // Final chunk (also reached directly when n == 0).
                self.phase = Phase::Done;
                Poll::Ready(Some(Ok(Frame::data(self.final_chunk.clone()))))
            }
            Phase::Done => {
                self.phase = Phase::End;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    b"data: [DONE]\n\n",
                )))))
            }
            Phase::End => Poll::Ready(None),
        }
    }
}

// ---------------------------------------------------------------------------
// Routing

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    Health,
    Models,
    Props,
    Slots,
    Metrics,
    Inference,
    Embeddings,
    Rerank,
    Multipart,
    Speech,
    ImageGen,
    Echo,
}

fn route(method: &Method, path: &str) -> Route {
    if *method == Method::GET {
        match path {
            "/health" | "/v1/health" => Route::Health,
            "/v1/models" | "/models" => Route::Models,
            "/props" => Route::Props,
            "/slots" => Route::Slots,
            "/metrics" => Route::Metrics,
            _ => Route::Echo,
        }
    } else if *method == Method::POST {
        match path {
            "/v1/chat/completions"
            | "/chat/completions"
            | "/v1/completions"
            | "/completions"
            | "/completion"
            | "/v1/responses"
            | "/v1/messages"
            | "/infill" => Route::Inference,
            "/v1/embeddings" | "/embeddings" | "/embedding" => Route::Embeddings,
            "/v1/rerank" | "/rerank" | "/reranking" | "/v1/reranking" => Route::Rerank,
            "/v1/audio/transcriptions" | "/v1/audio/translations" | "/v1/images/edits" => {
                Route::Multipart
            }
            "/v1/audio/speech" => Route::Speech,
            "/v1/images/generations" => Route::ImageGen,
            _ => Route::Echo,
        }
    } else {
        Route::Echo
    }
}

fn response(st: &State, status: u16, ctype: &'static str, body: FBody) -> Response<FBody> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert("x-fakellm-port", st.port_hv.clone());
    r
}

fn full(st: &State, status: u16, ctype: &'static str, b: Bytes, t: Tracker) -> Response<FBody> {
    response(st, status, ctype, FBody::full(b, Some(t)))
}

fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        _ => "server_error",
    }
}

fn error_json(status: u16, message: &str) -> Bytes {
    Bytes::from(
        json!({"error":{"code":status,"message":message,"type":error_type(status)}}).to_string(),
    )
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<FBody> {
    let tracker = Tracker::new(st.clone(), req.uri().path());
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return full(
                &st,
                400,
                JSON,
                error_json(400, "failed to read the request body"),
                tracker,
            )
        }
    };
    let path = parts.uri.path();
    let rt = route(&parts.method, path);

    // Parse what the route needs up front: the request event reports `model`.
    let mut json_body: Option<Result<Value, String>> = None;
    let mut mp: Option<Result<MultipartInfo, String>> = None;
    match rt {
        Route::Inference | Route::Embeddings | Route::Rerank | Route::Speech | Route::ImageGen => {
            json_body = Some(serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string()));
        }
        Route::Multipart => mp = Some(parse_multipart(&parts.headers, &body)),
        _ => {}
    }
    if let Some(ev) = &st.events {
        let model: Value = match (&json_body, &mp) {
            (Some(Ok(v)), _) => v.get("model").cloned().unwrap_or(Value::Null),
            (_, Some(Ok(m))) => m.model.clone().map(Value::from).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        ev.emit(
            "request",
            &[
                ("method", json!(parts.method.as_str())),
                ("path", json!(path)),
                ("model", model),
                ("active", json!(st.active.load(Ordering::Acquire))),
            ],
        );
    }

    if !st.loaded.load(Ordering::Acquire) {
        if st.cfg.health_progress && rt == Route::Health {
            return full(&st, 503, JSON, loading_report(&st), tracker);
        }
        return full(&st, 503, JSON, Bytes::from_static(LOADING_BODY), tracker);
    }
    let events = st.events.as_deref();
    let query = parts.uri.query();
    if let Some((status, b)) =
        crate::sleep::route(&st.cfg, &st.rest, events, &parts.method, path, query, &body).await
    {
        return full(&st, status, JSON, Bytes::from(b.to_string()), tracker);
    }
    let needs_weights = matches!(
        rt,
        Route::Inference | Route::Embeddings | Route::Rerank | Route::Multipart
    );
    if needs_weights && st.rest.refuses() {
        let asleep = error_json(503, "the model is sleeping");
        return full(&st, 503, JSON, asleep, tracker);
    }
    if needs_weights && idle_wake(&st).await {
        if let Some(ev) = events {
            ev.emit("woke", &[]);
        }
    }
    if parts.method == Method::GET {
        let used = st.busy.iter().any(|b| b.load(Ordering::Acquire))
            || st.prompt_tokens_total.load(Ordering::Relaxed) > 0;
        if let Some((status, ctype, b)) = imitate::ollama_route(&st.cfg, path, used) {
            return full(&st, status, ctype, b, tracker);
        }
    }

    match rt {
        Route::Health => full(&st, 200, JSON, Bytes::from_static(HEALTH_OK), tracker),
        Route::Models => full(&st, 200, JSON, st.models_body.clone(), tracker),
        Route::Props => full(&st, 200, JSON, props(&st), tracker),
        Route::Slots => {
            let n = st.cfg.slots as u64;
            let per = st.cfg.ctx_size / n.max(1);
            let mut s = String::from("[");
            let now = st.born.elapsed().as_millis() as u64;
            for (i, b) in st.busy.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let lagging = st.lag_until[i].load(Ordering::Acquire) > now;
                let _ = write!(
                    s,
                    "{{\"id\":{i},\"n_ctx\":{per},\"is_processing\":{}}}",
                    b.load(Ordering::Acquire) || lagging
                );
            }
            s.push(']');
            full(&st, 200, JSON, Bytes::from(s), tracker)
        }
        Route::Metrics => {
            let processing = st.busy.iter().filter(|b| b.load(Ordering::Acquire)).count();
            let waiting = st.waiting.load(Ordering::Acquire);
            if let Some(text) = imitate::metrics(&st.cfg, processing, waiting) {
                let ctype = "text/plain; version=0.0.4";
                return full(&st, 200, ctype, Bytes::from(text), tracker);
            }
            let s = format!(
                "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
                 # TYPE llamacpp:prompt_tokens_total counter\n\
                 llamacpp:prompt_tokens_total {}\n\
                 # HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n\
                 # TYPE llamacpp:tokens_predicted_total counter\n\
                 llamacpp:tokens_predicted_total {}\n\
                 # HELP llamacpp:requests_processing Number of requests processing.\n\
                 # TYPE llamacpp:requests_processing gauge\n\
                 llamacpp:requests_processing {}\n\
                 # HELP llamacpp:requests_deferred Number of requests deferred.\n\
                 # TYPE llamacpp:requests_deferred gauge\n\
                 llamacpp:requests_deferred {}\n",
                st.prompt_tokens_total.load(Ordering::Relaxed),
                st.predicted_total.load(Ordering::Relaxed),
                processing,
                st.waiting.load(Ordering::Acquire),
            );
            full(
                &st,
                200,
                "text/plain; version=0.0.4",
                Bytes::from(s),
                tracker,
            )
        }
        Route::Inference => match json_body.expect("parsed above") {
            Ok(v) => inference(st, &parts.headers, &body, v, tracker).await,
            Err(e) => invalid_json(&st, &e, tracker),
        },
        Route::Embeddings => match json_body.expect("parsed above") {
            Ok(v) => embeddings(st, v, tracker).await,
            Err(e) => invalid_json(&st, &e, tracker),
        },
        Route::Rerank => match json_body.expect("parsed above") {
            Ok(v) => rerank(st, v, tracker).await,
            Err(e) => invalid_json(&st, &e, tracker),
        },
        Route::Multipart => match mp.expect("parsed above") {
            Ok(m) => {
                let mut out = json!({
                    "text": "fake transcript",
                    "model": m.model,
                    "file_bytes": m.file_bytes,
                    "file_sha256": m.file_sha256,
                    "fields": m.fields,
                    "files": m.files,
                });
                if path == "/v1/images/edits" {
                    out["data"] = json!([{"b64_json": TINY_PNG_B64}]);
                }
                full(&st, 200, JSON, Bytes::from(out.to_string()), tracker)
            }
            Err(e) => full(&st, 400, JSON, error_json(400, &e), tracker),
        },
        Route::Speech => match json_body.expect("parsed above") {
            Ok(_) => full(
                &st,
                200,
                "audio/mpeg",
                Bytes::from_static(FAKE_MP3),
                tracker,
            ),
            Err(e) => invalid_json(&st, &e, tracker),
        },
        Route::ImageGen => match json_body.expect("parsed above") {
            Ok(v) => {
                let out = json!({
                    "created": unix_secs(),
                    "model": v.get("model").cloned().unwrap_or(Value::Null),
                    "data": [{"b64_json": TINY_PNG_B64}],
                });
                full(&st, 200, JSON, Bytes::from(out.to_string()), tracker)
            }
            Err(e) => invalid_json(&st, &e, tracker),
        },
        Route::Echo => {
            let mut s = String::with_capacity(256);
            s.push_str("{\"method\":");
            push_json_str(&mut s, parts.method.as_str());
            s.push_str(",\"path\":");
            push_json_str(&mut s, path);
            s.push_str(",\"query\":");
            match parts.uri.query() {
                Some(q) => push_json_str(&mut s, q),
                None => s.push_str("null"),
            }
            s.push_str(",\"headers\":");
            push_headers(&mut s, &parts.headers);
            let _ = write!(s, ",\"body_bytes\":{},\"port\":{}}}", body.len(), st.port);
            full(&st, 200, JSON, Bytes::from(s), tracker)
        }
    }
}

/// `/props`, with `is_sleeping` where the engine sleeps by itself when idle.
fn props(st: &State) -> Bytes {
    if st.cfg.sleep_idle_seconds.is_none() {
        return st.props_body.clone();
    }
    let now = st.born.elapsed().as_millis() as u64;
    let others = st.active.load(Ordering::Acquire) > 1; // this request is one
    let mut v: Value = serde_json::from_slice(&st.props_body).unwrap_or_default();
    v["is_sleeping"] = json!(st.idle.asleep(&st.cfg, now, others));
    Bytes::from(v.to_string())
}

/// Marks the model used; wakes it first (in `--wake-ms`) when it slept. True when it slept.
async fn idle_wake(st: &State) -> bool {
    let now = st.born.elapsed().as_millis() as u64;
    let others = st.active.load(Ordering::Acquire) > 1;
    let slept = st.idle.used(&st.cfg, now, others);
    if slept {
        tokio::time::sleep(Duration::from_millis(st.cfg.wake_ms)).await;
    }
    slept
}

fn invalid_json(st: &State, e: &str, t: Tracker) -> Response<FBody> {
    full(
        st,
        400,
        JSON,
        error_json(400, &format!("invalid JSON in request body: {e}")),
        t,
    )
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn push_json_str(out: &mut String, s: &str) {
    // serde_json's escaping, without building a Value.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

/// Writes the request headers as a JSON object (names are already lowercase;
/// repeated headers are joined with ", ").
fn push_headers(out: &mut String, headers: &HeaderMap) {
    out.push('{');
    for (i, name) in headers.keys().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, name.as_str());
        out.push(':');
        let mut val = String::new();
        for (j, v) in headers.get_all(name).iter().enumerate() {
            if j > 0 {
                val.push_str(", ");
            }
            val.push_str(&String::from_utf8_lossy(v.as_bytes()));
        }
        push_json_str(out, &val);
    }
    out.push('}');
}

// ---------------------------------------------------------------------------
// Inference

/// Number of bytes of text in a prompt-ish value (strings, arrays of them, or
/// objects carrying `content` / `text`).
fn text_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(o) => ["content", "text", "input"]
            .iter()
            .filter_map(|k| o.get(*k))
            .map(text_bytes)
            .sum(),
        _ => 0,
    }
}

fn tokens_for(bytes: usize) -> u64 {
    (bytes.div_ceil(4) as u64).max(1)
}

fn prompt_tokens(v: &Value) -> u64 {
    let mut n = 0;
    for k in ["messages", "prompt", "input", "system", "input_extra"] {
        if let Some(x) = v.get(k) {
            n += text_bytes(x);
        }
    }
    tokens_for(n)
}

struct Params {
    chunks: u64,
    interval_ms: u64,
    delay_ms: u64,
    status: Option<u16>,
    abort_after: Option<u64>,
    stall_after: Option<u64>,
}

fn params(cfg: &Config, v: &Value) -> Params {
    let ov = v.get("fakellm").filter(|o| o.is_object());
    let get = |k: &str| ov.and_then(|o| o.get(k)).and_then(Value::as_u64);
    let chunks = get("chunks").unwrap_or_else(|| {
        [
            "max_tokens",
            "max_completion_tokens",
            "n_predict",
            "max_output_tokens",
        ]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .map(|m| m.min(10000))
        .unwrap_or(cfg.chunks)
    });
    Params {
        chunks,
        interval_ms: get("interval_ms").unwrap_or(cfg.chunk_interval_ms),
        delay_ms: get("delay_ms").unwrap_or(cfg.response_delay_ms),
        status: get("status")
            .map(|s| s as u16)
            .or(cfg.completion_status)
            .filter(|s| *s != 200 && (100..=999).contains(s)),
        abort_after: get("abort_after_chunks").or(cfg.abort_after_chunks),
        stall_after: get("stall_after_chunks"),
    }
}

fn timings_json(prompt: u64, n: u64, interval_ms: u64) -> String {
    let p_tok_ms = 0.1f64;
    let g_tok_ms = if interval_ms > 0 {
        interval_ms as f64
    } else {
        1.0
    };
    format!(
        "{{\"cache_n\":0,\"prompt_n\":{prompt},\"prompt_ms\":{:.3},\"prompt_per_token_ms\":{p_tok_ms:.3},\
         \"prompt_per_second\":{:.3},\"predicted_n\":{n},\"predicted_ms\":{:.3},\
         \"predicted_per_token_ms\":{g_tok_ms:.3},\"predicted_per_second\":{:.3}}}",
        prompt as f64 * p_tok_ms,
        1000.0 / p_tok_ms,
        n as f64 * g_tok_ms,
        1000.0 / g_tok_ms,
    )
}

async fn inference(
    st: Arc<State>,
    headers: &HeaderMap,
    raw: &[u8],
    v: Value,
    mut tracker: Tracker,
) -> Response<FBody> {
    let p = params(&st.cfg, &v);
    if let Some(status) = p.status {
        if p.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(p.delay_ms)).await;
        }
        let msg = format!("fakellm: answering with status {status} as told");
        return full(&st, status, JSON, error_json(status, &msg), tracker);
    }
    let model_json = match v.get("model") {
        Some(m) => m.to_string(),
        None => Value::from(st.cfg.alias.as_str()).to_string(),
    };
    let prompt = prompt_tokens(&v);
    let n = p.chunks;
    tracker.slot = Some(acquire_slot(&st).await);
    if p.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(p.delay_ms)).await;
    }
    st.prompt_tokens_total.fetch_add(prompt, Ordering::Relaxed);
    st.predicted_total.fetch_add(n, Ordering::Relaxed);
    let usage = format!(
        "{{\"prompt_tokens\":{prompt},\"completion_tokens\":{n},\"total_tokens\":{}}}",
        prompt + n
    );
    let timings = timings_json(prompt, n, p.interval_ms);

    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        let include_usage = v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let head = format!(
            "data: {{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"model\":{model_json},\"choices\":[{{\"index\":0,"
        );
        let prefix = format!("{head}\"delta\":{{\"content\":\"tok");
        let mut fin = format!("{head}\"delta\":{{}},\"finish_reason\":\"stop\"}}]");
        if include_usage {
            let _ = write!(fin, ",\"usage\":{usage}");
        }
        let _ = write!(fin, ",\"timings\":{timings}}}\n\n");
        let sse = Sse {
            prefix,
            final_chunk: Bytes::from(fin),
            n,
            next: 0,
            interval: Duration::from_millis(p.interval_ms),
            start: Instant::now(),
            phase: if n == 0 { Phase::Final } else { Phase::Content },
            sleep: None,
            abort_after: p.abort_after,
            abort_at: None,
            stall_after: p.stall_after,
        };
        let body = FBody {
            inner: Inner::Sse(Box::new(sse)),
            tracker: Some(tracker),
        };
        let mut r = response(&st, 200, "text/event-stream", body);
        r.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        return r;
    }

    const WORDS: &str = "hello from fakellm";
    let mut content = String::with_capacity((WORDS.len() + 1) * n as usize);
    for i in 0..n {
        if i > 0 {
            content.push(' ');
        }
        content.push_str(WORDS);
    }
    let raw_trimmed = raw.trim_ascii();
    let mut s = String::with_capacity(512 + content.len() + raw_trimmed.len());
    let _ = write!(
        s,
        "{{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion\",\"created\":{},\"model\":{model_json},\
         \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{content}\"}},\"finish_reason\":\"stop\"}}],\
         \"usage\":{usage},\"timings\":{timings},\"fakellm\":{{\"port\":{},\"pid\":{},\"request\":",
        unix_secs(),
        st.port,
        st.pid
    );
    // The body parsed as JSON, so it can be embedded verbatim.
    s.push_str(std::str::from_utf8(raw_trimmed).unwrap_or("null"));
    s.push_str(",\"headers\":");
    push_headers(&mut s, headers);
    s.push_str("}}");
    full(&st, 200, JSON, Bytes::from(s), tracker)
}

// ---------------------------------------------------------------------------
// Embeddings and rerank

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// A deterministic unit vector derived from the text.
pub(crate) fn embed(text: &str, dim: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(dim);
    let mut block = 0u32;
    while v.len() < dim {
        let mut h = Sha256::new();
        h.update(block.to_le_bytes());
        h.update(text.as_bytes());
        let d: [u8; 32] = h.finalize().into();
        for c in d.chunks_exact(4) {
            if v.len() == dim {
                break;
            }
            let u = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            v.push(u as f64 / u32::MAX as f64 * 2.0 - 1.0);
        }
        block += 1;
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = ((*x / norm) * 1e6).round() / 1e6;
        }
    }
    v
}

fn as_texts(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => vec![v.to_string()],
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => s.clone(),
                Value::Object(o) => o
                    .get("text")
                    .and_then(Value::as_str)
                    .map(String::from)
                    .unwrap_or_else(|| x.to_string()),
                _ => x.to_string(),
            })
            .collect(),
        Value::Null => Vec::new(),
        other => vec![other.to_string()],
    }
}

async fn embeddings(st: Arc<State>, v: Value, mut tracker: Tracker) -> Response<FBody> {
    let input = v.get("input").or_else(|| v.get("content"));
    let texts = match input {
        Some(i) => as_texts(i),
        None => {
            return full(
                &st,
                400,
                JSON,
                error_json(400, "\"input\" must be provided"),
                tracker,
            )
        }
    };
    let delay = params(&st.cfg, &v).delay_ms;
    tracker.slot = Some(acquire_slot(&st).await);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let mut tokens = 0;
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            tokens += tokens_for(t.len());
            json!({"object":"embedding","index":i,"embedding":embed(t, st.cfg.embedding_dim)})
        })
        .collect();
    st.prompt_tokens_total.fetch_add(tokens, Ordering::Relaxed);
    let out = json!({
        "object": "list",
        "model": v.get("model").cloned().unwrap_or_else(|| json!(st.cfg.alias)),
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    full(&st, 200, JSON, Bytes::from(out.to_string()), tracker)
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect()
}

/// Relevance in [0, 1): mostly the share of query words found in the
/// document, plus a small deterministic jitter to break ties.
pub(crate) fn relevance(query: &str, doc: &str) -> f64 {
    let q = words(query);
    let d = words(doc);
    let overlap = if q.is_empty() {
        0.0
    } else {
        q.iter().filter(|w| d.contains(w)).count() as f64 / q.len() as f64
    };
    let h = sha256(format!("{query}\u{0}{doc}").as_bytes());
    let jitter = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as f64 / (u32::MAX as f64 + 1.0);
    ((0.9 * overlap + 0.1 * jitter) * 1e6).round() / 1e6
}

async fn rerank(st: Arc<State>, v: Value, mut tracker: Tracker) -> Response<FBody> {
    let query = match v.get("query").and_then(Value::as_str) {
        Some(q) => q.to_string(),
        None => {
            return full(
                &st,
                400,
                JSON,
                error_json(400, "\"query\" must be provided"),
                tracker,
            )
        }
    };
    let docs = match v.get("documents").or_else(|| v.get("texts")) {
        Some(d @ Value::Array(_)) => as_texts(d),
        _ => {
            return full(
                &st,
                400,
                JSON,
                error_json(400, "\"documents\" must be an array"),
                tracker,
            )
        }
    };
    let delay = params(&st.cfg, &v).delay_ms;
    tracker.slot = Some(acquire_slot(&st).await);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let return_docs = v.get("return_documents").and_then(Value::as_bool) == Some(true);
    let mut tokens = 0;
    let mut results: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            tokens += tokens_for(query.len() + d.len());
            (i, relevance(&query, d))
        })
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(top) = v.get("top_n").and_then(Value::as_u64) {
        results.truncate(top as usize);
    }
    let results: Vec<Value> = results
        .into_iter()
        .map(|(i, s)| {
            let mut r = json!({"index": i, "relevance_score": s});
            if return_docs {
                r["document"] = json!({"text": docs[i]});
            }
            r
        })
        .collect();
    st.prompt_tokens_total.fetch_add(tokens, Ordering::Relaxed);
    let out = json!({
        "model": v.get("model").cloned().unwrap_or_else(|| json!(st.cfg.alias)),
        "object": "list",
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    full(&st, 200, JSON, Bytes::from(out.to_string()), tracker)
}

// ---------------------------------------------------------------------------
// Multipart uploads

struct MultipartInfo {
    model: Option<String>,
    file_bytes: usize,
    file_sha256: Option<String>,
    fields: serde_json::Map<String, Value>,
    files: Vec<Value>,
}

fn parse_multipart(headers: &HeaderMap, body: &[u8]) -> Result<MultipartInfo, String> {
    let ct = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .ok_or("missing Content-Type")?;
    let boundary = multipart::boundary_from_content_type(ct)
        .ok_or("Content-Type is not multipart/form-data with a boundary")?;
    let parts = multipart::parse(body, &boundary)?;
    let mut info = MultipartInfo {
        model: None,
        file_bytes: 0,
        file_sha256: None,
        fields: serde_json::Map::new(),
        files: Vec::new(),
    };
    for p in &parts {
        if p.filename.is_some() {
            let sum = hex(&sha256(p.data));
            if info.file_sha256.is_none() {
                info.file_bytes = p.data.len();
                info.file_sha256 = Some(sum.clone());
            }
            info.files.push(json!({
                "name": p.name,
                "filename": p.filename,
                "content_type": p.content_type,
                "bytes": p.data.len(),
                "sha256": sum,
            }));
        } else {
            let val = String::from_utf8_lossy(p.data).into_owned();
            if p.name == "model" {
                info.model = Some(val.clone());
            }
            info.fields.insert(p.name.clone(), Value::from(val));
        }
    }
    Ok(info)
}

/// The context one request can use, as llama-server's `/props` reports it: the context shared by
/// the slots, unless the KV cache is unified (or `--props-n-ctx` says otherwise).
fn request_context(cfg: &Config) -> u64 {
    cfg.props_n_ctx.unwrap_or(if cfg.kv_unified {
        cfg.ctx_size
    } else {
        cfg.ctx_size / cfg.slots.max(1) as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embed("hello", 8);
        assert_eq!(a, embed("hello", 8));
        assert_ne!(a, embed("world", 8));
        assert_eq!(embed("x", 20).len(), 20);
        let norm: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }

    #[test]
    fn props_reports_the_context_of_one_slot() {
        let cfg = |ctx_size, slots, kv_unified, props_n_ctx| Config {
            ctx_size,
            slots,
            kv_unified,
            props_n_ctx,
            ..Config::default()
        };
        assert_eq!(request_context(&cfg(4096, 4, false, None)), 1024);
        assert_eq!(request_context(&cfg(4096, 4, true, None)), 4096);
        assert_eq!(request_context(&cfg(4096, 4, false, Some(3000))), 3000);
    }

    #[test]
    fn relevance_prefers_overlap() {
        assert!(relevance("red apple", "a red apple") > relevance("red apple", "blue sky"));
        let r = relevance("q", "d");
        assert!((0.0..1.0).contains(&r));
    }

    #[test]
    fn prompt_token_count() {
        let v = json!({"messages":[{"role":"user","content":"12345678"},{"role":"user","content":[{"type":"text","text":"1"}]}]});
        assert_eq!(prompt_tokens(&v), 3); // 9 bytes -> 3 tokens
        assert_eq!(prompt_tokens(&json!({})), 1);
        assert_eq!(prompt_tokens(&json!({"prompt":"abcd"})), 1);
    }

    #[test]
    fn params_overrides() {
        let cfg = Config::default();
        let p = params(&cfg, &json!({"max_tokens": 3}));
        assert_eq!(p.chunks, 3);
        let p = params(&cfg, &json!({"max_tokens": 99999}));
        assert_eq!(p.chunks, 10000);
        let p = params(
            &cfg,
            &json!({"max_tokens": 3, "fakellm":{"chunks":7,"interval_ms":1,"delay_ms":2,"status":500}}),
        );
        assert_eq!(
            (p.chunks, p.interval_ms, p.delay_ms, p.status),
            (7, 1, 2, Some(500))
        );
        let p = params(&cfg, &json!({}));
        assert_eq!((p.chunks, p.interval_ms, p.status), (5, 10, None));
    }

    #[test]
    fn routes() {
        assert_eq!(route(&Method::GET, "/health"), Route::Health);
        assert_eq!(route(&Method::POST, "/health"), Route::Echo);
        assert_eq!(route(&Method::POST, "/v1/messages"), Route::Inference);
        assert_eq!(route(&Method::POST, "/reranking"), Route::Rerank);
        assert_eq!(route(&Method::PUT, "/v1/chat/completions"), Route::Echo);
    }
}
