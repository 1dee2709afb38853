//! Every instance's state, and the one place that decides to start, stop or wait.
//!
//! Theory of operation: the state of all instances sits behind one mutex. A request calls
//! [`Fleet::acquire`], which loops: under the lock it looks at the target and the swap rules, and
//! either takes a lease (the target is ready and nothing conflicts), orders stops and a start, or
//! waits for the next change. Decisions are made under the lock, so a model is started once however
//! many requests arrive together, and an instance with admitted requests (waiting or in flight) is
//! never chosen for eviction. Each started instance gets a task that owns its process for its whole
//! life and publishes its phase changes back into the state.

pub mod swap;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{watch, Notify};

use crate::config::{Config, ModelConfig};
use crate::error::Error;
use crate::logs::{LogRing, Logs};
use crate::supervisor::sweep::StateFile;
use crate::supervisor::{HealthClient, Process, ProcessSpec, Sinks, Spawner, StartError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Stopped,
    Starting,
    Ready,
    Stopping,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
        }
    }
}

/// Why an instance is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Ttl,
    Swap,
    Unload,
    Shutdown,
}

#[derive(Debug, Clone, Copy)]
struct StopOrder {
    grace: Duration,
    reason: StopReason,
}

struct Instance {
    model: Arc<ModelConfig>,
    spec: ProcessSpec,
    logs: Arc<LogRing>,
    phase: Phase,
    /// Requests admitted for this instance: waiting for it or in flight on it.
    reserved: usize,
    in_flight: usize,
    last_used: Instant,
    /// Counts starts, so a waiter can tell that the start it waited for failed.
    generation: u64,
    last_error: Option<(u64, Arc<StartError>)>,
    pid: Option<u32>,
    stop: Option<watch::Sender<Option<StopOrder>>>,
}

/// One model's state, as `/running` and the events show it.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub model: String,
    pub state: Phase,
    pub in_flight: usize,
    pub pid: Option<u32>,
}

struct Inner {
    config: Arc<Config>,
    state: Mutex<BTreeMap<String, Instance>>,
    changed: Notify,
    spawner: Spawner,
    health: HealthClient,
    logs: Arc<Logs>,
    state_file: StateFile,
    shutting_down: AtomicBool,
}

/// The models corral runs. Cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

impl Fleet {
    pub fn new(
        config: Arc<Config>,
        spawner: Spawner,
        logs: Arc<Logs>,
        state_file: StateFile,
    ) -> Fleet {
        let instances = config
            .models
            .values()
            .map(|m| {
                let spec = ProcessSpec {
                    id: m.id.clone(),
                    argv: m.argv.clone(),
                    env: m.env.clone(),
                    cmd_stop: m.cmd_stop.clone(),
                    health_url: m.check_endpoint.as_ref().and_then(|p| {
                        format!("{}{}", m.proxy.trim_end_matches('/'), p)
                            .parse()
                            .ok()
                    }),
                    load_timeout: config.health_check_timeout,
                };
                let instance = Instance {
                    model: Arc::new(m.clone()),
                    spec,
                    logs: Arc::new(LogRing::default()),
                    phase: Phase::Stopped,
                    reserved: 0,
                    in_flight: 0,
                    last_used: Instant::now(),
                    generation: 0,
                    last_error: None,
                    pid: None,
                    stop: None,
                };
                (m.id.clone(), instance)
            })
            .collect();
        let inner = Inner {
            config,
            state: Mutex::new(instances),
            changed: Notify::new(),
            spawner,
            health: HealthClient::default(),
            logs,
            state_file,
            shutting_down: AtomicBool::new(false),
        };
        Fleet {
            inner: Arc::new(inner),
        }
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.inner.config
    }

    /// The log ring of one model's process output.
    pub fn model_logs(&self, id: &str) -> Option<Arc<LogRing>> {
        self.inner.lock().get(id).map(|i| i.logs.clone())
    }

