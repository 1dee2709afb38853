//! Accepting connections and the shutdown sequence.

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
use crate::workers::{self, Workers};

/// How to run, beyond the config file.
#[derive(Debug, Clone)]
pub struct Options {
    pub limits: Limits,
    /// Where the state file of process groups lives (`None`: no state file, marker sweep only).
    pub state_dir: Option<PathBuf>,
    /// Identifies this corral across restarts (config path and listen address).
    pub state_key: String,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub drain_timeout: Duration,
    /// Slowloris bound: the time a client has to send its request head.
    pub header_read_timeout: Duration,
    /// How long a client may leave its response unread before its connection is closed.
    pub client_write_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            state_dir: None,
            state_key: "corral".into(),
            drain_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
            client_write_timeout: Duration::from_secs(60),
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
    let spawner = Spawner::start(tokio::runtime::Handle::current())?;
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let fleet = Fleet::new(
        Arc::new(config),
        spawner,
        logs.clone(),
        metrics.clone(),
        state_file,
    );
    metrics.register_instances(&fleet.snapshot());
    let app = Arc::new(App::new(fleet.clone(), logs, metrics.clone(), opts.limits));
    let current = Arc::new(RwLock::new(app.clone()));
    let ttl = tokio::spawn(fleet.clone().run_ttl());
    let reaper =
        crate::supervisor::reaper::needed().then(|| tokio::spawn(crate::supervisor::reaper::run()));
    let mut preload_task = tokio::spawn(preload(fleet.clone()));

    let connections = Arc::new(crate::trim::Connections::default());
    let trimmer = tokio::spawn(crate::trim::run(connections.clone()));
    let shared = workers::Shared {
        current: current.clone(),
        header_read_timeout: opts.header_read_timeout,
        client_write_timeout: opts.client_write_timeout,
    };
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
        workers.dispatch(stream, remote, connections.opened());
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
