//! Prefix-aware balancing against the slot-aware pick and round-robin, on a real llama-server pool.
//!
//! Two llama-server replicas with two slots each serve concurrent multi-turn conversations. Each
//! conversation has a long system prompt of its own; its turns arrive at random (exponential think
//! times), each turn sending the whole conversation so far, as chat clients do. llama-server keeps a
//! slot's prompt in its KV cache (and, in recent builds, recent prompts in host memory), so a turn
//! that lands where the turn before it ran evaluates only the new tokens; elsewhere it evaluates
//! everything again. The same seeded conversations run under each `balance` mode. Reported per mode:
//! time to first token (the first streamed event; llama-server sends it after the prompt is
//! evaluated), and the prompt tokens llama-server evaluated against those it took from its cache
//! (`timings.prompt_n` and `timings.cache_n` in the answer).
//!
//! Usage: corral-prefix --corral BIN --llama-server BIN --model GGUF [--conversations N]
//! [--turns N] [--system-bytes N] [--think-ms N] [--max-tokens N] [--seed N]
//! [--modes prefix,slots,round-robin] [--engine-args "..."]
//!
//! A mode is a `balance` value, or `prefix:MS` for `balance: prefix` with `prefixWait: MS`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_balance::{free_port_run, percentile, Corral, Rng};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

const REPLICAS: usize = 2;
const SLOTS: usize = 2;

