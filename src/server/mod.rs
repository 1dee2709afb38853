//! Accepting connections and the shutdown sequence.

pub(crate) mod admission;
pub(crate) mod idle;
pub(crate) mod slow_body;
pub(crate) mod stall;
pub(crate) mod trim;
pub(crate) mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::sync::RwLock;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::{App, Limits};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::supervisor::sweep::StateFile;
use crate::supervisor::Spawner;
use admission::Admission;
use workers::Workers;

/// How to run, beyond the config file.
#[derive(Debug, Clone)]
pub struct Options {
    pub limits: Limits,
    /// Where the state file of process groups lives (`None`: no state file, marker sweep only).
    pub state_dir: Option<PathBuf>,
    /// Identifies this corral across restarts: its config's path, whatever address it listens on.
    pub state_key: String,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub drain_timeout: Duration,
    /// Variables that model sources read (`HF_ENDPOINT`, `HF_HUB_CACHE`, `AWS_*`, ...) set for
    /// this corral only, over the process environment.
    pub source_env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            state_dir: None,
            state_key: "corral".into(),
            drain_timeout: Duration::from_secs(30),
            source_env: Vec::new(),
        }
    }
}

/// Serves until `shutdown` is cancelled, then drains and stops every child. Cancelling `abort` at any
/// point kills the children at once and returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    logs: Arc<Logs>,
    opts: Options,
    shutdown: CancellationToken,
    abort: CancellationToken,
) -> std::io::Result<()> {
    let (_keep, reloads) = mpsc::channel(1);
    run_with_reloads(config, listener, logs, opts, shutdown, abort, reloads).await
}

/// A config to apply, or why one could not be loaded (a reload that fails keeps the old config).
pub type Reload = Result<Config, String>;

/// Like [`run`], applying each config that arrives on `reloads` without dropping a request.
pub async fn run_with_reloads(
    config: Config,
    listener: TcpListener,
    logs: Arc<Logs>,
    opts: Options,
    shutdown: CancellationToken,
    abort: CancellationToken,
    mut reloads: mpsc::Receiver<Reload>,
) -> std::io::Result<()> {
    let state_file = StateFile::new(opts.state_dir.clone(), &opts.state_key);
    let swept = state_file.sweep();
    if !swept.is_empty() {
        tracing::warn!("killed process groups left by a previous run: {swept:?}");
    }
    let settings = config.server.clone();
    let admission = Admission::new(max_connections(&settings));
    let spawner = Spawner::start(tokio::runtime::Handle::current())?;
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let fetcher = fetcher(&opts.source_env);
    metrics.register(Box::new(fetcher.download_bytes()));
    let fleet = Fleet::new(
        Arc::new(config),
        spawner,
        logs.clone(),
        metrics.fleet.clone(),
        state_file,
        fetcher,
    );
    metrics.register_instances(&fleet.snapshot());
    let mut limits = opts.limits;
    if let Some(n) = settings.max_buffered_bodies {
        limits.buffered_bytes = n;
    }
    let app = Arc::new(App::new(fleet.clone(), logs, metrics.clone(), limits));
    let current = Arc::new(RwLock::new(app.clone()));
    let ttl = tokio::spawn(fleet.clone().run_ttl());
    let device_refresh = tokio::spawn(fleet.clone().run_device_refresh());
    let reaper =
        crate::supervisor::reaper::needed().then(|| tokio::spawn(crate::supervisor::reaper::run()));
    let mut preload_task = tokio::spawn(preload(fleet.clone()));

    let connections = Arc::new(crate::server::trim::Connections::default());
    let trimmer = tokio::spawn(crate::server::trim::run(connections.clone()));
    let shared = workers::Shared {
        current: current.clone(),
        settings,
    };
    let mut refusals = Refusals::default();
    let mut workers = Workers::start(workers::count(), shared, opts.drain_timeout)?;

    loop {
        let (stream, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = abort.cancelled() => break,
            Some(reload) = reloads.recv() => {
                let running = fleet.config();
                match reload.and_then(|next| crate::config::reload_guard::check(&running, next)) {
                    Ok(config) => {
                        fleet.reconfigure(Arc::new(config));
                        let next = Arc::new(current.read().unwrap_or_else(|e| e.into_inner()).reloaded());
                        *current.write().unwrap_or_else(|e| e.into_inner()) = next;
                        metrics.config_reloads.with_label_values(&["success"]).inc();
                        metrics.register_instances(&fleet.snapshot());
                        preload_task.abort();
                        preload_task = tokio::spawn(preload(fleet.clone()));
                        tracing::info!("config reloaded");
                    }
                    Err(why) => {
                        metrics.config_reloads.with_label_values(&["failure"]).inc();
                        tracing::warn!("config reload failed, keeping the running config: {why}");
                    }
                }
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(admitted) = admission.admit() else {
            refusals.refused(admission.max());
            continue;
        };
        workers.dispatch(stream, remote, connections.opened(), admitted);
    }
    drop(listener);
    app.closing.cancel();
    tracing::info!(
        "shutting down: draining {} connection(s)",
        workers.open_connections()
    );
    let stop = async {
        workers.drain().await;
        fleet.shutdown().await;
    };
    tokio::select! {
        _ = stop => {}
        _ = abort.cancelled() => {
            tracing::warn!("stopping at once");
            fleet.kill_all();
        }
    }
    workers.stop().await;
    ttl.abort();
    device_refresh.abort();
    if let Some(reaper) = reaper {
        reaper.abort();
    }
    trimmer.abort();
    preload_task.abort();
    Ok(())
}

/// `hooks.on_startup.preload`: loads each model in turn without sending it a request.
async fn preload(fleet: Fleet) {
    let names = fleet.config().preload.clone();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let catalog = fleet.catalog();
        let Some((target, _)) = catalog.resolve(name) else {
            tracing::warn!("preload: no model or alias named {name:?}; skipped");
            continue;
        };
        let target = target.clone();
        let started = std::time::Instant::now();
        match fleet.acquire(&target, None).await {
            Ok(lease) => {
                drop(lease);
                tracing::info!(
                    "preload: {name} ready in {:.2}s",
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) => tracing::warn!("preload: {name} failed: {e}"),
        }
    }
}

/// `maxConnections`, or the default derived from the open-file limit.
fn max_connections(settings: &crate::config::ServerSettings) -> usize {
    let max = settings
        .max_connections
        .unwrap_or_else(|| admission::default_max(crate::fdlimit::current()));
    tracing::info!("serving at most {max} client connections at once");
    max
}

/// Connections refused at the cap (every one has a request in flight), logged at most every 10 s.
#[derive(Default)]
struct Refusals {
    since_log: u64,
    logged: Option<std::time::Instant>,
}

impl Refusals {
    fn refused(&mut self, max: usize) {
        self.since_log += 1;
        let due = self
            .logged
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
        if due {
            tracing::warn!(
                "refused {} connection(s): all {max} connections have a request in flight (maxConnections)",
                self.since_log
            );
            self.since_log = 0;
            self.logged = Some(std::time::Instant::now());
        }
    }
}

/// The fetcher of model weights, reading the process environment under `overrides`.
fn fetcher(overrides: &[(String, String)]) -> crate::sources::Fetcher {
    crate::sources::Fetcher::from_env(&|name| {
        overrides
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    })
}
