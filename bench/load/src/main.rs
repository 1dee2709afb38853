//! corral-load: the load generator and benchmark suite of corral. Loopback only; every run is
//! bounded in requests or time.
//!
//!   corral-load suite [--corral PATH] [--nginx PATH | --no-nginx] [--out DIR] [--criterion DIR] [--quick] [--keep]
//!   corral-load http URL [-c N] [-n N | -d SECS] [--body JSON]
//!   corral-load sse URL [-c N] [--chunks N] [--interval-ms MS] [--model M]
//!   corral-load soak [--corral PATH] [--minutes N] [--out DIR] [--keep]
//!   corral-load floor --route LISTEN=UPSTREAM...
//!
//! `http` and `sse` print JSON; `suite` runs every scenario and prints the markdown table.

mod floor;
mod http;
mod procfs;
mod soak;
mod sse;
mod stats;
mod suite;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

const USAGE: &str = "usage:
  corral-load suite [--corral PATH] [--nginx PATH | --no-nginx] [--out DIR] [--criterion DIR] [--quick] [--keep]
                    [--corral-env NAME=VALUE]... [--corral-rev TEXT]
  corral-load http URL [-c N] [-n N | -d SECS] [--body JSON]
  corral-load sse URL [-c N] [--chunks N] [--interval-ms MS] [--model M]
  corral-load soak [--corral PATH] [--minutes N] [--out DIR] [--keep]
                   [--sample-secs S] [--reload-secs S]
  corral-load floor --route LISTEN=UPSTREAM...

suite    runs all scenarios against the fake engine directly, through corral, through nginx and
         through the bare hyper proxy (`floor`), and prints a markdown table (also written to DIR/latest.md, default bench/results)
http     closed-loop load on one URL over N keep-alive connections (POST when --body is given)
sse      N concurrent SSE streams; per-chunk lateness and coalescing
soak     N minutes (default 30) of mixed traffic through one corral, sampling its RSS, fds and
         threads every 10 s (also written to DIR/soak-latest.csv); exits 1 when the verdict fails
floor    the least a hyper and tokio proxy does (no routing, metrics or limits), for the suite

--client-threads N (any command) runs the load generator on N threads (default 1).";

struct Args {
    rest: Vec<String>,
}

impl Args {
    fn flag(&mut self, names: &[&str]) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| !names.contains(&a.as_str()));
        before != self.rest.len()
    }

    fn value(&mut self, names: &[&str]) -> Result<Option<String>, String> {
        let Some(i) = self.rest.iter().position(|a| names.contains(&a.as_str())) else {
            return Ok(None);
        };
        if i + 1 >= self.rest.len() {
            return Err(format!("{} needs a value", self.rest[i]));
        }
        let v = self.rest.remove(i + 1);
        self.rest.remove(i);
        Ok(Some(v))
    }

    fn num<T: std::str::FromStr>(&mut self, names: &[&str], default: T) -> Result<T, String> {
        match self.value(names)? {
            Some(v) => v
                .parse()
                .map_err(|_| format!("{}: not a number: {v}", names[0])),
            None => Ok(default),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.rest.first() {
            Some(a) => Err(format!("unexpected argument {a:?}")),
            None => Ok(()),
        }
    }
}

/// `http://host:port/path` into an address and a path.
fn parse_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr}: corral-load only sends to loopback addresses"
        ));
    }
    Ok((addr, path))
}