struct Options {
    corral: String,
    llama_server: String,
    model: String,
    conversations: usize,
    turns: usize,
    system_bytes: usize,
    think_ms: f64,
    max_tokens: u32,
    seed: u64,
    modes: Vec<String>,
    engine_args: String,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            corral: "target/release/corral".into(),
            llama_server: String::new(),
            model: String::new(),
            conversations: 8,
            turns: 5,
            system_bytes: 1500,
            think_ms: 1500.0,
            max_tokens: 8,
            seed: 42,
            modes: vec!["prefix".into(), "slots".into(), "round-robin".into()],
            engine_args: String::new(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
            match flag.as_str() {
                "--corral" => o.corral = value,
                "--llama-server" => o.llama_server = value,
                "--model" => o.model = value,
                "--conversations" => o.conversations = number(&value)? as usize,
                "--turns" => o.turns = number(&value)? as usize,
                "--system-bytes" => o.system_bytes = number(&value)? as usize,
                "--think-ms" => o.think_ms = number(&value)? as f64,
                "--max-tokens" => o.max_tokens = number(&value)? as u32,
                "--seed" => o.seed = number(&value)?,
                "--modes" => o.modes = value.split(',').map(str::to_string).collect(),
                "--engine-args" => o.engine_args = value,
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if o.llama_server.is_empty() || o.model.is_empty() {
            return Err("--llama-server and --model are required".into());
        }
        Ok(o)
    }
}

/// One turn: what the user says, what the assistant is recorded to have answered (the next turn
/// sends it back), and the think time before the next turn.
struct Turn {
    user: String,
    reply: String,
    think: Duration,
}

struct Conversation {
    start: Duration,
    system: String,
    turns: Vec<Turn>,
}

/// Seeded text of about `bytes` bytes: made-up lowercase words. The models the bench makes have a
/// character-level vocabulary, so a byte is about a token.
fn text(rng: &mut Rng, bytes: usize) -> String {
    const LETTERS: &[u8] = b"etaoinshrdlucmfwypvbgkqjxz";
    let mut s = String::with_capacity(bytes + 8);
    while s.len() < bytes {
        let len = 2 + rng.next_u64() % 7;
        for _ in 0..len {
            // skewed towards common letters, like prose
            let i = (rng.next_f64() * rng.next_f64() * LETTERS.len() as f64) as usize;
            s.push(LETTERS[i] as char);
        }
        s.push(' ');
    }
    s
}

fn workload(o: &Options) -> Vec<Conversation> {
    let mut rng = Rng(o.seed);
    (0..o.conversations)
        .map(|_| Conversation {
            start: Duration::from_secs_f64(rng.next_f64() * o.think_ms / 1000.0),
            system: text(&mut rng, o.system_bytes),
            turns: (0..o.turns)
                .map(|_| {
                    let (user_bytes, reply_bytes) =
                        (80 + rng.next_u64() % 160, 40 + rng.next_u64() % 120);
                    Turn {
                        user: text(&mut rng, user_bytes as usize),
                        reply: text(&mut rng, reply_bytes as usize),
                        think: Duration::from_secs_f64(rng.exponential(o.think_ms) / 1000.0),
                    }
                })
                .collect(),
        })
        .collect()
}

/// The chat body of turn `t`: the system prompt, every earlier turn with its recorded reply, and
/// turn `t`'s question.
fn body(c: &Conversation, t: usize, max_tokens: u32) -> String {
    let mut messages = vec![json!({"role": "system", "content": c.system})];
    for turn in &c.turns[..t] {
        messages.push(json!({"role": "user", "content": turn.user}));
        messages.push(json!({"role": "assistant", "content": turn.reply}));
    }
    messages.push(json!({"role": "user", "content": c.turns[t].user}));
    json!({"model": "chat", "stream": true, "max_tokens": max_tokens, "temperature": 0,
           "messages": messages})
    .to_string()
}

/// What one request measured.
#[derive(Default, Clone)]
struct Sample {
    ok: bool,
    ttft_ms: f64,
    total_ms: f64,
    prompt_n: u64,
    cache_n: u64,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A failed request, said on stderr so the table's count can be explained.
fn failed(why: String) -> Sample {
    eprintln!("corral-prefix: a request failed: {why}");
    Sample::default()
}

async fn send(client: &HttpClient, url: &str, body: String) -> Sample {
    let req = hyper::Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let t0 = Instant::now();
    let resp = match client.request(req).await {
        Ok(resp) => resp,
        Err(e) => return failed(format!("{e}")),
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        let body = String::from_utf8_lossy(body.as_deref().unwrap_or_default()).into_owned();
        return failed(format!("{status}: {body}"));
    }
    let mut body = resp.into_body();
    let mut text = Vec::new();
    let mut ttft = None;
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            if ttft.is_none() && data.windows(5).any(|w| w == b"data:") {
                ttft = Some(t0.elapsed());
            }
            text.extend_from_slice(&data);
        }
    }
    let total = t0.elapsed();
    let timings = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get("timings").cloned())
        .next_back();
    let Some(timings) = timings else {
        let text = String::from_utf8_lossy(&text);
        let tail = &text[text.len().saturating_sub(400)..];
        return failed(format!("no timings in the answer; it ended: {tail}"));
    };
    let count = |k: &str| timings.get(k).and_then(Value::as_u64).unwrap_or(0);
    Sample {
        ok: true,
        ttft_ms: ttft.unwrap_or(total).as_secs_f64() * 1000.0,
        total_ms: total.as_secs_f64() * 1000.0,
        prompt_n: count("prompt_n"),
        cache_n: count("cache_n"),
    }
}

/// A mode is a `balance` value, optionally with a `prefixWait` in milliseconds (`prefix:500`).
fn config(o: &Options, mode: &str, base_port: u16) -> String {
    let (balance, wait) = mode.split_once(':').unwrap_or((mode, "0"));
    let ctx_per_slot = 2 * (o.system_bytes + o.turns * 460) + 1024;
    format!(
        "startPort: {base_port}\nhealthCheckTimeout: 300\nmodels:\n  chat:\n    cmd: {} --model {} --host 127.0.0.1 --port ${{PORT}} -np {SLOTS} -c {} --threads 1 --threads-batch 1 {}\n    proxy: http://127.0.0.1:${{PORT}}\n    replicas: {REPLICAS}\n    startReplicas: all\n    balance: {balance}\n    prefixWait: {wait}\n    queueDepth: 10000\n    queueTimeout: 600\n    concurrencyLimit: 10000\n",
        o.llama_server, o.model, ctx_per_slot * SLOTS, o.engine_args
    )
}

