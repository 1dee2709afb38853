//! The soak run: minutes of mixed traffic through one corral, sampling its memory, descriptors and
//! threads, to show that nothing grows and nothing is lost.
//!
//! corral runs in front of the fake engine with four models: `pool` (two replicas), `swap-a` and
//! `swap-b` (a swap group, so alternating between them swaps engines) and `crashy` (its engine exits
//! after a few seconds and restarts with corral's backoff). Traffic, all at once, each kind in
//! paced workers (a worker sends its next request at its next tick, or at once when the answer came
//! late), about 25 requests/s in all:
//!
//! | kind | workers × period | what |
//! |---|---|---|
//! | pool-json | 6 × 400 ms | non-streaming chat on keep-alive connections |
//! | pool-stream | 4 × 800 ms | SSE, 20 chunks 10 ms apart, read to `[DONE]` |
//! | aborted | 2 × 1 s | SSE, 50 chunks 20 ms apart, dropped after 3 chunks |
//! | swap | 1 × 1 s | alternately `swap-a` and `swap-b`, JSON and SSE in turn |
//! | crashy | 1 × 2 s | non-streaming chat to the model that keeps crashing |
//!
//! Every minute the config file is rewritten with the pool's description toggled and corral gets
//! SIGHUP. Every 10 s a row: corral's VmRSS and thread count (/proc/PID/status), its open
//! descriptors (/proc/PID/fd), and the requests answered and failed so far.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::{self, Limit, Load};
use crate::procfs;
use crate::sse;
use crate::suite::{addr, free_port, free_port_run, stream_body, wait_until_up, BoxError, Proc};

const CHAT: &str = "/v1/chat/completions";
/// How long any one request may take before it counts as failed (a swap waits for an engine start).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const STREAM_CHUNKS: u64 = 20;
const STREAM_INTERVAL_MS: u64 = 10;
const ABORT_CHUNKS: u64 = 50;
const ABORT_INTERVAL_MS: u64 = 20;
/// Content chunks an aborting client reads before it drops the connection.
const ABORT_AFTER: usize = 3;
/// The crashing model's engine exits this long after it starts.
const CRASH_AFTER_MS: u64 = 5000;

pub struct Opts {
    pub corral: PathBuf,
    pub duration: Duration,
    pub out: PathBuf,
    pub sample_every: Duration,
    pub reload_every: Duration,
    pub keep: bool,
}

// ---------------------------------------------------------------------------------------------
// the tally of answers

/// Which traffic a request belonged to; `crashy` is counted apart, since its failures are expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    PoolJson,
    PoolStream,
    Aborted,
    Swap,
    Crashy,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::PoolJson => "pool-json",
            Kind::PoolStream => "pool-stream",
            Kind::Aborted => "aborted",
            Kind::Swap => "swap",
            Kind::Crashy => "crashy",
        }
    }

    const ALL: [Kind; 5] = [
        Kind::PoolJson,
        Kind::PoolStream,
        Kind::Aborted,
        Kind::Swap,
        Kind::Crashy,
    ];
}

#[derive(Default)]
struct KindTally {
    ok: u64,
    /// Failure reason → count.
    failed: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Tally(Mutex<BTreeMap<Kind, KindTally>>);

/// Requests answered and failed so far: those that must succeed, and the crashing model's.
#[derive(Clone, Copy, Default, Debug)]
struct Totals {
    ok: u64,
    failed: u64,
    crashy_ok: u64,
    crashy_failed: u64,
}

impl Tally {
    fn record(&self, kind: Kind, result: Result<(), String>) {
        let mut t = self.0.lock().expect("tally");
        let k = t.entry(kind).or_default();
        match result {
            Ok(()) => k.ok += 1,
            Err(why) => *k.failed.entry(why).or_default() += 1,
        }
    }

    fn totals(&self) -> Totals {
        let t = self.0.lock().expect("tally");
        let mut out = Totals::default();
        for (kind, k) in t.iter() {
            let failed: u64 = k.failed.values().sum();
            if *kind == Kind::Crashy {
                out.crashy_ok += k.ok;
                out.crashy_failed += failed;
            } else {
                out.ok += k.ok;
                out.failed += failed;
            }
        }
        out
    }