    /// Waits for a lease on a ready instance of model `id` (a configured id, not an alias).
    pub async fn acquire(&self, id: &str) -> Result<Lease, Error> {
        let reservation = self.reserve(id)?;
        let mut awaited: Option<u64> = None;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.inner.lock();
                if self.inner.shutting_down.load(Ordering::SeqCst) {
                    return Err(Error::ShuttingDown(id.to_string()));
                }
                if let Some(err) = failed_start(&state[id], awaited) {
                    return Err(err);
                }
                let running: Vec<&str> = state
                    .iter()
                    .filter(|(_, i)| i.phase != Phase::Stopped)
                    .map(|(k, _)| k.as_str())
                    .collect();
                let conflicts = swap::conflicts(&self.inner.config, id, running);
                if state[id].phase == Phase::Ready && conflicts.is_empty() {
                    let inst = state.get_mut(id).expect("known model");
                    inst.in_flight += 1;
                    return Ok(reservation.into_lease(inst.model.clone()));
                }
                let busy = conflicts.iter().any(|c| state[c].reserved > 0);
                if !busy {
                    for c in &conflicts {
                        let grace = self.inner.config.health_check_timeout;
                        order_stop(
                            state.get_mut(c).expect("known model"),
                            grace,
                            StopReason::Swap,
                        );
                    }
                    let all_stopped = conflicts.iter().all(|c| state[c].phase == Phase::Stopped);
                    let inst = state.get_mut(id).expect("known model");
                    match inst.phase {
                        Phase::Stopped if all_stopped => awaited = Some(self.start(id, inst)),
                        Phase::Starting if awaited.is_none() => awaited = Some(inst.generation),
                        _ => {}
                    }
                }
            }
            notified.await;
        }
    }

    fn reserve(&self, id: &str) -> Result<Reservation, Error> {
        let mut state = self.inner.lock();
        let inst = state.get_mut(id).ok_or(Error::UnknownModel)?;
        if inst.reserved >= inst.model.concurrency_limit {
            return Err(Error::ConcurrencyLimit);
        }
        inst.reserved += 1;
        Ok(Reservation {
            inner: self.inner.clone(),
            id: id.to_string(),
            done: false,
        })
    }

    /// Marks the instance starting and hands its life to a task. Returns the new generation.
    fn start(&self, id: &str, inst: &mut Instance) -> u64 {
        inst.generation += 1;
        inst.phase = Phase::Starting;
        let (tx, rx) = watch::channel(None);
        inst.stop = Some(tx);
        let generation = inst.generation;
        let spec = inst.spec.clone();
        let sinks = Sinks {
            model: inst.logs.clone(),
            logs: self.inner.logs.clone(),
            upstream_to_stdout: self.inner.config.log_to_stdout.upstream(),
        };
        tracing::info!(model = id, "starting: {}", spec.argv.join(" "));
        tokio::spawn(run_instance(
            self.inner.clone(),
            spec,
            sinks,
            generation,
            rx,
        ));
        self.inner.changed.notify_waiters();
        generation
    }

    /// Stops the given models (all when `None`) with their unload timeouts and waits until they are stopped.
    pub async fn unload(&self, ids: Option<&[String]>) {
        let targets: Vec<String> = {
            let mut state = self.inner.lock();
            let targets: Vec<String> = state
                .keys()
                .filter(|k| ids.is_none_or(|ids| ids.contains(k)))
                .cloned()
                .collect();
            for id in &targets {
                let inst = state.get_mut(id).expect("listed model");
                let grace = inst.model.unload_timeout;
                order_stop(inst, grace, StopReason::Unload);
            }
            targets
        };
        self.wait_stopped(&targets).await;
    }

    /// Stops everything for shutdown; new requests are refused from now on.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let all: Vec<String> = {
            let mut state = self.inner.lock();
            for inst in state.values_mut() {
                let grace = inst.model.unload_timeout;
                order_stop(inst, grace, StopReason::Shutdown);
            }
            state.keys().cloned().collect()
        };
        self.inner.changed.notify_waiters();
        self.wait_stopped(&all).await;
    }

    /// SIGKILLs every process group at once (a second shutdown signal).
    pub fn kill_all(&self) {
        for inst in self.inner.lock().values() {
            if let Some(pid) = inst.pid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    async fn wait_stopped(&self, ids: &[String]) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ids
                .iter()
                .all(|id| self.inner.lock()[id].phase == Phase::Stopped)
            {
                return;
            }
            notified.await;
        }
    }

    /// Unloads ready models idle for longer than their TTL. Runs until the fleet is dropped.
    pub async fn run_ttl(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let mut state = self.inner.lock();
            for (id, inst) in state.iter_mut() {
                let Some(ttl) = inst.model.ttl else { continue };
                if inst.phase == Phase::Ready
                    && inst.reserved == 0
                    && inst.last_used.elapsed() >= ttl
                {
                    tracing::info!(model = %id, "Unloading model, TTL of {}s reached", ttl.as_secs());
                    let grace = inst.model.unload_timeout;
                    order_stop(inst, grace, StopReason::Ttl);
                }
            }
        }
    }

    pub fn snapshot(&self) -> Vec<Snapshot> {
        self.inner
            .lock()
            .iter()
            .map(|(id, i)| Snapshot {
                model: id.clone(),
                state: i.phase,
                in_flight: i.in_flight,
                pid: i.pid,
            })
            .collect()
    }

    pub fn phase(&self, id: &str) -> Option<Phase> {
        self.inner.lock().get(id).map(|i| i.phase)
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Instance>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut Instance)) {
        if let Some(inst) = self.lock().get_mut(id) {
            f(inst);
        }
        self.changed.notify_waiters();
    }
}