/// Runs every conversation through corral under `mode`; returns the samples and corral's own
/// count of prefix hits.
async fn run_mode(o: &Options, mode: &str, work: &Arc<Vec<Conversation>>) -> (Vec<Sample>, f64) {
    let dir = std::env::temp_dir().join(format!("corral-prefix-{}-{mode}", std::process::id()));
    let corral = Corral::start(
        &o.corral,
        &dir,
        &config(o, mode, free_port_run(REPLICAS as u16, 7)),
    )
    .await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // Load both replicas before measuring (`startReplicas: all` starts them on the first request).
    let warm = json!({"model": "chat", "max_tokens": 1, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..REPLICAS {
        let _ = send(&client, &corral.url, warm.to_string()).await;
    }
    // the second warm-up repeats the first one's prompt: its hit is not the workload's
    let warm_hits = prefix_hits(&client, &corral.url).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..work.len())
        .map(|i| {
            let (work, client, url, max_tokens) = (
                work.clone(),
                client.clone(),
                corral.url.clone(),
                o.max_tokens,
            );
            tokio::spawn(async move {
                let c = &work[i];
                tokio::time::sleep_until((started + c.start).into()).await;
                let mut samples = Vec::new();
                for t in 0..c.turns.len() {
                    samples.push(send(&client, &url, body(c, t, max_tokens)).await);
                    tokio::time::sleep(c.turns[t].think).await;
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap());
    }
    let hits = prefix_hits(&client, &corral.url).await - warm_hits;
    corral.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    (samples, hits)
}

/// `corral_prefix_hits_total` for the pool, from corral's metrics.
async fn prefix_hits(client: &HttpClient, url: &str) -> f64 {
    let req = hyper::Request::get(format!("{url}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let Ok(resp) = client.request(req).await else {
        return f64::NAN;
    };
    let body = resp.into_body().collect().await.map(|b| b.to_bytes());
    let text = String::from_utf8_lossy(body.as_deref().unwrap_or_default()).into_owned();
    text.lines()
        .filter(|l| l.starts_with("corral_prefix_hits_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, hits| sum + hits)
}

fn row(mode: &str, samples: &[Sample], hits: f64) -> String {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let sorted = |f: fn(&Sample) -> f64| {
        let mut v: Vec<f64> = ok.iter().map(|s| f(s)).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (ttft, total) = (sorted(|s| s.ttft_ms), sorted(|s| s.total_ms));
    let evaluated: u64 = ok.iter().map(|s| s.prompt_n).sum();
    let cached: u64 = ok.iter().map(|s| s.cache_n).sum();
    format!(
        "| {mode} | {} | {} | {:.0} | {:.0} | {:.0} | {evaluated} | {cached} | {:.0} % | {hits} |",
        ok.len(),
        samples.len() - ok.len(),
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        percentile(&total, 0.5),
        100.0 * evaluated as f64 / (evaluated + cached).max(1) as f64,
    )
}

#[tokio::main]
async fn main() {
    let o = Options::parse().unwrap_or_else(|e| {
        eprintln!("corral-prefix: {e}");
        std::process::exit(2)
    });
    let work = Arc::new(workload(&o));
    println!(
        "{} conversations × {} turns, system prompts of {} bytes, think time mean {} ms, {} tokens per answer; {REPLICAS} llama-server replicas × {SLOTS} slots\n",
        o.conversations, o.turns, o.system_bytes, o.think_ms, o.max_tokens
    );
    println!("| balance | answered | failed | TTFT p50 (ms) | TTFT p99 (ms) | total p50 (ms) | prompt tokens evaluated | from cache | evaluated share | corral prefix hits |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for mode in &o.modes {
        let (samples, hits) = run_mode(&o, mode, &work).await;
        println!("{}", row(mode, &samples, hits));
    }
}