    fn ok_of(&self, kind: Kind) -> u64 {
        self.0.lock().expect("tally").get(&kind).map_or(0, |k| k.ok)
    }

    /// One line per kind, then one per failure reason.
    fn render(&self) -> String {
        let t = self.0.lock().expect("tally");
        let mut s = String::new();
        for kind in Kind::ALL {
            let (ok, failed) = t
                .get(&kind)
                .map(|k| (k.ok, k.failed.values().sum::<u64>()))
                .unwrap_or((0, 0));
            let _ = writeln!(s, "  {:<12} ok {ok:>7}   failed {failed:>5}", kind.name());
            if let Some(k) = t.get(&kind) {
                for (why, n) in &k.failed {
                    let _ = writeln!(s, "      {n:>6} × {why}");
                }
            }
        }
        s
    }
}

/// Failure reasons name the kind of failure, not its details, so they add up over a run.
fn short(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    s.chars().take(100).collect()
}

// ---------------------------------------------------------------------------------------------
// requests

fn json_body(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
           "fakellm": {"chunks": 3}})
    .to_string()
}

/// A keep-alive connection, opened when first needed and again after an error.
struct JsonClient {
    addr: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl JsonClient {
    fn new(addr: SocketAddr) -> JsonClient {
        JsonClient { addr, sender: None }
    }

    /// One non-streaming chat request: a 200 whose JSON has a non-empty answer.
    async fn chat(&mut self, model: &str) -> Result<(), String> {
        let load = Load {
            addr: self.addr,
            method: hyper::Method::POST,
            path: CHAT.into(),
            body: Bytes::from(json_body(model)),
            content_type: "application/json".into(),
            concurrency: 1,
            limit: Limit::Requests(1),
        };
        let sender = match &mut self.sender {
            Some(s) => s,
            None => self.sender.insert(
                http::connect(self.addr)
                    .await
                    .map_err(|e| short(format!("connect: {e}")))?,
            ),
        };
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, http::once(sender, &load)).await;
        let (status, body) = match answer {
            Err(_) => {
                self.sender = None;
                return Err("timeout".into());
            }
            Ok(Err(e)) => {
                self.sender = None;
                return Err(short(format!("connection: {e}")));
            }
            Ok(Ok((status, body, _))) => (status, body),
        };
        if status != 200 {
            return Err(format!("status {status}: {}", error_message(&body)));
        }
        let v: Value = serde_json::from_slice(&body).map_err(|_| "answer is not JSON")?;
        match v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
        {
            Some(c) if !c.is_empty() => Ok(()),
            _ => Err("answer without content".into()),
        }
    }
}

/// The message of an error answer, its numbers masked so that the same failure always reads the
/// same ("crashy failed N times in a row (circuit open, next start in Ns)…").
fn error_message(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let mut out = String::new();
    for c in text.chars().take(90) {
        match (c.is_ascii_digit(), out.ends_with('N')) {
            (true, true) => {}
            (true, false) => out.push('N'),
            (false, _) => out.push(c),
        }
    }
    out
}

/// One streaming request read to the end: a 200 with every content chunk, then `data: [DONE]`.
async fn stream_to_end(addr: SocketAddr, model: &str) -> Result<(), String> {
    let req = sse::post(
        addr,
        CHAT,
        &stream_body(model, STREAM_CHUNKS, STREAM_INTERVAL_MS),
    );
    let s = sse::run_stream(addr, &req, REQUEST_TIMEOUT)
        .await
        .map_err(|e| short(format!("stream: {e}")))?;
    if s.status != 200 {
        return Err(format!("status {}", s.status));
    }
    let chunks = s.events.iter().filter(|e| e.index.is_some()).count() as u64;
    let done = s.events.last().is_some_and(|e| e.done);
    match (chunks == STREAM_CHUNKS, done) {
        (true, true) => Ok(()),
        (true, false) => Err("stream without [DONE]".into()),
        (false, _) => Err("stream missing chunks".into()),
    }
}

