//! The whole benchmark in one run: corral, nginx and the fake engine side by side on loopback.
//!
//! One corral serves three fake-engine models (`m`: fast answers, `hold`: long streams with an
//! events file, `slow`: a 300 ms load). nginx proxies to the very same engine processes, and the
//! "direct" target is the engine itself, so every figure is a ratio or difference measured in the
//! same minute on the same engine. Targets are run in rotating order, in rounds, to spread drift.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::http::{self, Limit, Load};
use crate::procfs::{self, unix_ms};
use crate::sse;
use crate::stats::{summarize, Summary};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Opts {
    pub corral: PathBuf,
    pub nginx: Option<PathBuf>,
    pub out: PathBuf,
    pub criterion: Option<PathBuf>,
    /// Multiplies request counts and durations (1.0: the default run; --quick: 0.3).
    pub scale: f64,
    pub keep: bool,
    /// Extra environment for corral (experiments such as TOKIO_WORKER_THREADS=1).
    pub corral_env: Vec<(String, String)>,
    /// What corral was built from (bench/run.sh records it before building); else asked of git.
    pub corral_rev: Option<String>,
}

const CHAT: &str = "/v1/chat/completions";
const SSE_CHUNKS: u32 = 200;
const SSE_INTERVAL_MS: u32 = 5;
const HOLD_STREAMS: usize = 1000;
/// Scenario 5 loads `READY_REPS` models, `slow-0` .. `slow-9`, taking LOADING_MS + i * LOADING_STEP_MS
/// each: corral polls readiness on a fixed schedule, so a single load time would always land on the
/// same phase of it; the steps spread the loads over a 20 ms span.
const LOADING_MS: f64 = 300.0;
const LOADING_STEP_MS: f64 = 2.0;
const READY_REPS: usize = 10;

// ---------------------------------------------------------------------------------------------
// processes

pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("bench: {} did not stop on SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `n` consecutive free ports (corral hands out `${PORT}` from `startPort` upwards), below the
/// kernel's ephemeral range (32768 and up), where outgoing connections would take them.
pub(crate) fn free_port_run(n: u16) -> u16 {
    let mut base = 20000 + (std::process::id() as u16 % 12000);
    loop {
        let held: Vec<_> = (0..n)
            .map_while(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
        base = base + n + 7;
        if base + n >= 32000 {
            base = 20000;
        }
    }
}

pub(crate) fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(crate) async fn wait_until_up(
    a: SocketAddr,
    path: &str,
    within: Duration,
) -> Result<(), BoxError> {
    let until = Instant::now() + within;
    let load = get_load(a, path);
    loop {
        if let Ok(mut s) = http::connect(a).await {
            if let Ok((200, _, _)) = http::once(&mut s, &load).await {
                return Ok(());
            }
        }
        if Instant::now() > until {
            return Err(format!("{a}{path} did not answer 200 within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn get_load(a: SocketAddr, path: &str) -> Load {
    Load {
        addr: a,
        method: hyper::Method::GET,
        path: path.into(),
        body: Bytes::new(),
        content_type: String::new(),
        concurrency: 1,
        limit: Limit::Requests(1),
    }
}

fn chat_load(a: SocketAddr, body: &str, concurrency: usize, limit: Limit) -> Load {
    Load {
        addr: a,
        method: hyper::Method::POST,
        path: CHAT.into(),
        body: Bytes::from(body.to_string()),
        content_type: "application/json".into(),
        concurrency,
        limit,
    }
}

/// A small non-streaming chat request (the engine answers ~700 bytes of JSON).
fn small_body(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
           "fakellm": {"chunks": 1}})
    .to_string()
}

/// A streaming chat request of `chunks` SSE chunks `interval_ms` apart.
pub(crate) fn stream_body(model: &str, chunks: u64, interval_ms: u64) -> String {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "Count."}],
           "fakellm": {"chunks": chunks, "interval_ms": interval_ms}})
    .to_string()
}