fn main() -> ExitCode {
    let mut args = Args {
        rest: std::env::args().skip(1).collect(),
    };
    if args.rest.is_empty() || args.flag(&["-h", "--help"]) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let threads: usize = match args.num(&["--client-threads"], 1) {
        Ok(t) => t,
        Err(e) => return fail(&e),
    };
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("a tokio runtime");
    let cmd = args.rest.remove(0);
    let r = match cmd.as_str() {
        "suite" => rt.block_on(suite_cmd(args)),
        "http" => rt.block_on(http_cmd(args)),
        "sse" => rt.block_on(sse_cmd(args)),
        "soak" => rt.block_on(soak_cmd(args)),
        "floor" => floor_cmd(args),
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// `floor --route LISTEN=UPSTREAM...`: the bare hyper proxy the suite measures beside corral.
fn floor_cmd(mut a: Args) -> Result<(), String> {
    let mut routes = Vec::new();
    while let Some(route) = a.value(&["--route"])? {
        let (listen, upstream) = route
            .split_once('=')
            .ok_or_else(|| format!("--route {route}: expected LISTEN=UPSTREAM"))?;
        let addr = |s: &str| {
            s.parse::<std::net::SocketAddr>()
                .map_err(|e| format!("--route {route}: {s}: {e}"))
        };
        routes.push((addr(listen)?, addr(upstream)?));
    }
    if routes.is_empty() {
        return Err("floor needs at least one --route LISTEN=UPSTREAM".into());
    }
    floor::run(routes)
}

fn fail(e: &str) -> ExitCode {
    eprintln!("corral-load: {e}");
    ExitCode::FAILURE
}

async fn suite_cmd(mut a: Args) -> Result<(), String> {
    let here = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or_default();
    let corral = a
        .value(&["--corral"])?
        .map(PathBuf::from)
        .unwrap_or_else(|| here.join("corral"));
    let no_nginx = a.flag(&["--no-nginx"]);
    let nginx = match a.value(&["--nginx"])? {
        Some(p) => Some(PathBuf::from(p)),
        None if no_nginx => None,
        None => Some(PathBuf::from("nginx")),
    };
    let out = a
        .value(&["--out"])?
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("bench/results"));
    let criterion = a.value(&["--criterion"])?.map(PathBuf::from);
    let quick = a.flag(&["--quick"]);
    let keep = a.flag(&["--keep"]);
    let corral_rev = a.value(&["--corral-rev"])?;
    let mut corral_env = Vec::new();
    while let Some(kv) = a.value(&["--corral-env"])? {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--corral-env {kv}: expected NAME=VALUE"))?;
        corral_env.push((k.to_string(), v.to_string()));
    }
    a.finish()?;
    let opts = suite::Opts {
        corral,
        nginx,
        out,
        criterion,
        scale: if quick { 0.3 } else { 1.0 },
        keep,
        corral_env,
        corral_rev,
    };
    suite::run(opts).await.map_err(|e| e.to_string())
}

async fn soak_cmd(mut a: Args) -> Result<(), String> {
    let corral = a
        .value(&["--corral"])?
        .map(PathBuf::from)
        .unwrap_or_else(|| sibling("corral"));
    let minutes: f64 = a.num(&["--minutes"], 30.0)?;
    let out = a
        .value(&["--out"])?
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("bench/results"));
    let sample_secs: u64 = a.num(&["--sample-secs"], 10)?;
    let reload_secs: u64 = a.num(&["--reload-secs"], 60)?;
    let keep = a.flag(&["--keep"]);
    a.finish()?;
    if !(minutes > 0.0 && minutes <= 24.0 * 60.0) || sample_secs == 0 || reload_secs == 0 {
        return Err("soak: --minutes in (0, 1440], --sample-secs and --reload-secs above 0".into());
    }
    let opts = soak::Opts {
        corral,
        duration: Duration::from_secs_f64(minutes * 60.0),
        out,
        sample_every: Duration::from_secs(sample_secs),
        reload_every: Duration::from_secs(reload_secs),
        keep,
    };
    match soak::run(opts).await.map_err(|e| e.to_string())? {
        true => Ok(()),
        false => Err("soak: the verdict failed".into()),
    }
}

/// A binary next to this one (the release build puts corral and corral-load side by side).
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

async fn http_cmd(mut a: Args) -> Result<(), String> {
    let concurrency = a.num(&["-c", "--concurrency"], 1usize)?;
    let requests: Option<u64> = a
        .value(&["-n", "--requests"])?
        .map(|v| v.parse().map_err(|_| "bad -n"))
        .transpose()?;
    let secs: f64 = a.num(&["-d", "--duration"], 5.0)?;
    let body = a.value(&["--body"])?;
    if a.rest.is_empty() {
        return Err("http: a URL is needed".into());
    }
    let (addr, path) = parse_url(&a.rest.remove(0))?;
    a.finish()?;
    let load = http::Load {
        addr,
        method: if body.is_some() {
            hyper::Method::POST
        } else {
            hyper::Method::GET
        },
        path,
        body: body.map(Bytes::from).unwrap_or_default(),
        content_type: "application/json".into(),
        concurrency,
        limit: match requests {
            Some(n) => http::Limit::Requests(n),
            None => http::Limit::Duration(Duration::from_secs_f64(secs.min(600.0))),
        },
    };
    let out = http::run(&load).await.map_err(|e| e.to_string())?;
    let v = json!({"ok": out.ok, "errors": out.errors, "first_error": out.first_error, "seconds": out.elapsed.as_secs_f64(),
                   "rps": out.rps(), "latency_us": stats::summarize(&out.latency_us).to_json()});
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    Ok(())
}

async fn sse_cmd(mut a: Args) -> Result<(), String> {
    let concurrency = a.num(&["-c", "--concurrency"], 4usize)?;
    let chunks = a.num(&["--chunks"], 200u64)?;
    let interval = a.num(&["--interval-ms"], 5u64)?;
    let model = a.value(&["--model"])?.unwrap_or_else(|| "m".into());
    if a.rest.is_empty() {
        return Err("sse: a URL is needed".into());
    }
    let (addr, path) = parse_url(&a.rest.remove(0))?;
    a.finish()?;
    let body =
        json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "Count."}],
                      "fakellm": {"chunks": chunks, "interval_ms": interval}})
        .to_string();
    let req = std::sync::Arc::new(sse::post(addr, &path, &body));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let req = req.clone();
        set.spawn(async move { sse::run_stream(addr, &req, Duration::from_secs(600)).await });
    }
    let (mut late, mut coalesced, mut events, mut reads) = (Vec::new(), 0, 0, 0);
    while let Some(r) = set.join_next().await {
        let s = r.map_err(|e| e.to_string())??;
        events += s.events.len();
        reads += s.reads;
        let mut last = None;
        for e in &s.events {
            let Some(k) = e.index else { continue };
            late.push((e.at - s.sent).as_secs_f64() * 1e6 - (k * interval as u32) as f64 * 1000.0);
            if last == Some(e.read) {
                coalesced += 1;
            }
            last = Some(e.read);
        }
    }
    let v = json!({"streams": concurrency, "events": events, "reads": reads, "coalesced_chunks": coalesced,
                   "chunk_lateness_us": stats::summarize(&late).to_json()});
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    Ok(())
}