/// A client that drops its stream after a few chunks: a 200 and `ABORT_AFTER` chunks, then the
/// socket closes with the rest unread.
async fn stream_and_drop(addr: SocketAddr, model: &str) -> Result<(), String> {
    let req = sse::post(
        addr,
        CHAT,
        &stream_body(model, ABORT_CHUNKS, ABORT_INTERVAL_MS),
    );
    let read = async {
        let mut sock = TcpStream::connect(addr)
            .await
            .map_err(|e| short(format!("connect: {e}")))?;
        sock.write_all(&req)
            .await
            .map_err(|e| short(format!("write: {e}")))?;
        let mut reader = sse::Reader::new();
        let (mut body, mut buf) = (Vec::new(), vec![0u8; 16 * 1024]);
        loop {
            let n = sock
                .read(&mut buf)
                .await
                .map_err(|e| short(format!("read: {e}")))?;
            if n == 0 {
                return Err("closed before the chunks".to_string());
            }
            reader.feed(&buf[..n], &mut body)?;
            if let Some(status) = reader.status.filter(|s| *s != 200) {
                return Err(format!("status {status}"));
            }
            if content_chunks(&body) >= ABORT_AFTER {
                return Ok(()); // dropping `sock` closes the connection mid-stream
            }
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err("timeout".into()))
}

fn content_chunks(body: &[u8]) -> usize {
    body.windows(b"\"content\":\"tok".len())
        .filter(|w| *w == b"\"content\":\"tok")
        .count()
}

/// Runs `job` every `period` from `first` until `until`; a late answer delays only the next tick.
async fn paced<F, Fut>(first: Instant, period: Duration, until: Instant, mut job: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut next = first;
    tokio::time::sleep_until(next.into()).await;
    while Instant::now() < until {
        job().await;
        next = (next + period).max(Instant::now());
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Starts `workers` paced loops of one kind, their first ticks spread over one period.
fn spawn_kind<F, J, Fut>(
    set: &mut tokio::task::JoinSet<()>,
    workers: u32,
    period: Duration,
    until: Instant,
    make: F,
) where
    F: Fn(u32) -> J,
    J: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let start = Instant::now();
    for w in 0..workers {
        let first = start + period * w / workers;
        let job = make(w);
        set.spawn(paced(first, period, until, job));
    }
}

// ---------------------------------------------------------------------------------------------
// corral and its config

/// The config; `generation` only changes the pool's description, so a reload changes no process.
fn config(exe: &str, start_port: u16, generation: u32) -> String {
    let engine = |alias: &str, extra: &str| {
        format!("{exe} fake-engine --port ${{PORT}} --threads 1 -np 8 --alias {alias}{extra}")
    };
    format!(
        "# generated by corral-load soak (generation {generation})
healthCheckTimeout: 30
startPort: {start_port}
logLevel: warn
models:
  pool:
    description: soak pool, {flavour}
    cmd: {pool}
    proxy: http://127.0.0.1:${{PORT}}
    replicas: 2
    startReplicas: all
    ttl: 0
  swap-a:
    cmd: {swap_a}
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
  swap-b:
    cmd: {swap_b}
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
  crashy:
    cmd: {crashy}
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
groups:
  steady:
    swap: false
    exclusive: false
    members: [pool, crashy]
  swapping:
    swap: true
    exclusive: false
    members: [swap-a, swap-b]
",
        flavour = if generation % 2 == 0 {
            "plain"
        } else {
            "toggled"
        },
        pool = engine("soak-pool", ""),
        swap_a = engine("soak-swap-a", ""),
        swap_b = engine("soak-swap-b", ""),
        crashy = engine("soak-crashy", &format!(" --exit-after-ms {CRASH_AFTER_MS}")),
    )
}

/// Every engine corral runs under the given `--alias` (both replicas of the pool).
fn engines_of(corral_pid: u32, alias: &str) -> Vec<u32> {
    procfs::children(corral_pid)
        .into_iter()
        .filter(|pid| {
            procfs::cmdline(*pid)
                .windows(2)
                .any(|w| w[0] == "--alias" && w[1] == alias)
        })
        .collect()
}

/// Rewrites the config with the next generation and sends SIGHUP.
fn reload(
    corral: &Proc,
    path: &Path,
    exe: &str,
    start_port: u16,
    generation: u32,
) -> Result<(), BoxError> {
    std::fs::write(path, config(exe, start_port, generation))?;
    // SAFETY: kill(2) on our own child.
    if unsafe { libc::kill(corral.pid() as i32, libc::SIGHUP) } != 0 {
        return Err(format!("SIGHUP: {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

/// `GET /metrics`, summed by metric name and the given label (`result`, `model`, …).
async fn metric_sums(a: SocketAddr, name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(text) = get_text(a, "/metrics").await else {
        return out;
    };
    for line in text.lines().filter(|l| l.starts_with(name)) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !series[name.len()..].starts_with(['{', ' ']) && series.len() != name.len() {
            continue;
        }
        let key = series
            .split_once(&format!("{label}=\""))
            .and_then(|(_, rest)| rest.split('"').next())
            .unwrap_or("")
            .to_string();
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

async fn get_text(a: SocketAddr, path: &str) -> Result<String, BoxError> {
    let load = Load {
        addr: a,
        method: hyper::Method::GET,
        path: path.into(),
        body: Bytes::new(),
        content_type: String::new(),
        concurrency: 1,
        limit: Limit::Requests(1),
    };
    let mut s = http::connect(a).await?;
    let (_, body, _) = http::once(&mut s, &load).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

// ---------------------------------------------------------------------------------------------
// samples and the verdict

#[derive(Clone, Debug)]
struct Sample {
    at_s: f64,
    rss_kib: u64,
    fds: usize,
    threads: u64,
    totals: Totals,
    reloads: u32,
}

const CSV_HEAD: &str = "t_s,rss_mib,fds,threads,ok,failed,crashy_ok,crashy_failed,reloads";
const TABLE_HEAD: &str = "|    t (s) | RSS (MiB) |  fds | threads |       ok | failed | crashy ok / failed | reloads |\n\
                          |---------:|----------:|-----:|--------:|---------:|-------:|-------------------:|--------:|";

impl Sample {
    fn take(pid: u32, at_s: f64, totals: Totals, reloads: u32) -> Option<Sample> {
        Some(Sample {
            at_s,
            rss_kib: procfs::rss_kib(pid)?,
            fds: procfs::fd_count(pid)?,
            threads: procfs::threads(pid)?,
            totals,
            reloads,
        })
    }

    fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    fn csv(&self) -> String {
        let t = self.totals;
        format!(
            "{:.0},{:.2},{},{},{},{},{},{},{}",
            self.at_s,
            self.rss_mib(),
            self.fds,
            self.threads,
            t.ok,
            t.failed,
            t.crashy_ok,
            t.crashy_failed,
            self.reloads
        )
    }

    fn row(&self) -> String {
        let t = self.totals;
        format!(
            "| {:>8.0} | {:>9.2} | {:>4} | {:>7} | {:>8} | {:>6} | {:>18} | {:>7} |",
            self.at_s,
            self.rss_mib(),
            self.fds,
            self.threads,
            t.ok,
            t.failed,
            format!("{} / {}", t.crashy_ok, t.crashy_failed),
            self.reloads
        )
    }
}

/// How much the last third of the samples after warm-up may exceed the first third.
pub const RSS_GROWTH: f64 = 1.10;
pub const FD_GROWTH: usize = 5;
pub const THREAD_GROWTH: u64 = 2;
/// Warm-up: the first 2 minutes, or the first quarter of a shorter run.
fn warm_up(run: Duration) -> Duration {
    (run / 4).min(Duration::from_secs(120))
}

/// One line of the verdict: what was checked, whether it held.
struct Check {
    what: String,
    ok: bool,
}

/// Flat after warm-up: a reading over the last third of the samples within a bound of the same
/// reading over the first third. RSS and threads by their maxima (a leak moves the peak too, and
/// neither jitters much); descriptors by their median, since each request in flight holds one or
/// two (readings move by ~10 from one sample to the next at this traffic) and a single busy moment
/// would move a maximum by more than a leak of a few: a leak raises every reading, the median too.
fn flatness(samples: &[Sample], warm: Duration) -> Vec<Check> {
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at_s >= warm.as_secs_f64())
        .collect();
    let third = after.len() / 3;
    if third == 0 {
        return vec![Check {
            what: format!(
                "at least 3 samples after the {} s warm-up ({} taken)",
                warm.as_secs(),
                after.len()
            ),
            ok: false,
        }];
    }
    let (first, last) = (&after[..third], &after[after.len() - third..]);
    let max = |part: &[&Sample], f: &dyn Fn(&Sample) -> f64| {
        part.iter().map(|s| f(s)).fold(0.0, f64::max)
    };
    let (r0, r1) = (max(first, &|s| s.rss_mib()), max(last, &|s| s.rss_mib()));
    let (f0, f1) = (median_fds(first), median_fds(last));
    let (fmax0, fmax1) = (max(first, &|s| s.fds as f64), max(last, &|s| s.fds as f64));
    let (t0, t1) = (
        max(first, &|s| s.threads as f64),
        max(last, &|s| s.threads as f64),
    );
    vec![
        Check {
            what: format!(
                "RSS: last third's max {r1:.2} MiB ≤ first third's max {r0:.2} MiB × {RSS_GROWTH}"
            ),
            ok: r1 <= r0 * RSS_GROWTH,
        },
        Check {
            what: format!(
                "fds: last third's median {f1} ≤ first third's median {f0} + {FD_GROWTH} \
                 (maxima {fmax1} and {fmax0})"
            ),
            ok: f1 <= f0 + FD_GROWTH,
        },
        Check {
            what: format!(
                "threads: last third's max {t1} ≤ first third's max {t0} + {THREAD_GROWTH}"
            ),
            ok: t1 <= t0 + THREAD_GROWTH as f64,
        },
    ]
}

fn median_fds(part: &[&Sample]) -> usize {
    let mut v: Vec<usize> = part.iter().map(|s| s.fds).collect();
    v.sort_unstable();
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------------
// the run

/// Runs the soak; `Ok(true)` when the verdict holds.
pub async fn run(opts: Opts) -> Result<bool, BoxError> {
    procfs::raise_nofile();
    let work = std::env::temp_dir().join(format!("corral-soak-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = run_in(&opts, &work).await;
    if opts.keep || !matches!(result, Ok(true)) {
        eprintln!("soak: logs and config kept in {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

async fn run_in(opts: &Opts, work: &Path) -> Result<bool, BoxError> {
    let exe_path = std::fs::canonicalize(&opts.corral)
        .map_err(|e| format!("{}: {e}", opts.corral.display()))?;
    let exe = exe_path.display().to_string();
    let start_port = free_port_run(8);
    let port = free_port();
    let config_path = work.join("corral.yaml");
    std::fs::write(&config_path, config(&exe, start_port, 0))?;
    eprintln!(
        "soak: starting corral on 127.0.0.1:{port} ({})",
        work.display()
    );
    let mut command = Command::new(&exe_path);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            // Should the soak itself be killed, corral (and so its engines) goes with it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let corral = Proc {
        name: "corral",
        child: command
            .arg("--config")
            .arg(&config_path)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .env("CORRAL_STATE_DIR", work.join("state"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(work.join("corral.log"))?)
            .stderr(std::fs::File::create(work.join("corral.err"))?)
            .spawn()
            .map_err(|e| format!("cannot start {exe}: {e}"))?,
    };
    let a = addr(port);
    wait_until_up(a, "/health", Duration::from_secs(10)).await?;
    let pool = start_pool(a, corral.pid()).await?;
    eprintln!(
        "soak: pool replicas running as pids {pool:?}; traffic for {} s",
        opts.duration.as_secs()
    );

    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let until = start + opts.duration;
    let mut traffic = tokio::task::JoinSet::new();
    spawn_traffic(&mut traffic, a, until, &tally);

    std::fs::create_dir_all(&opts.out)?;
    let csv_path = opts.out.join("soak-latest.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(csv, "{CSV_HEAD}")?;
    println!("{TABLE_HEAD}");

    let mut samples = Vec::new();
    let mut checks = Vec::new();
    let (mut reloads, mut pool_moved) = (0u32, Vec::new());
    let mut next_sample = start;
    while next_sample <= until {
        let (done, sample_at) = (reloads, next_sample - start);
        for at in reloads_due(done, sample_at, opts.duration, opts.reload_every) {
            tokio::time::sleep_until((start + at).into()).await;
            reloads += 1;
            reload(&corral, &config_path, &exe, start_port, reloads)?;
        }
        tokio::time::sleep_until(next_sample.into()).await;
        let at = start.elapsed().as_secs_f64();
        let Some(s) = Sample::take(corral.pid(), at, tally.totals(), reloads) else {
            checks.push(Check {
                what: format!("corral still running at {at:.0} s"),
                ok: false,
            });
            break;
        };
        println!("{}", s.row());
        writeln!(csv, "{}", s.csv())?;
        let now_pool = engines_of(corral.pid(), "soak-pool");
        if now_pool != pool {
            pool_moved.push(format!("{at:.0} s: {now_pool:?}"));
        }
        samples.push(s);
        next_sample += opts.sample_every;
    }
    let stopping = Instant::now();
    while tokio::time::timeout(REQUEST_TIMEOUT, traffic.join_next())
        .await
        .ok()
        .flatten()
        .is_some()
    {}
    let quiet = Sample::take(
        corral.pid(),
        start.elapsed().as_secs_f64(),
        tally.totals(),
        reloads,
    );
    let reload_results = metric_sums(a, "corral_config_reloads_total", "result").await;
    let restarts = metric_sums(a, "corral_instance_restarts_total", "model").await;
    let stops = metric_sums(a, "corral_instance_stops_total", "reason").await;
    drop(corral);

    println!("\nAnswers by kind (crashy's failures are expected and not judged):");
    print!("{}", tally.render());
    if let Some(q) = &quiet {
        println!(
            "\nAfter the traffic stopped ({:.1} s to drain): RSS {:.2} MiB, {} fds, {} threads",
            stopping.elapsed().as_secs_f64(),
            q.rss_mib(),
            q.fds,
            q.threads
        );
    }
    println!("corral's metrics: reloads {reload_results:?}; restarts by model {restarts:?}; stops by reason {stops:?}");

    let warm = warm_up(opts.duration);
    checks.extend(flatness(&samples, warm));
    checks.extend(nothing_lost(&tally));
    let reloaded = reload_results.get("success").copied().unwrap_or(0.0);
    checks.push(Check {
        what: format!("every reload succeeded: {reloaded} of {reloads} SIGHUPs counted as success"),
        ok: reloaded == reloads as f64,
    });
    checks.push(Check {
        what: format!(
            "the pool's engines kept running through the reloads (pids {pool:?}){}",
            if pool_moved.is_empty() {
                String::new()
            } else {
                format!(": changed at {}", pool_moved.join(", "))
            }
        ),
        ok: pool_moved.is_empty(),
    });

    println!(
        "\nVerdict (warm-up {} s; samples every {} s; CSV: {}):",
        warm.as_secs(),
        opts.sample_every.as_secs(),
        csv_path.display()
    );
    for c in &checks {
        println!("  {} {}", if c.ok { "ok  " } else { "FAIL" }, c.what);
    }
    let pass = checks.iter().all(|c| c.ok);
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}

/// When the reloads after the first `done` fall, from the start of the run: those due by the
/// sample at `sample_at` (a reload due with a sample goes first), none at or past the end.
fn reloads_due(done: u32, sample_at: Duration, run: Duration, every: Duration) -> Vec<Duration> {
    (done + 1..)
        .map(|n| every * n)
        .take_while(|at| *at <= sample_at && *at < run)
        .collect()
}

/// Nothing lost: no failure among the requests that must succeed, and some of every kind answered.
fn nothing_lost(tally: &Tally) -> Vec<Check> {
    let t = tally.totals();
    let mut checks = vec![Check {
        what: format!(
            "nothing lost: {} answered in full, {} failed",
            t.ok, t.failed
        ),
        ok: t.failed == 0,
    }];
    for kind in [Kind::PoolJson, Kind::PoolStream, Kind::Aborted, Kind::Swap] {
        let ok = tally.ok_of(kind);
        checks.push(Check {
            what: format!("{} answered: {ok}", kind.name()),
            ok: ok > 0,
        });
    }
    checks
}

/// Starts the pool with one request and waits until both replicas run; returns their pids.
async fn start_pool(a: SocketAddr, corral_pid: u32) -> Result<Vec<u32>, BoxError> {
    JsonClient::new(a)
        .chat("pool")
        .await
        .map_err(|e| format!("first request to the pool: {e}"))?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let pids = engines_of(corral_pid, "soak-pool");
        if pids.len() == 2 {
            return Ok(pids);
        }
        if Instant::now() > until {
            return Err(format!("the pool runs {} replicas, not 2", pids.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every kind of traffic, each in its own paced workers, until `until`.
fn spawn_traffic(
    set: &mut tokio::task::JoinSet<()>,
    a: SocketAddr,
    until: Instant,
    tally: &Arc<Tally>,
) {
    let ms = Duration::from_millis;
    spawn_kind(set, 6, ms(400), until, |_| {
        let (tally, client) = (
            tally.clone(),
            Arc::new(tokio::sync::Mutex::new(JsonClient::new(a))),
        );
        move || {
            let (tally, client) = (tally.clone(), client.clone());
            async move {
                let r = client.lock().await.chat("pool").await;
                tally.record(Kind::PoolJson, r);
            }
        }
    });
    spawn_kind(set, 4, ms(800), until, |_| {
        let tally = tally.clone();
        move || {
            let tally = tally.clone();
            async move { tally.record(Kind::PoolStream, stream_to_end(a, "pool").await) }
        }
    });
    spawn_kind(set, 2, ms(1000), until, |_| {
        let tally = tally.clone();
        move || {
            let tally = tally.clone();
            async move { tally.record(Kind::Aborted, stream_and_drop(a, "pool").await) }
        }
    });
    spawn_kind(set, 1, ms(1000), until, |_| {
        let (tally, client) = (
            tally.clone(),
            Arc::new(tokio::sync::Mutex::new(JsonClient::new(a))),
        );
        let turn = Arc::new(std::sync::atomic::AtomicU64::new(0));
        move || {
            let (tally, client, turn) = (tally.clone(), client.clone(), turn.clone());
            async move {
                let i = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // a, b, a, b, …: every request swaps; JSON for two turns, then SSE for two.
                let model = if i % 2 == 0 { "swap-a" } else { "swap-b" };
                let r = if (i / 2) % 2 == 0 {
                    client.lock().await.chat(model).await
                } else {
                    stream_to_end(a, model).await
                };
                tally.record(Kind::Swap, r);
            }
        }
    });
    spawn_kind(set, 1, ms(2000), until, |_| {
        let (tally, client) = (
            tally.clone(),
            Arc::new(tokio::sync::Mutex::new(JsonClient::new(a))),
        );
        move || {
            let (tally, client) = (tally.clone(), client.clone());
            async move {
                let r = client.lock().await.chat("crashy").await;
                tally.record(Kind::Crashy, r);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, rss_mib: f64, fds: usize, threads: u64) -> Sample {
        Sample {
            at_s,
            rss_kib: (rss_mib * 1024.0) as u64,
            fds,
            threads,
            totals: Totals::default(),
            reloads: 0,
        }
    }

    fn verdicts(samples: &[Sample]) -> Vec<bool> {
        flatness(samples, Duration::from_secs(30))
            .iter()
            .map(|c| c.ok)
            .collect()
    }

    #[test]
    fn flat_readings_pass_and_warm_up_is_ignored() {
        let mut s = vec![sample(0.0, 5.0, 10, 3), sample(10.0, 9.0, 20, 4)];
        s.extend((3..12).map(|i| sample(i as f64 * 10.0, 14.0 + (i % 2) as f64, 30 + i % 3, 6)));
        assert_eq!(verdicts(&s), [true, true, true]);
    }

    #[test]
    fn growth_beyond_each_bound_fails() {
        let s: Vec<Sample> = (3..12)
            .map(|i| {
                let late = i >= 9;
                sample(
                    i as f64 * 10.0,
                    if late { 16.6 } else { 15.0 },
                    if late { 36 } else { 30 },
                    if late { 9 } else { 6 },
                )
            })
            .collect();
        assert_eq!(verdicts(&s), [false, false, false]);
    }

    #[test]
    fn one_busy_moment_does_not_fail_the_descriptors() {
        let s: Vec<Sample> = (3..12)
            .map(|i| sample(i as f64 * 10.0, 15.0, if i == 10 { 45 } else { 30 }, 6))
            .collect();
        assert_eq!(verdicts(&s), [true, true, true]);
    }

    #[test]
    fn error_messages_read_the_same_whatever_their_numbers() {
        let a = br#"{"error":{"code":503,"message":"crashy failed 5 times in a row (circuit open, next start in 59s)"}}"#;
        let b = br#"{"error":{"code":503,"message":"crashy failed 6 times in a row (circuit open, next start in 7s)"}}"#;
        assert_eq!(error_message(a), error_message(b));
        assert_eq!(
            error_message(a),
            "crashy failed N times in a row (circuit open, next start in Ns)"
        );
        assert_eq!(error_message(b"plain text 404"), "plain text N");
    }

    #[test]
    fn too_few_samples_fail() {
        let s = vec![sample(30.0, 1.0, 1, 1), sample(40.0, 1.0, 1, 1)];
        assert_eq!(verdicts(&s), [false]);
    }

    #[test]
    fn warm_up_is_a_quarter_up_to_two_minutes() {
        assert_eq!(warm_up(Duration::from_secs(120)), Duration::from_secs(30));
        assert_eq!(warm_up(Duration::from_secs(1800)), Duration::from_secs(120));
    }

    #[test]
    fn reloads_keep_their_own_pace_between_samples() {
        let s = Duration::from_secs;
        // every 5 s, sampled every 10 s: two before each sample, the second with it
        assert_eq!(reloads_due(0, s(10), s(120), s(5)), [s(5), s(10)]);
        assert_eq!(reloads_due(2, s(20), s(120), s(5)), [s(15), s(20)]);
        // every minute: none until the sample at 60 s
        assert!(reloads_due(0, s(50), s(120), s(60)).is_empty());
        assert_eq!(reloads_due(0, s(60), s(120), s(60)), [s(60)]);
        // none at the end of the run
        assert!(reloads_due(1, s(120), s(120), s(60)).is_empty());
    }

    #[test]
    fn reload_changes_only_the_description() {
        let (a, b) = (
            config("/bin/corral", 20000, 0),
            config("/bin/corral", 20000, 1),
        );
        let differ: Vec<_> = a.lines().zip(b.lines()).filter(|(x, y)| x != y).collect();
        assert_eq!(differ.len(), 2, "{differ:?}"); // the header comment and the description
        assert!(differ[1].0.contains("description:"));
    }

    #[test]
    fn tally_counts_crashy_apart() {
        let t = Tally::default();
        t.record(Kind::PoolJson, Ok(()));
        t.record(Kind::Swap, Err("status 502".into()));
        t.record(Kind::Crashy, Err("status 502".into()));
        t.record(Kind::Crashy, Ok(()));
        let totals = t.totals();
        assert_eq!(
            (
                totals.ok,
                totals.failed,
                totals.crashy_ok,
                totals.crashy_failed
            ),
            (1, 1, 1, 1)
        );
        assert!(t.render().contains("1 × status 502"));
    }

    #[test]
    fn counts_content_chunks() {
        let body = b"data: {\"delta\":{\"role\":\"assistant\"}}\n\ndata: {\"delta\":{\"content\":\"tok0 \"}}\n\ndata: {\"delta\":{\"content\":\"tok1 \"}}\n\n";
        assert_eq!(content_chunks(body), 2);
    }
}
