//! Slot-aware replica picking against round-robin, on the same skewed workload.
//!
//! Four replicas of the fake engine with two slots each serve requests whose generation times follow
//! a Pareto distribution (most short, a few very long), arriving open-loop at a fixed rate. The same
//! seeded sequence runs through corral with `balance: slots` (the default) and `balance:
//! round-robin`. A replica's engine queues what exceeds its slots, as llama-server does, so a
//! round-robin pick that lands behind a long generation waits for it; the slot-aware pick waits at
//! corral for the first free slot anywhere.
//!
//! Usage: corral-balance [CORRAL_BINARY] [SECONDS] [RATE_PER_SECOND]

use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_balance::{free_port_run, percentile, Corral, Rng};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const REPLICAS: usize = 4;
const SLOTS: usize = 2;
/// Pareto shape and scale of a generation's length in 10 ms steps: mean 12 steps (120 ms).
const ALPHA: f64 = 1.2;
const X_MIN: f64 = 2.0;
const MAX_STEPS: u64 = 300;

/// The workload: (arrival offset, generation steps) for each request.
fn workload(seconds: f64, rate: f64, seed: u64) -> Vec<(Duration, u64)> {
    let mut rng = Rng(seed);
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += -(1.0 - rng.next_f64()).ln() / rate; // exponential gaps: Poisson arrivals
        if t >= seconds {
            return out;
        }
        let steps = (X_MIN / (1.0 - rng.next_f64()).powf(1.0 / ALPHA)).round() as u64;
        out.push((Duration::from_secs_f64(t), steps.clamp(1, MAX_STEPS)));
    }
}

struct Outcome {
    latencies: Vec<Duration>,
    failed: usize,
    wall: Duration,
}

async fn run_mode(corral: &str, mode: &str, work: &[(Duration, u64)]) -> Outcome {
    let dir = std::env::temp_dir().join(format!("corral-balance-{}-{mode}", std::process::id()));
    let base_port = free_port_run(REPLICAS as u16, mode.len() as u16);
    let config = format!(
        "startPort: {base_port}\nmodels:\n  chat:\n    cmd: {corral} fake-engine --port ${{PORT}} -np {SLOTS} --threads 1\n    proxy: http://127.0.0.1:${{PORT}}\n    replicas: {REPLICAS}\n    startReplicas: all\n    balance: {mode}\n    queueDepth: 100000\n    queueTimeout: 600\n    concurrencyLimit: 100000\n    slotsPollInterval: 0\n"
    );
    let corral = Corral::start(corral, &dir, &config).await;
    let url = corral.url.clone();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let post = |steps: u64| {
        let body = serde_json::json!({"model": "chat", "messages": [{"role": "user", "content": "x"}], "fakellm": {"chunks": 1, "delay_ms": steps * 10}});
        hyper::Request::post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    // warm every replica up before measuring
    let warm: Vec<_> = (0..REPLICAS * SLOTS)
        .map(|_| client.request(post(20)))
        .collect();
    for w in warm {
        let _ = w.await.map(|r| r.into_body().collect());
    }
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(work.len());
    for &(at, steps) in work {
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + at)).await;
        let req = client.request(post(steps));
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            match req.await {
                Ok(resp) if resp.status().is_success() => {
                    let _ = resp.into_body().collect().await;
                    Some(t0.elapsed())
                }
                _ => None,
            }
        }));
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Some(l) => latencies.push(l),
            None => failed += 1,
        }
    }
    let wall = started.elapsed();
    corral.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    latencies.sort();
    Outcome {
        latencies,
        failed,
        wall,
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let ms: Vec<f64> = sorted.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    percentile(&ms, p)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let corral = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/corral".into());
    let seconds: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20.0);
    let rate: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(45.0);
    let work = workload(seconds, rate, 42);
    let mean_ms = work.iter().map(|(_, s)| *s as f64 * 10.0).sum::<f64>() / work.len() as f64;
    let capacity = (REPLICAS * SLOTS) as f64 / (mean_ms / 1000.0);
    println!(
        "{} requests over {seconds} s at {rate}/s; generation mean {mean_ms:.0} ms (Pareto α={ALPHA}); {REPLICAS} replicas × {SLOTS} slots ≈ {capacity:.0} req/s capacity\n",
        work.len()
    );
    println!("| pick | completed | failed | goodput (req/s) | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for mode in ["slots", "round-robin"] {
        let o = run_mode(&corral, mode, &work).await;
        println!(
            "| {mode} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
            o.latencies.len(),
            o.failed,
            o.latencies.len() as f64 / o.wall.as_secs_f64(),
            pct(&o.latencies, 0.5),
            pct(&o.latencies, 0.9),
            pct(&o.latencies, 0.99),
            pct(&o.latencies, 1.0)
        );
    }
}