/// The engine `corral` started for a model: found among corral's children by its `--alias`.
pub(crate) fn engine_of(corral_pid: u32, alias: &str) -> Option<(u32, u16)> {
    for pid in procfs::children(corral_pid) {
        let args = procfs::cmdline(pid);
        let has = |flag: &str, v: &str| args.windows(2).any(|w| w[0] == flag && w[1] == v);
        if has("--alias", alias) {
            let port = args
                .windows(2)
                .find(|w| w[0] == "--port")
                .and_then(|w| w[1].parse().ok())?;
            return Some((pid, port));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// targets

#[derive(Clone, Debug)]
struct Target {
    name: &'static str,
    /// Where scenarios 1-3 send their requests (model `m`) and scenario 4 (model `hold`).
    fast: SocketAddr,
    hold: SocketAddr,
    /// The proxy's processes (empty for direct).
    pids: Vec<u32>,
}

fn rotate<T: Clone>(v: &[T], by: usize) -> Vec<T> {
    let mut r = v.to_vec();
    if !r.is_empty() {
        r.rotate_left(by % v.len());
    }
    r
}

fn scaled(n: f64, scale: f64, min: f64) -> f64 {
    (n * scale).max(min)
}

// ---------------------------------------------------------------------------------------------
// the run

pub async fn run(opts: Opts) -> Result<(), BoxError> {
    let nofile = procfs::raise_nofile();
    if nofile < 4 * HOLD_STREAMS as u64 + 256 {
        eprintln!(
            "bench: warning: open-file limit is {nofile}; 1,000 streams need ~4,300 (ulimit -n)"
        );
    }
    let work = std::env::temp_dir().join(format!("corral-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = run_in(&opts, &work).await;
    if opts.keep || result.is_err() {
        eprintln!("bench: logs and configs kept in {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

async fn run_in(opts: &Opts, work: &Path) -> Result<(), BoxError> {
    let corral_exe = std::fs::canonicalize(&opts.corral)
        .map_err(|e| format!("{}: {e}", opts.corral.display()))?;
    let machine_at_start = machine(opts.corral_rev.clone());
    let (busy0, own0, wall0) = (
        procfs::machine_busy_ticks(),
        procfs::own_ticks_with_children(),
        Instant::now(),
    );
    let load1: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0);
    let ev_hold = work.join("events-hold.jsonl");
    let ev_slow = work.join("events-slow.jsonl");
    let start_port = free_port_run(2 + READY_REPS as u16);
    let corral_port = free_port();
    let exe = corral_exe.display().to_string();
    let config = format!(
        "# generated by corral-load suite
healthCheckTimeout: 30
startPort: {start_port}
logLevel: warn
models:
  m:
    cmd: {exe} fake-engine --port ${{PORT}} --threads 1 -np 256 --alias bench-m
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
    concurrencyLimit: 4096
  hold:
    cmd: {exe} fake-engine --port ${{PORT}} --threads 1 -np 1200 --alias bench-hold --events-file {ev_hold}
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
    concurrencyLimit: 4096
{slow}groups:
  bench:
    swap: false
    members: [m, hold, {slow_ids}]
",
        ev_hold = ev_hold.display(),
        slow = (0..READY_REPS)
            .map(|i| format!(
                "  slow-{i}:
    cmd: {exe} fake-engine --port ${{PORT}} --threads 1 --alias bench-slow-{i} --loading-ms {load} --events-file {ev}
    proxy: http://127.0.0.1:${{PORT}}
    ttl: 0
",
                load = (LOADING_MS + i as f64 * LOADING_STEP_MS) as u64,
                ev = ev_slow.display()
            ))
            .collect::<String>(),
        slow_ids = (0..READY_REPS).map(|i| format!("slow-{i}")).collect::<Vec<_>>().join(", "),
    );
    let config_path = work.join("corral.yaml");
    std::fs::write(&config_path, &config)?;
    eprintln!("bench: starting corral on 127.0.0.1:{corral_port}");
    let corral = Proc {
        name: "corral",
        child: Command::new(&corral_exe)
            .arg("--config")
            .arg(&config_path)
            .arg("--listen")
            .arg(format!("127.0.0.1:{corral_port}"))
            .env("CORRAL_STATE_DIR", work.join("state"))
            .envs(opts.corral_env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(work.join("corral.log"))?)
            .stderr(std::fs::File::create(work.join("corral.err"))?)
            .spawn()
            .map_err(|e| format!("cannot start {exe}: {e}"))?,
    };
    let corral_addr = addr(corral_port);
    wait_until_up(corral_addr, "/health", Duration::from_secs(10)).await?;
    let corral_rss_start = procfs::rss_kib(corral.pid()).unwrap_or(0);

    // Start both engines through corral (the first request for a model starts it).
    for model in ["m", "hold"] {
        let load = chat_load(corral_addr, &small_body(model), 1, Limit::Requests(1));
        let mut s = http::connect(corral_addr).await?;
        let (status, body, lat) = http::once(&mut s, &load).await?;
        if status != 200 {
            return Err(format!(
                "model {model} through corral: status {status}: {}",
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        eprintln!(
            "bench: model {model} started through corral in {:.0} ms",
            lat.as_secs_f64() * 1e3
        );
    }
    let (engine_pid, engine_port) =
        engine_of(corral.pid(), "bench-m").ok_or("engine for model m not found")?;
    let (hold_pid, hold_port) =
        engine_of(corral.pid(), "bench-hold").ok_or("engine for model hold not found")?;

    // nginx in front of the same engines.
    let nginx_ports = (free_port(), free_port());
    let nginx = match &opts.nginx {
        Some(path) => Some(start_nginx(path, work, nginx_ports, engine_port, hold_port).await?),
        None => None,
    };
    let nginx_pids = nginx
        .as_ref()
        .map(|n| procfs::children(n.pid()))
        .unwrap_or_default();

    let mut targets = vec![
        Target {
            name: "direct",
            fast: addr(engine_port),
            hold: addr(hold_port),
            pids: vec![],
        },
        Target {
            name: "corral",
            fast: corral_addr,
            hold: corral_addr,
            pids: vec![corral.pid()],
        },
    ];
    if nginx.is_some() {
        targets.push(Target {
            name: "nginx",
            fast: addr(nginx_ports.0),
            hold: addr(nginx_ports.1),
            pids: nginx_pids.clone(),
        });
    }
    // the bare hyper proxy in front of the same engines
    let floor_ports = (free_port(), free_port());
    let floor = start_floor(work, floor_ports, engine_port, hold_port, Client::Hyper).await?;
    targets.push(Target {
        name: "hyper",
        fast: addr(floor_ports.0),
        hold: addr(floor_ports.1),
        pids: vec![floor.pid()],
    });
    // The floor again with the least client there can be: how much a client written for the
    // engine link could save at most. It reads whole answers, so it runs scenarios 1 and 2 only.
    let least_ports = (free_port(), free_port());
    let least = start_floor(work, least_ports, engine_port, hold_port, Client::Least).await?;
    let mut small_targets = targets.clone();
    small_targets.push(Target {
        name: LEAST,
        fast: addr(least_ports.0),
        hold: addr(least_ports.1),
        pids: vec![least.pid()],
    });

    // Warm-up: fill the keep-alive pools and the allocators.
    for t in &small_targets {
        let out = http::run(&chat_load(
            t.fast,
            &small_body("m"),
            64,
            Limit::Requests(3000),
        ))
        .await?;
        if out.errors > 0 {
            return Err(format!(
                "warm-up through {}: {} errors, first: {:?}",
                t.name, out.errors, out.first_error
            )
            .into());
        }
        if t.name != LEAST {
            let req = sse::post(t.fast, CHAT, &stream_body("m", 20, 1));
            sse::run_stream(t.fast, &req, Duration::from_secs(10)).await?;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let corral_rss_warm = procfs::rss_kib(corral.pid()).unwrap_or(0);

    let mut results = json!({
        "machine": machine_at_start,
        "nginx_version": opts.nginx.as_ref().map(|p| nginx_version(p)),
        "corral_rss_kib": {"start": corral_rss_start, "after_warmup": corral_rss_warm},
    });
    let mut report = Report {
        machine: machine_at_start,
        load1,
        nginx_version: opts.nginx.as_ref().map(|p| nginx_version(p)),
        names: targets.iter().map(|t| t.name).collect(),
        corral_rss_warm_kib: corral_rss_warm as f64,
        corral_env: opts
            .corral_env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        ..Default::default()
    };

    eprintln!("bench: 1/5 small requests at concurrency 1");
    results["c1"] = scenario_c1(&small_targets, opts.scale, &mut report).await?;
    eprintln!("bench: 2/5 small requests at concurrency 64");
    results["c64"] = scenario_c64(&small_targets, opts.scale, engine_pid, &mut report).await?;
    eprintln!("bench: 3/5 SSE streams of {SSE_CHUNKS} chunks every {SSE_INTERVAL_MS} ms");
    results["sse"] = scenario_sse(&targets, opts.scale, &ev_hold, &mut report).await?;
    eprintln!("bench: 4/5 {HOLD_STREAMS} open streams");
    results["hold"] = scenario_hold(&targets, hold_port, hold_pid, &ev_hold, &mut report).await?;
    eprintln!(
        "bench: 5/5 readiness after {READY_REPS} model loads of {LOADING_MS}-{} ms",
        LOADING_MS + (READY_REPS - 1) as f64 * LOADING_STEP_MS
    );
    results["readiness"] = scenario_readiness(corral_addr, &ev_slow, &mut report).await?;
    if let Some(dir) = &opts.criterion {
        report.hot_path = read_criterion(dir);
        results["hot_path"] = json!(report
            .hot_path
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<serde_json::Map<_, _>>());
    }
    drop(nginx);
    drop(floor);
    drop(least);
    drop(corral);
    // How much of the machine other processes used while this ran.
    let busy = procfs::machine_busy_ticks().saturating_sub(busy0) as f64;
    let own = procfs::own_ticks_with_children().saturating_sub(own0) as f64;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let capacity = wall0.elapsed().as_secs_f64() * procfs::clk_tck() as f64 * cores;
    report.foreign = ((busy - own) / capacity).max(0.0);
    results["other_processes_cpu_share"] = json!(report.foreign);

    let table = report.render();
    println!("{table}");
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(opts.out.join("latest.md"), &table)?;
    std::fs::write(
        opts.out.join("latest.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    eprintln!(
        "bench: wrote {}/latest.md and latest.json",
        opts.out.display()
    );
    Ok(())
}

async fn start_nginx(
    exe: &Path,
    work: &Path,
    ports: (u16, u16),
    engine: u16,
    hold: u16,
) -> Result<Proc, BoxError> {
    let dir = work.join("nginx");
    for d in ["", "tmp", "logs"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let conf = include_str!("../../nginx.conf.template")
        .replace("@DIR@", &dir.display().to_string())
        .replace("@PORT_FAST@", &ports.0.to_string())
        .replace("@PORT_HOLD@", &ports.1.to_string())
        .replace("@ENGINE_FAST@", &engine.to_string())
        .replace("@ENGINE_HOLD@", &hold.to_string());
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    eprintln!(
        "bench: starting nginx on 127.0.0.1:{} and :{}",
        ports.0, ports.1
    );
    let proc = Proc {
        name: "nginx",
        child: Command::new(exe)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.join("logs/error.log"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("logs/stdout"))?)
            .stderr(std::fs::File::create(dir.join("logs/stderr"))?)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?,
    };
    wait_until_up(addr(ports.0), "/health", Duration::from_secs(10))
        .await
        .map_err(|e| {
            let log = std::fs::read_to_string(dir.join("logs/stderr")).unwrap_or_default();
            format!("{e}; nginx said: {log}")
        })?;
    // Workers are forked after the master binds; give them a moment to all exist.
    for _ in 0..50 {
        if !procfs::children(proc.pid()).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(proc)
}

/// The name of the floor with the least client, in the results and the notes under the table.
const LEAST: &str = "least client";

/// The client a floor talks to the engines with.
#[derive(Clone, Copy, PartialEq)]
enum Client {
    Hyper,
    /// `FLOOR_CLIENT=minimal`: see `floor.rs`.
    Least,
}

/// `corral-load floor` (this program) proxying `ports` to the engines.
async fn start_floor(
    work: &Path,
    ports: (u16, u16),
    engine: u16,
    hold: u16,
    client: Client,
) -> Result<Proc, BoxError> {
    let exe = std::env::current_exe()?;
    let route = |from: u16, to: u16| format!("127.0.0.1:{from}=127.0.0.1:{to}");
    let (name, client, log) = match client {
        Client::Hyper => ("hyper", "hyper", "floor.err"),
        Client::Least => (LEAST, "minimal", "floor-least.err"),
    };
    let proc = Proc {
        name,
        child: Command::new(&exe)
            .args(["floor", "--route", &route(ports.0, engine)])
            .args(["--route", &route(ports.1, hold)])
            .env("FLOOR_CLIENT", client)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join(log))?)
            .spawn()
            .map_err(|e| format!("cannot start {} floor: {e}", exe.display()))?,
    };
    wait_until_up(addr(ports.0), "/health", Duration::from_secs(10)).await?;
    Ok(proc)
}

fn nginx_version(exe: &Path) -> String {
    Command::new(exe)
        .arg("-v")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .trim_start_matches("nginx version: ")
                .to_string()
        })
        .unwrap_or_default()
}

/// The commit corral was built from, when run inside its git checkout.
fn corral_rev() -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "crates",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{rev} with local changes")
    } else {
        rev
    })
}

pub fn machine(rev: Option<String>) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let rev = rev
        .or_else(corral_rev)
        .map(|r| format!("corral {r}; "))
        .unwrap_or_default();
    format!(
        "{rev}{cores} cores, {model}, Linux {}; load average at start {}",
        kernel.trim(),
        load.join(" ")
    )
}

// ---------------------------------------------------------------------------------------------
// scenario 1: concurrency 1

async fn scenario_c1(
    targets: &[Target],
    scale: f64,
    report: &mut Report,
) -> Result<Value, BoxError> {
    let rounds = 5;
    let per_round = scaled(2000.0, scale, 300.0) as u64;
    let mut lat: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut errors: BTreeMap<&str, u64> = BTreeMap::new();
    for round in 0..rounds {
        for t in rotate(targets, round) {
            let out = http::run(&chat_load(
                t.fast,
                &small_body("m"),
                1,
                Limit::Requests(per_round),
            ))
            .await?;
            lat.entry(t.name).or_default().extend(out.latency_us);
            *errors.entry(t.name).or_default() += out.errors;
        }
    }
    let mut v = json!({});
    for t in targets {
        let s = summarize(&lat[t.name]);
        report.c1.insert(t.name, s);
        v[t.name] = json!({"latency_us": s.to_json(), "errors": errors[t.name]});
        report.errors += errors[t.name];
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// scenario 2: concurrency 64

#[derive(Debug, Default, Clone, Copy)]
struct C64 {
    rps: f64,
    proxy_cpu_us_per_req: f64,
    proxy_user_us_per_req: f64,
    proxy_system_us_per_req: f64,
    engine_cpu_us_per_req: f64,
    p50: f64,
    p99: f64,
    cpu_round_min: f64,
    cpu_round_max: f64,
}

async fn scenario_c64(
    targets: &[Target],
    scale: f64,
    engine_pid: u32,
    report: &mut Report,
) -> Result<Value, BoxError> {
    let rounds = 4;
    let secs = scaled(1.25, scale, 0.5);
    // per target: requests, seconds, proxy CPU µs, engine CPU µs, errors, latencies, and the
    // proxy's CPU per request of each round
    type Acc = (u64, f64, procfs::Cpu, f64, u64, Vec<f64>, Vec<f64>);
    let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
    for round in 0..rounds {
        for t in rotate(targets, round) {
            let cpu0 = procfs::cpu(&t.pids);
            let eng0 = procfs::cpu_us(&[engine_pid]);
            let out = http::run(&chat_load(
                t.fast,
                &small_body("m"),
                64,
                Limit::Duration(Duration::from_secs_f64(secs)),
            ))
            .await?;
            let cpu = procfs::cpu(&t.pids) - cpu0;
            let eng = procfs::cpu_us(&[engine_pid]) - eng0;
            let e = acc.entry(t.name).or_default();
            e.0 += out.ok;
            e.1 += out.elapsed.as_secs_f64();
            e.2 += cpu;
            e.3 += eng;
            e.4 += out.errors;
            e.5.extend(out.latency_us);
            e.6.push(cpu.total() / out.ok.max(1) as f64);
            if let Some(err) = out.first_error {
                eprintln!(
                    "bench: c=64 through {}: {} errors, first: {err}",
                    t.name, out.errors
                );
            }
        }
    }
    let mut v = json!({});
    for t in targets {
        let (ok, secs, cpu, eng, errors, lat, per_round) = &acc[t.name];
        let s = summarize(lat);
        let rounds_cpu = summarize(per_round);
        let r = C64 {
            cpu_round_min: rounds_cpu.min,
            cpu_round_max: rounds_cpu.max,
            rps: *ok as f64 / secs,
            proxy_cpu_us_per_req: cpu.total() / *ok as f64,
            proxy_user_us_per_req: cpu.user / *ok as f64,
            proxy_system_us_per_req: cpu.system / *ok as f64,
            engine_cpu_us_per_req: eng / *ok as f64,
            p50: s.p50,
            p99: s.p99,
        };
        report.c64.insert(t.name, r);
        report.errors += errors;
        v[t.name] = json!({"requests": ok, "seconds": secs, "rps": r.rps, "proxy_cpu_us_per_request": r.proxy_cpu_us_per_req,
                           "proxy_user_us_per_request": r.proxy_user_us_per_req,
                           "proxy_system_us_per_request": r.proxy_system_us_per_req,
                           "proxy_cpu_us_per_request_by_round": per_round,
                           "engine_cpu_us_per_request": r.engine_cpu_us_per_req, "latency_us": s.to_json(), "errors": errors});
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// scenario 3: SSE chunk timing

#[derive(Debug, Default, Clone)]
struct SseFigures {
    lateness: Summary,
    first: Summary,
    request: Summary,
    streams: usize,
    events_expected: usize,
    events: usize,
    reads: usize,
    coalesced: usize,
    missing: usize,
    failed: usize,
}

async fn scenario_sse(
    targets: &[Target],
    scale: f64,
    events: &Path,
    report: &mut Report,
) -> Result<Value, BoxError> {
    let rounds = 6;
    let concurrent = scaled(8.0, scale, 4.0) as usize;
    let interval = SSE_INTERVAL_MS as f64 * 1000.0;
    // The engine's timer has millisecond ticks, so each stream's chunks are late by a fixed
    // fraction of a millisecond that depends on when the stream started. Streams start 1 + 1/n ms
    // apart so that every target gets the same spread of phases (and so that the engine's
    // `request` events come in the order the streams were sent).
    let stagger = Duration::from_micros(1000 + 1000 / concurrent as u64);
    // per target: each stream, with the engine's start of its schedule when matched
    type Streams = Vec<(Result<sse::Stream, String>, Option<f64>)>;
    let mut all: BTreeMap<&str, Streams> = BTreeMap::new();
    for round in 0..rounds {
        for t in rotate(targets, round) {
            // The `hold` engine writes an events file: its `request` events say when each stream's
            // schedule started, on the engine's side.
            let req = Arc::new(sse::post(
                t.hold,
                CHAT,
                &stream_body("hold", SSE_CHUNKS as u64, SSE_INTERVAL_MS as u64),
            ));
            let window_start = unix_ms();
            let mut set = tokio::task::JoinSet::new();
            for i in 0..concurrent {
                let req = req.clone();
                let a = t.hold;
                set.spawn(async move {
                    tokio::time::sleep(stagger * i as u32).await;
                    sse::run_stream(a, &req, Duration::from_secs(30)).await
                });
            }
            let mut batch = Vec::new();
            while let Some(r) = set.join_next().await {
                batch.push(r?);
            }
            // Match streams to the engine's request events in time order.
            let window_end = unix_ms();
            let mut starts: Vec<f64> = read_events(events)
                .into_iter()
                .filter(|e| e["event"] == "request" && e["path"] == CHAT)
                .filter_map(|e| e["t_ms"].as_f64())
                .filter(|t| *t >= window_start && *t <= window_end)
                .collect();
            starts.sort_by(|a, b| a.total_cmp(b));
            batch.sort_by(|a, b| match (a, b) {
                (Ok(x), Ok(y)) => x.sent.cmp(&y.sent),
                _ => std::cmp::Ordering::Equal,
            });
            let matched = starts.len() == batch.len() && batch.iter().all(|b| b.is_ok());
            for (i, b) in batch.into_iter().enumerate() {
                let start = if matched { Some(starts[i]) } else { None };
                all.entry(t.name).or_default().push((b, start));
            }
            if !matched {
                eprintln!(
                    "bench: SSE through {}: {} engine request events for {concurrent} streams; \
                     chunk delays fall back to the client's send time",
                    t.name,
                    starts.len()
                );
            }
        }
    }
    let mut v = json!({});
    for t in targets {
        let mut f = SseFigures::default();
        let mut late = Vec::new();
        let mut first = Vec::new();
        let mut request = Vec::new();
        for (s, engine_start) in &all[t.name] {
            let s = match s {
                Ok(s) if s.status == 200 => s,
                Ok(s) => {
                    f.failed += 1;
                    eprintln!("bench: SSE through {}: status {}", t.name, s.status);
                    continue;
                }
                Err(e) => {
                    f.failed += 1;
                    eprintln!("bench: SSE through {}: {e}", t.name);
                    continue;
                }
            };
            f.streams += 1;
            f.events_expected += SSE_CHUNKS as usize + 2;
            f.events += s.events.len();
            f.reads += s.reads as usize;
            // µs from the client's send to the engine's schedule start (0 when unmatched).
            let offset = match engine_start {
                Some(t0) => {
                    let us = (t0 - s.sent_unix_ms) * 1000.0;
                    request.push(us);
                    us
                }
                None => 0.0,
            };
            let mut last_read = None;
            let mut seen = 0;
            for e in &s.events {
                let Some(k) = e.index else { continue };
                seen += 1;
                let lat = (e.at - s.sent).as_secs_f64() * 1e6 - offset - k as f64 * interval;
                late.push(lat);
                if k == 0 {
                    first.push((e.at - s.sent).as_secs_f64() * 1e6);
                }
                // A content chunk that arrived in the same read as the previous one was held back
                // somewhere: the engine sends them 5 ms apart.
                if last_read == Some(e.read) {
                    f.coalesced += 1;
                }
                last_read = Some(e.read);
            }
            f.missing += (SSE_CHUNKS as usize).saturating_sub(seen);
            if !s.events.iter().any(|e| e.done) {
                f.failed += 1;
                eprintln!("bench: SSE through {}: no [DONE]", t.name);
            }
        }
        f.lateness = summarize(&late);
        f.first = summarize(&first);
        f.request = summarize(&request);
        report.failed_streams += f.failed;
        v[t.name] = json!({"chunk_delay_after_engine_schedule_us": f.lateness.to_json(),
            "request_to_engine_us": f.request.to_json(), "first_chunk_us": f.first.to_json(),
            "streams": f.streams, "events_expected": f.events_expected, "events": f.events, "reads": f.reads,
            "coalesced_chunks": f.coalesced, "missing_chunks": f.missing, "failed_streams": f.failed});
        report.sse.insert(t.name, f);
    }
    Ok(v)
}

fn read_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// scenario 4: 1,000 open streams

#[derive(Debug, Default, Clone, Copy)]
struct Hold {
    opened: usize,
    open_ms: f64,
    rss_idle_kib: f64,
    rss_hold_kib: f64,
    rss_after_kib: f64,
    engine_rss_hold_kib: f64,
    close_loop_ms: f64,
    upstream_open: usize,
    up_closed_p50_ms: Option<f64>,
    up_closed_p99_ms: Option<f64>,
    up_closed_all_ms: Option<f64>,
    peer_closed: usize,
    peer_closed_p50_ms: f64,
    peer_closed_max_ms: f64,
}

async fn scenario_hold(
    targets: &[Target],
    hold_port: u16,
    hold_pid: u32,
    events: &Path,
    report: &mut Report,
) -> Result<Value, BoxError> {
    let mut v = json!({});
    for t in targets {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut h = Hold {
            rss_idle_kib: procfs::rss_sum_kib(&t.pids) as f64,
            ..Default::default()
        };
        let est_base = procfs::established_on_port(hold_port);
        // A chunk every second for ~a day: the streams stay open until the client leaves.
        let req = Arc::new(sse::post(t.hold, CHAT, &stream_body("hold", 100_000, 1000)));
        let t_open = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(100));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..HOLD_STREAMS {
            let (req, gate, a) = (req.clone(), gate.clone(), t.hold);
            set.spawn(async move {
                let _permit = gate.acquire_owned().await.expect("open semaphore");
                tokio::time::timeout(Duration::from_secs(30), sse::open_stream(a, &req))
                    .await
                    .map_err(|_| "timed out".to_string())?
            });
        }
        let mut socks = Vec::with_capacity(HOLD_STREAMS);
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r? {
                Ok(s) => socks.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        h.opened = socks.len();
        h.open_ms = t_open.elapsed().as_secs_f64() * 1e3;
        if let Some(e) = first_err {
            eprintln!(
                "bench: {} of {HOLD_STREAMS} streams through {} failed to open; first: {e}",
                HOLD_STREAMS - h.opened,
                t.name
            );
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        h.rss_hold_kib = procfs::rss_sum_kib(&t.pids) as f64;
        h.engine_rss_hold_kib = procfs::rss_kib(hold_pid).unwrap_or(0) as f64;
        let est_hold = procfs::established_on_port(hold_port);
        h.upstream_open = est_hold.saturating_sub(est_base);

        // Every client leaves at once.
        let close_unix = unix_ms();
        let t_close = Instant::now();
        for s in socks.drain(..) {
            sse::drain_now(&s);
            drop(s);
        }
        h.close_loop_ms = t_close.elapsed().as_secs_f64() * 1e3;
        // Watch the engine's side of the upstream connections leave ESTABLISHED.
        let n = h.upstream_open;
        while t_close.elapsed() < Duration::from_secs(5) {
            let closed = est_hold.saturating_sub(procfs::established_on_port(hold_port));
            let ms = t_close.elapsed().as_secs_f64() * 1e3;
            if h.up_closed_p50_ms.is_none() && closed * 2 >= n {
                h.up_closed_p50_ms = Some(ms);
            }
            if h.up_closed_p99_ms.is_none() && closed * 100 >= n * 99 {
                h.up_closed_p99_ms = Some(ms);
            }
            if closed >= n {
                h.up_closed_all_ms = Some(ms);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        h.rss_after_kib = procfs::rss_sum_kib(&t.pids) as f64;
        let delays: Vec<f64> = std::fs::read_to_string(events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "peer_closed" && e["path"] == CHAT)
            .filter_map(|e| e["t_ms"].as_f64())
            .filter(|t| *t >= close_unix - 1.0 && *t <= close_unix + 10_000.0)
            .map(|t| t - close_unix)
            .collect();
        let s = summarize(&delays);
        h.peer_closed = s.n;
        h.peer_closed_p50_ms = s.p50;
        h.peer_closed_max_ms = s.max;
        let opt = |x: Option<f64>| x.map(Value::from).unwrap_or(Value::Null);
        v[t.name] = json!({"opened": h.opened, "open_ms": h.open_ms, "rss_idle_kib": h.rss_idle_kib,
            "rss_holding_kib": h.rss_hold_kib, "rss_after_close_kib": h.rss_after_kib, "engine_rss_holding_kib": h.engine_rss_hold_kib,
            "client_close_loop_ms": h.close_loop_ms, "upstream_connections": h.upstream_open,
            "upstream_closed_ms": {"p50": opt(h.up_closed_p50_ms), "p99": opt(h.up_closed_p99_ms), "all": opt(h.up_closed_all_ms)},
            "engine_peer_closed_ms": s.to_json()});
        report.hold.insert(t.name, h);
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// scenario 5: readiness

async fn scenario_readiness(
    corral: SocketAddr,
    events: &Path,
    report: &mut Report,
) -> Result<Value, BoxError> {
    let mut totals = Vec::new();
    for i in 0..READY_REPS {
        let model = format!("slow-{i}");
        let load = chat_load(corral, &small_body(&model), 1, Limit::Requests(1));
        let mut s = http::connect(corral).await?;
        let (status, body, lat) = http::once(&mut s, &load).await?;
        if status != 200 {
            return Err(format!(
                "model {model}: status {status}: {}",
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        totals.push(lat.as_secs_f64() * 1e3 - (LOADING_MS + i as f64 * LOADING_STEP_MS));
        let unload = Load {
            method: hyper::Method::POST,
            path: format!("/api/models/unload/{model}"),
            content_type: "application/json".into(),
            ..get_load(corral, "")
        };
        let (status, _, _) = http::once(&mut s, &unload).await?;
        if status != 200 {
            return Err(format!("unload: status {status}").into());
        }
    }
    // Per engine process: its start, and the first chat request corral sent it.
    let mut spawned: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let mut listening: BTreeMap<u64, f64> = BTreeMap::new();
    let mut first_req: BTreeMap<u64, f64> = BTreeMap::new();
    for e in std::fs::read_to_string(events)?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let (Some(pid), Some(t)) = (e["pid"].as_u64(), e["t_ms"].as_f64()) else {
            continue;
        };
        match e["event"].as_str() {
            Some("spawned") => {
                // The load time is in the engine's own arguments.
                let args: Vec<&str> = e["args"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                    .unwrap_or_default();
                let load = args
                    .windows(2)
                    .find(|w| w[0] == "--loading-ms")
                    .and_then(|w| w[1].parse().ok())
                    .unwrap_or(LOADING_MS);
                spawned.insert(pid, (t, load));
            }
            Some("listening") => {
                listening.insert(pid, t);
            }
            Some("request") if e["path"] == CHAT => {
                first_req.entry(pid).or_insert(t);
            }
            _ => {}
        }
    }
    let mut beyond = Vec::new();
    let mut bind = Vec::new();
    for (pid, (t_spawn, load)) in &spawned {
        if let Some(t_req) = first_req.get(pid) {
            beyond.push(t_req - (t_spawn + load));
        }
        if let Some(t_l) = listening.get(pid) {
            bind.push(t_l - t_spawn);
        }
    }
    let s = summarize(&beyond);
    let total = summarize(&totals);
    report.readiness = Some((s, total));
    Ok(
        json!({"loading_ms": format!("{LOADING_MS} + i * {LOADING_STEP_MS}, i < {READY_REPS}"), "beyond_load_ms": s.to_json(),
               "spawn_to_listening_ms": summarize(&bind).to_json(), "client_total_beyond_load_ms": total.to_json()}),
    )
}

// ---------------------------------------------------------------------------------------------
// scenario 6: criterion results

/// Mean time per iteration (ns) of each benchmark criterion has recorded under `dir`.
fn read_criterion(dir: &Path) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "benchmark.json")
                && p.parent().is_some_and(|q| q.ends_with("new"))
            {
                let meta: Value = std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default();
                let est: Value = std::fs::read_to_string(p.with_file_name("estimates.json"))
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default();
                if let (Some(id), Some(ns)) = (
                    meta["full_id"].as_str(),
                    est["mean"]["point_estimate"].as_f64(),
                ) {
                    if id.starts_with("hot_path") {
                        out.insert(id.to_string(), ns);
                    }
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// the table

#[derive(Default)]
struct Report {
    machine: String,
    nginx_version: Option<String>,
    names: Vec<&'static str>,
    corral_rss_warm_kib: f64,
    corral_env: String,
    load1: f64,
    /// Share of the machine's CPU used by other processes during the run.
    foreign: f64,
    c1: BTreeMap<&'static str, Summary>,
    c64: BTreeMap<&'static str, C64>,
    sse: BTreeMap<&'static str, SseFigures>,
    hold: BTreeMap<&'static str, Hold>,
    readiness: Option<(Summary, Summary)>,
    hot_path: BTreeMap<String, f64>,
    errors: u64,
    failed_streams: usize,
}

fn f0(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.0}")
    } else {
        "–".into()
    }
}

fn f1(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "–".into()
    }
}

fn f2(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "–".into()
    }
}

fn mib(kib: f64) -> String {
    f1(kib / 1024.0)
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "**met**",
        Some(false) => "**missed**",
        None => "n/a",
    }
}

impl Report {
    /// What the floor with the least client did in scenarios 1 and 2, beside the hyper floor:
    /// the most a client written for the engine link could take off corral's figures.
    fn least_client_note(&self) -> String {
        let (Some(c1), Some(c64)) = (self.c1.get(LEAST), self.c64.get(LEAST)) else {
            return String::new();
        };
        let direct_c1 = self.c1.get("direct").copied().unwrap_or_default();
        let direct_rps = self.c64.get("direct").map_or(f64::NAN, |d| d.rps);
        let hyper = self.c64.get("hyper").copied().unwrap_or_default();
        format!(
            "\nThe floor with the least client (`FLOOR_CLIENT=minimal`: hyper's server, and the \
             request written whole and the answer's head parsed by httparse, its body read whole; \
             the least any client for the engine link could cost): c=1 added p50 / p99 {} / {} µs; \
             c=64 {} requests/s, throughput ratio {}; proxy CPU per request {} µs (user {} / \
             system {}), against the hyper floor's {} µs (user {} / system {}).\n",
            f0(c1.p50 - direct_c1.p50),
            f0(c1.p99 - direct_c1.p99),
            f0(c64.rps),
            f2(c64.rps / direct_rps),
            f1(c64.proxy_cpu_us_per_req),
            f1(c64.proxy_user_us_per_req),
            f1(c64.proxy_system_us_per_req),
            f1(hyper.proxy_cpu_us_per_req),
            f1(hyper.proxy_user_us_per_req),
            f1(hyper.proxy_system_us_per_req),
        )
    }

    fn has(&self, name: &str) -> bool {
        self.names.contains(&name)
    }

    /// A row with one cell per target (direct, corral, nginx, the hyper floor) from `cell`.
    fn row(
        &self,
        rows: &mut Vec<String>,
        scenario: &str,
        figure: &str,
        cell: impl Fn(&str) -> String,
        target: &str,
        ok: Option<bool>,
    ) {
        let cells: Vec<String> = ["direct", "corral", "nginx", "hyper"]
            .iter()
            .map(|n| if self.has(n) { cell(n) } else { "–".into() })
            .collect();
        let res = if target.is_empty() { "" } else { verdict(ok) };
        rows.push(format!(
            "| {scenario} | {figure} | {} | {} | {} | {} | {target} | {res} |",
            cells[0], cells[1], cells[2], cells[3]
        ));
    }

    fn render(&self) -> String {
        let mut rows = Vec::new();
        let nginx = self.has("nginx");
        let nx = |v: String| if nginx { v } else { "–".to_string() };
        let cmp = |a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> bool| match (a, b) {
            (Some(a), Some(b)) if a.is_finite() && b.is_finite() => Some(f(a, b)),
            _ => None,
        };
        let mut targets: Vec<(String, Option<bool>)> = Vec::new();

        // 1
        let c1 = |n: &str| self.c1.get(n).copied().unwrap_or_default();
        let added = |n: &str, p: fn(&Summary) -> f64| p(&c1(n)) - p(&c1("direct"));
        self.row(
            &mut rows,
            "1. c=1, small JSON",
            "latency p50 / p99 (µs)",
            |n| format!("{} / {}", f0(c1(n).p50), f0(c1(n).p99)),
            "",
            None,
        );
        let ok = cmp(
            Some(added("corral", |s| s.p50)),
            nginx.then(|| added("nginx", |s| s.p50)),
            |a, b| a <= b,
        );
        self.row(
            &mut rows,
            "",
            "added p50 / p99 over direct (µs)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    format!("{} / {}", f0(added(n, |s| s.p50)), f0(added(n, |s| s.p99)))
                }
            },
            "added p50: corral ≤ nginx",
            ok,
        );
        targets.push((
            format!(
                "c=1 added p50: corral {} µs vs nginx {} µs (hyper floor {} µs)",
                f0(added("corral", |s| s.p50)),
                nx(f0(added("nginx", |s| s.p50))),
                f0(added("hyper", |s| s.p50))
            ),
            ok,
        ));

        // 2
        let c64 = |n: &str| self.c64.get(n).copied().unwrap_or_default();
        let ratio = |n: &str| c64(n).rps / c64("direct").rps;
        self.row(
            &mut rows,
            "2. c=64, small JSON",
            "requests/s",
            |n| f0(c64(n).rps),
            "",
            None,
        );
        let ok = cmp(
            Some(ratio("corral")),
            nginx.then(|| ratio("nginx")),
            |a, b| a >= b,
        );
        self.row(
            &mut rows,
            "",
            "throughput ratio to direct",
            |n| f2(ratio(n)),
            "corral ≥ nginx",
            ok,
        );
        targets.push((
            format!(
                "c=64 throughput ratio: corral {} vs nginx {} (hyper floor {})",
                f2(ratio("corral")),
                nx(f2(ratio("nginx"))),
                f2(ratio("hyper"))
            ),
            ok,
        ));
        self.row(
            &mut rows,
            "",
            "latency p50 / p99 (µs)",
            |n| format!("{} / {}", f0(c64(n).p50), f0(c64(n).p99)),
            "",
            None,
        );
        let ok = cmp(
            Some(c64("corral").proxy_cpu_us_per_req),
            nginx.then(|| c64("nginx").proxy_cpu_us_per_req),
            |a, b| a < b,
        );
        self.row(
            &mut rows,
            "",
            "proxy CPU per request, all (rounds min-max) (µs)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    format!(
                        "{} ({}-{})",
                        f1(c64(n).proxy_cpu_us_per_req),
                        f0(c64(n).cpu_round_min),
                        f0(c64(n).cpu_round_max)
                    )
                }
            },
            "corral < nginx",
            ok,
        );
        self.row(
            &mut rows,
            "",
            "proxy CPU per request, user / system (µs)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    let r = c64(n);
                    format!(
                        "{} / {}",
                        f1(r.proxy_user_us_per_req),
                        f1(r.proxy_system_us_per_req)
                    )
                }
            },
            "",
            None,
        );
        targets.push((
            format!(
                "CPU per request: corral {} µs vs nginx {} µs (hyper floor {} µs)",
                f1(c64("corral").proxy_cpu_us_per_req),
                nx(f1(c64("nginx").proxy_cpu_us_per_req)),
                f1(c64("hyper").proxy_cpu_us_per_req)
            ),
            ok,
        ));
        self.row(
            &mut rows,
            "",
            "engine CPU per request (µs, reference)",
            |n| f1(c64(n).engine_cpu_us_per_req),
            "",
            None,
        );

        // 3
        let sse = |n: &str| self.sse.get(n).cloned().unwrap_or_default();
        let sadd =
            |n: &str, p: fn(&Summary) -> f64| p(&sse(n).lateness) - p(&sse("direct").lateness);
        self.row(
            &mut rows,
            &format!("3. SSE {SSE_CHUNKS} chunks × {SSE_INTERVAL_MS} ms"),
            "request reaches the engine p50 / p99 (µs)",
            |n| format!("{} / {}", f0(sse(n).request.p50), f0(sse(n).request.p99)),
            "",
            None,
        );
        self.row(
            &mut rows,
            "",
            "chunk arrival after the engine's schedule p50 / p99 (µs)",
            |n| format!("{} / {}", f0(sse(n).lateness.p50), f0(sse(n).lateness.p99)),
            "",
            None,
        );
        self.row(
            &mut rows,
            "",
            "first chunk after request p50 / p99 (µs)",
            |n| format!("{} / {}", f0(sse(n).first.p50), f0(sse(n).first.p99)),
            "",
            None,
        );
        let ok = cmp(
            Some(sadd("corral", |s| s.p99)),
            nginx.then(|| sadd("nginx", |s| s.p99)),
            |a, b| a <= b,
        );
        self.row(
            &mut rows,
            "",
            "added per chunk p50 / p99 (µs)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    format!("{} / {}", f0(sadd(n, |s| s.p50)), f0(sadd(n, |s| s.p99)))
                }
            },
            "added p99: corral ≤ nginx",
            ok,
        );
        targets.push((
            format!(
                "SSE added p99 per chunk: corral {} µs vs nginx {} µs",
                f0(sadd("corral", |s| s.p99)),
                nx(f0(sadd("nginx", |s| s.p99)))
            ),
            ok,
        ));
        let ok = self
            .sse
            .get("corral")
            .map(|f| f.coalesced == 0 && f.missing == 0);
        self.row(
            &mut rows,
            "",
            "coalesced chunks (missing)",
            |n| format!("{} ({})", sse(n).coalesced, sse(n).missing),
            "corral: 0",
            ok,
        );
        targets.push((format!("coalesced chunks: {}", sse("corral").coalesced), ok));
        self.row(
            &mut rows,
            "",
            "events / reads received",
            |n| format!("{} / {}", sse(n).events, sse(n).reads),
            "",
            None,
        );

        // 4
        let hold = |n: &str| self.hold.get(n).copied().unwrap_or_default();
        let per_stream =
            |n: &str| (hold(n).rss_hold_kib - hold(n).rss_idle_kib) / hold(n).opened.max(1) as f64;
        let corral_idle = hold("corral").rss_idle_kib;
        self.row(
            &mut rows,
            &format!("4. {HOLD_STREAMS} open streams"),
            "streams opened (time, ms)",
            |n| format!("{} ({})", hold(n).opened, f0(hold(n).open_ms)),
            "",
            None,
        );
        let ok = Some(self.corral_rss_warm_kib < 15.0 * 1024.0 && corral_idle < 15.0 * 1024.0);
        self.row(
            &mut rows,
            "",
            "proxy RSS idle: fresh / before streams (MiB)",
            |n| {
                if n == "corral" {
                    format!("{} / {}", mib(self.corral_rss_warm_kib), mib(corral_idle))
                } else if n != "direct" {
                    format!("– / {}", mib(hold(n).rss_idle_kib))
                } else {
                    "–".into()
                }
            },
            "corral < 15 MiB",
            ok,
        );
        targets.push((
            format!(
                "corral idle RSS: {} MiB fresh, {} MiB after load",
                mib(self.corral_rss_warm_kib),
                mib(corral_idle)
            ),
            ok,
        ));
        self.row(
            &mut rows,
            "",
            "proxy RSS holding streams (MiB)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    mib(hold(n).rss_hold_kib)
                }
            },
            "",
            None,
        );
        let ok = cmp(
            Some(per_stream("corral")),
            nginx.then(|| per_stream("nginx")),
            |a, b| a <= b,
        );
        self.row(
            &mut rows,
            "",
            "proxy memory per open stream (KiB)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    f1(per_stream(n))
                }
            },
            "corral ≤ nginx",
            ok,
        );
        targets.push((
            format!(
                "memory per stream: corral {} KiB vs nginx {} KiB (hyper floor {} KiB)",
                f1(per_stream("corral")),
                nx(f1(per_stream("nginx"))),
                f1(per_stream("hyper"))
            ),
            ok,
        ));
        let back = hold("corral").rss_after_kib - corral_idle;
        let ok = self.hold.get("corral").map(|_| back <= 1024.0);
        self.row(
            &mut rows,
            "",
            "proxy RSS 1.5 s after close (MiB)",
            |n| {
                if n == "direct" {
                    "–".into()
                } else {
                    mib(hold(n).rss_after_kib)
                }
            },
            "corral ≤ idle + 1 MiB",
            ok,
        );
        targets.push((
            format!(
                "corral RSS after close: {} MiB (idle {} MiB)",
                mib(hold("corral").rss_after_kib),
                mib(corral_idle)
            ),
            ok,
        ));
        let ms = |x: Option<f64>| x.map(f1).unwrap_or_else(|| "> 5000".into());
        self.row(
            &mut rows,
            "",
            "upstream sockets closed after clients left: p50 / p99 / all (ms)",
            |n| {
                format!(
                    "{} / {} / {}",
                    ms(hold(n).up_closed_p50_ms),
                    ms(hold(n).up_closed_p99_ms),
                    ms(hold(n).up_closed_all_ms)
                )
            },
            "",
            None,
        );
        self.row(
            &mut rows,
            "",
            "engine saw peer_closed: count, p50 / max (ms)",
            |n| {
                format!(
                    "{}, {} / {}",
                    hold(n).peer_closed,
                    f1(hold(n).peer_closed_p50_ms),
                    f1(hold(n).peer_closed_max_ms)
                )
            },
            "",
            None,
        );

        // 5
        if let Some((s, total)) = &self.readiness {
            let ok = Some(s.max < 30.0);
            self.row(
                &mut rows,
                &format!(
                    "5. readiness ({}× {}-{} ms load)",
                    s.n,
                    LOADING_MS as u64,
                    (LOADING_MS + (READY_REPS - 1) as f64 * LOADING_STEP_MS) as u64
                ),
                "wait beyond the load p50 / max (ms)",
                |n| {
                    if n == "corral" {
                        format!("{} / {}", f1(s.p50), f1(s.max))
                    } else {
                        "–".into()
                    }
                },
                "corral max < 30 ms",
                ok,
            );
            targets.push((
                format!(
                    "readiness beyond load: p50 {} ms, max {} ms",
                    f1(s.p50),
                    f1(s.max)
                ),
                ok,
            ));
            self.row(
                &mut rows,
                "",
                "client's first request beyond the load p50 / max (ms)",
                |n| {
                    if n == "corral" {
                        format!("{} / {}", f1(total.p50), f1(total.max))
                    } else {
                        "–".into()
                    }
                },
                "",
                None,
            );
        }

        let mut out = String::new();
        out.push_str(&format!(
            "Machine: {}; {}\n",
            self.machine,
            self.nginx_version
                .clone()
                .unwrap_or_else(|| "nginx not run".into())
        ));
        if !self.corral_env.is_empty() {
            out.push_str(&format!("corral ran with {}\n", self.corral_env));
        }
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        out.push_str(&format!(
            "Other processes used {:.0} % of the machine's CPU during the run.\n",
            self.foreign * 100.0
        ));
        if self.load1 > cores / 2.0 || self.foreign > 0.1 {
            out.push_str(&format!(
                "\nWARNING: the machine was busy (load average {:.2} on {cores} cores at the start, \
                 {:.0} % of its CPU taken by other processes during the run): latencies, chunk delays \
                 and coalescing are noisy; CPU per request and memory much less so.\n",
                self.load1,
                self.foreign * 100.0
            ));
        }
        out.push('\n');
        out.push_str("| scenario | figure | direct | corral | nginx | hyper floor | target | result |\n|---|---|---:|---:|---:|---:|---|---|\n");
        for r in rows {
            out.push_str(&r);
            out.push('\n');
        }
        out.push_str(&self.least_client_note());
        if !self.hot_path.is_empty() {
            out.push_str("\n| hot path (criterion, `cargo bench --bench hot_path`) | mean time |\n|---|---:|\n");
            for (k, ns) in &self.hot_path {
                let t = if *ns >= 1000.0 {
                    format!("{:.2} µs", ns / 1000.0)
                } else {
                    format!("{ns:.0} ns")
                };
                out.push_str(&format!(
                    "| {} | {t} |\n",
                    k.trim_start_matches("hot_path/")
                ));
            }
        }
        let met = targets.iter().filter(|t| t.1 == Some(true)).count();
        out.push_str(&format!("\nTargets: {met} of {} met\n\n", targets.len()));
        for (t, ok) in &targets {
            out.push_str(&format!("- {}: {t}\n", verdict(*ok)));
        }
        if self.errors > 0 || self.failed_streams > 0 {
            out.push_str(&format!(
                "\nWARNING: {} failed requests and {} failed streams during the run\n",
                self.errors, self.failed_streams
            ));
        }
        out
    }
}
