//! Accepting connections and the shutdown sequence.

pub(crate) mod admission;
pub(crate) mod connection;
pub mod fdlimit;
pub(crate) mod idle;
pub(crate) mod layers;
pub(crate) mod peek;
pub(crate) mod sends;
pub(crate) mod slow_body;
pub(crate) mod stall;
pub(crate) mod tls;
pub(crate) mod trim;
pub(crate) mod workers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::api::App;
use crate::api::Limits;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::supervisor::sweep::StateFile;
use crate::supervisor::Spawner;
use admission::Admission;
use trim::Connections;
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
    /// Serve HTTPS with this certificate (`--tls-cert-file`, `--tls-key-file`); plain HTTP when
    /// `None`.
    pub tls: Option<Arc<tls::TlsCertificate>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            state_dir: None,
            state_key: "corral".into(),
            drain_timeout: Duration::from_secs(30),
            source_env: Vec::new(),
            tls: None,
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
    let loopback = listener.local_addr()?.ip().to_canonical().is_loopback();
    let mut server = Server::start(config, logs, opts, loopback)?;
    loop {
        let (stream, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = abort.cancelled() => break,
            Some(reload) = reloads.recv() => {
                server.reload(reload);
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
        server.accept(stream, remote);
    }
    drop(listener);
    server.shut_down(&abort).await;
    Ok(())
}

/// A running corral: its fleet, the service for the config in force, the serving threads and
/// the tasks beside them, so that each step of a run (start, reload, accept, shut down) is one
/// method.
struct Server {
    fleet: Fleet,
    metrics: Arc<Metrics>,
    /// The service first built; every reloaded one shares its `closing` token.
    app: Arc<App>,
    /// The service for the config in force, as the serving threads read it.
    current: Arc<RwLock<Arc<App>>>,
    admission: Arc<Admission>,
    refusals: Refusals,
    connections: Arc<Connections>,
    workers: Workers,
    /// `hooks.on_startup.preload`, started again by each reload.
    preload: JoinHandle<()>,
    /// Tasks that run until shutdown: the TTL timer, the device refresh, the reaper and the
    /// connection trimmer.
    background: Vec<AbortHandle>,
}

impl Server {
    /// Opens the activity log, sweeps what a previous run left, then starts the fleet, the
    /// serving threads and the tasks beside them. The log comes first: a store another corral
    /// holds, or one that cannot be used, stops this one before it touches anything.
    fn start(
        config: Config,
        logs: Arc<Logs>,
        opts: Options,
        loopback: bool,
    ) -> std::io::Result<Server> {
        let activity = crate::observe::activity::Activity::for_config(&config)
            .map_err(std::io::Error::other)?;
        let state_file = StateFile::new(opts.state_dir.clone(), &opts.state_key);
        let swept = state_file.sweep();
        if !swept.is_empty() {
            tracing::warn!("killed process groups left by a previous run: {swept:?}");
        }
        let tls = opts.tls.as_ref().map(|t| t.acceptor()).transpose();
        let tls = tls.map_err(std::io::Error::other)?;
        let settings = config.server.clone();
        let admission = Admission::new(max_connections(&settings));
        let (fleet, metrics) = start_fleet(config, logs.clone(), state_file, &opts.source_env)?;
        let mut limits = opts.limits;
        if let Some(n) = settings.max_buffered_bodies {
            limits.buffered_bytes = n;
        }
        let mut app = App::with_activity(fleet.clone(), logs, metrics.clone(), limits, activity);
        app.listening_on_loopback(loopback);
        let app = Arc::new(app);
        let current = Arc::new(RwLock::new(app.clone()));
        let mut background = fleet_tasks(&fleet);
        let preload = tokio::spawn(preload(fleet.clone()));
        let connections = Arc::new(Connections::default());
        background.push(tokio::spawn(trim::run(connections.clone())).abort_handle());
        let shared = workers::Shared {
            current: current.clone(),
            settings,
            tls,
        };
        let workers = Workers::start(workers::count(), shared, opts.drain_timeout)?;
        Ok(Server {
            fleet,
            metrics,
            app,
            current,
            admission,
            refusals: Refusals::default(),
            connections,
            workers,
            preload,
            background,
        })
    }

    /// Applies a reloaded config, or keeps the running one when it could not be loaded or
    /// cannot be applied live.
    fn reload(&mut self, reload: Reload) {
        let running = self.fleet.config();
        match reload.and_then(|next| crate::config::reload_guard::check(&running, next)) {
            Ok(config) => {
                self.fleet.reconfigure(Arc::new(config));
                let next = Arc::new(
                    self.current
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .reloaded(),
                );
                let old = std::mem::replace(
                    &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
                    next,
                );
                old.replaced.cancel();
                self.metrics
                    .config_reloads
                    .with_label_values(&["success"])
                    .inc();
                self.metrics.register_instances(&self.fleet.snapshot());
                self.preload.abort();
                self.preload = tokio::spawn(preload(self.fleet.clone()));
                tracing::info!("config reloaded");
            }
            Err(why) => {
                self.metrics
                    .config_reloads
                    .with_label_values(&["failure"])
                    .inc();
                tracing::warn!("config reload failed, keeping the running config: {why}");
            }
        }
    }

    /// Hands an accepted connection to a serving thread, or refuses it at the cap.
    fn accept(&mut self, stream: TcpStream, remote: SocketAddr) {
        let Some(admitted) = self.admission.admit() else {
            self.refusals.refused(self.admission.max());
            return;
        };
        self.workers
            .dispatch(stream, remote, self.connections.opened(), admitted);
    }

    /// Drains the open connections and stops every child; `abort` cuts that short and kills
    /// the children at once.
    async fn shut_down(self, abort: &CancellationToken) {
        let Server {
            fleet,
            app,
            mut workers,
            preload,
            background,
            ..
        } = self;
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
        for task in background {
            task.abort();
        }
        preload.abort();
    }
}

/// The fleet under `config`, with the metrics that count its work and its downloads.
fn start_fleet(
    config: Config,
    logs: Arc<Logs>,
    state_file: StateFile,
    source_env: &[(String, String)],
) -> std::io::Result<(Fleet, Arc<Metrics>)> {
    let spawner = Spawner::start(tokio::runtime::Handle::current())?;
    let metrics = Arc::new(Metrics::new());
    let fetcher = fetcher(source_env);
    metrics.register(Box::new(fetcher.download_bytes()));
    let fleet = Fleet::new(
        Arc::new(config),
        spawner,
        logs,
        metrics.fleet.clone(),
        state_file,
        fetcher,
    );
    metrics.register_instances(&fleet.snapshot());
    Ok((fleet, metrics))
}

/// The fleet's own tasks: the TTL timer, the device refresh and, where needed, the reaper of
/// orphaned children.
fn fleet_tasks(fleet: &Fleet) -> Vec<AbortHandle> {
    let mut tasks = vec![
        tokio::spawn(fleet.clone().run_ttl()).abort_handle(),
        tokio::spawn(fleet.clone().run_device_refresh()).abort_handle(),
    ];
    if crate::supervisor::reaper::needed() {
        tasks.push(tokio::spawn(crate::supervisor::reaper::run()).abort_handle());
    }
    tasks
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
        .unwrap_or_else(|| admission::default_max(crate::server::fdlimit::current()));
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