fn failed_start(inst: &Instance, awaited: Option<u64>) -> Option<Error> {
    let awaited = awaited?;
    match &inst.last_error {
        Some((generation, err)) if *generation == awaited && inst.phase == Phase::Stopped => {
            Some(match **err {
                StartError::Aborted => Error::Unloaded,
                ref e => Error::StartFailed(e.to_string()),
            })
        }
        _ => None,
    }
}

fn order_stop(inst: &mut Instance, grace: Duration, reason: StopReason) {
    if matches!(inst.phase, Phase::Starting | Phase::Ready) {
        if let Some(stop) = &inst.stop {
            if stop.borrow().is_none() {
                let _ = stop.send(Some(StopOrder { grace, reason }));
            }
        }
    }
}

/// Owns one started process from spawn to reap.
async fn run_instance(
    inner: Arc<Inner>,
    spec: ProcessSpec,
    sinks: Sinks,
    generation: u64,
    mut stop: watch::Receiver<Option<StopOrder>>,
) {
    let id = spec.id.clone();
    let started = Instant::now();
    let fail = |err: StartError| {
        tracing::warn!(model = %id, "start failed: {err}");
        inner.update(&id, |i| {
            i.phase = Phase::Stopped;
            i.pid = None;
            i.stop = None;
            i.last_error = Some((generation, Arc::new(err)));
        });
    };
    let process =
        match Process::spawn(&inner.spawner, &spec, sinks, &inner.state_file.marker()).await {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
    inner.state_file.record(process.pid);
    inner.update(&id, |i| i.pid = Some(process.pid));
    let ready = tokio::select! {
        r = process.wait_ready(&spec, &inner.health) => r,
        order = next_order(&mut stop) => {
            process.stop(&spec, order.grace, &inner.spawner).await;
            Err(StartError::Aborted)
        }
    };
    if let Err(e) = ready {
        process
            .stop(&spec, Duration::from_secs(5), &inner.spawner)
            .await;
        return fail(e);
    }
    tracing::info!(model = %id, "ready in {:.2}s", started.elapsed().as_secs_f64());
    inner.update(&id, |i| {
        i.phase = Phase::Ready;
        i.last_used = Instant::now();
    });
    tokio::select! {
        status = process.exited() => {
            tracing::warn!(model = %id, "upstream process exited unexpectedly ({status})");
            process.stop(&spec, Duration::ZERO, &inner.spawner).await;
        }
        order = next_order(&mut stop) => {
            inner.update(&id, |i| i.phase = Phase::Stopping);
            tracing::info!(model = %id, "stopping ({:?})", order.reason);
            process.stop(&spec, order.grace, &inner.spawner).await;
        }
    }
    inner.update(&id, |i| {
        i.phase = Phase::Stopped;
        i.pid = None;
        i.stop = None;
    });
}

async fn next_order(stop: &mut watch::Receiver<Option<StopOrder>>) -> StopOrder {
    loop {
        if let Some(order) = *stop.borrow_and_update() {
            return order;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// An admitted request that has no instance yet; dropping it gives the admission back.
struct Reservation {
    inner: Arc<Inner>,
    id: String,
    done: bool,
}

impl Reservation {
    fn into_lease(mut self, model: Arc<ModelConfig>) -> Lease {
        self.done = true;
        Lease {
            inner: self.inner.clone(),
            id: std::mem::take(&mut self.id),
            model,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            self.inner.update(&self.id, |i| i.reserved -= 1);
        }
    }
}

/// A request's hold on a ready instance. It lives in the response body, so the instance counts as
/// busy until the last byte is sent or the client goes away.
pub struct Lease {
    inner: Arc<Inner>,
    id: String,
    pub model: Arc<ModelConfig>,
}

impl Lease {
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.update(&self.id, |i| {
            i.in_flight -= 1;
            i.reserved -= 1;
            i.last_used = Instant::now();
        });
    }
}
