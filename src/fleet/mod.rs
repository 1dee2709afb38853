//! Every instance's state, and the one place that decides to start, stop, pick or wait.
//!
//! Theory of operation: the state of all instances and pools sits behind one mutex. A request calls
//! [`Fleet::acquire`] with its [`Target`], which loops: under the lock it either takes a lease on a
//! ready instance, orders stops and a start, or waits for the next change (a `Notify`). Because
//! every decision is made under the lock, a model is started once however many requests arrive
//! together, a pick and its slot reservation are one step, and an instance with admitted requests is
//! never chosen for eviction. Each started instance gets a task ([`run::run`]) that owns its
//! process for its whole life and publishes phase changes back into the state.
//!
//! Pools (replicas of a role) keep a FIFO queue of tickets: a waiter may take a slot only while its
//! position is below the number of free slots, so slots go out in arrival order.

mod build;
pub mod counters;
mod gpu_use;
pub mod instance;
mod lease;
pub mod ledger;
pub mod lifecycle;
mod oom;
mod outside;
pub mod pick;
mod pinning;
mod placement;
mod pool;
pub mod prefix;
mod readback;
mod run;
pub mod swap;
mod weights;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{watch, Notify};

pub use build::Retire;
pub use counters::FleetCounters;
pub use instance::{Phase, StopReason};
pub use lease::Lease;

use crate::catalog::{Catalog, Target};
use crate::config::{Config, PoolSettings};
use crate::error::Error;
use crate::logs::{LogRing, Logs};
use crate::supervisor::sweep::StateFile;
use crate::supervisor::{HealthClient, Sinks, Spawner, StartError};
use build::{build_instances, build_pools, same_process};
use instance::Instance;
use lease::{Reservation, Turn};

struct PoolState {
    members: Vec<String>,
    settings: PoolSettings,
    queue: VecDeque<u64>,
    /// Which member last served each prompt block (used by `balance: prefix`).
    prefixes: prefix::PrefixMemory,
}

pub(crate) struct State {
    config: Arc<Config>,
    catalog: Arc<Catalog>,
    instances: BTreeMap<String, Instance>,
    pools: BTreeMap<String, PoolState>,
    /// Direct requests waiting for a swap, by arrival: (priority, instance).
    waiting: BTreeMap<u64, (i64, String)>,
    next_ticket: u64,
    picks: u64,
    /// Memory other programs use on each configured device, as nvidia-smi last said.
    used_by_others: Vec<u64>,
}

/// One instance's state, as `/running` and the events show it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub instance: String,
    pub model: String,
    pub pool: Option<String>,
    pub state: Phase,
    pub in_flight: usize,
    /// Requests admitted for this instance by its own id that are not in flight yet (waiting for
    /// its load, or for a swap); a pool's waiting requests are in its queue.
    pub waiting: usize,
    pub slots: usize,
    /// Slots a request could take now: neither corral's nor the engine's other clients' work.
    pub free: usize,
    pub pid: Option<u32>,
    pub failures: u32,
    pub circuit_open: bool,
    /// Device memory charged while it runs: the estimate, or the engine's report once loaded.
    pub memory: u64,
    pub measured: Option<u64>,
    /// The devices it is charged on, by name, with the bytes placed on each.
    pub devices: Vec<(String, u64)>,
    pub load_deadline: std::time::Duration,
    /// Why its last start failed, when it did.
    pub last_error: Option<String>,
    /// Its weights' download, while one runs.
    pub download: Option<Download>,
    /// The command line of its process, while one runs.
    pub argv: Option<Vec<String>>,
}

/// How far the download of an instance's weights has come.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Download {
    /// The file being received (a path in the repository, a layer, an object key).
    pub file: String,
    pub bytes: u64,
    pub total: Option<u64>,
    pub bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
}

/// What instances that are not stopped hold on one device: charged (the estimate, or the engine's
/// report once loaded) and measured, each instance's figure shared out in the proportions it was
/// placed with.
pub fn device_totals(snapshot: &[Snapshot], device: &str) -> (u64, u64) {
    let share = |bytes: u64, s: &Snapshot| {
        let placed: u64 = s.devices.iter().map(|(_, b)| b).sum();
        let here: u64 = s
            .devices
            .iter()
            .filter(|(n, _)| n == device)
            .map(|(_, b)| b)
            .sum();
        match placed {
            0 => 0,
            total => (u128::from(bytes) * u128::from(here) / u128::from(total)) as u64,
        }
    };
    snapshot
        .iter()
        .filter(|s| s.state != Phase::Stopped)
        .fold((0, 0), |(c, m), s| {
            (
                c + share(s.memory, s),
                m + share(s.measured.unwrap_or(0), s),
            )
        })
}

/// Server errors in a row after which a pool member is taken out (Envoy's outlier detection
/// default for consecutive 5xx).
pub const EJECT_AFTER_SERVER_ERRORS: u32 = 5;

pub(crate) struct Inner {
    state: Mutex<State>,
    changed: Notify,
    generation: watch::Sender<u64>,
    spawner: Spawner,
    health: HealthClient,
    logs: Arc<Logs>,
    counters: FleetCounters,
    state_file: StateFile,
    shutting_down: AtomicBool,
    /// Fetches models' weights from their sources before their engines start.
    fetcher: crate::sources::Fetcher,
    /// Each model's lifecycle status and the events that tell of its changes.
    pub(super) lifecycle: lifecycle::Lifecycle,
    /// The control runtime (the one the fleet was made on), where instances are supervised.
    runtime: tokio::runtime::Handle,
}

/// The instances corral runs. Cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

impl Fleet {
    pub fn new(
        config: Arc<Config>,
        spawner: Spawner,
        logs: Arc<Logs>,
        counters: FleetCounters,
        state_file: StateFile,
        fetcher: crate::sources::Fetcher,
    ) -> Fleet {
        let catalog = Arc::new(Catalog::new(&config));
        let instances = build_instances(&config, &catalog, &fetcher);
        let pools = build_pools(&config, &catalog, &mut BTreeMap::new());
        let state = State {
            instances,
            pools,
            waiting: BTreeMap::new(),
            next_ticket: 0,
            picks: 0,
            used_by_others: Vec::new(),
            config,
            catalog,
        };
        let inner = Inner {
            state: Mutex::new(state),
            changed: Notify::new(),
            generation: watch::channel(0).0,
            spawner,
            health: HealthClient::default(),
            logs,
            counters,
            state_file,
            shutting_down: AtomicBool::new(false),
            fetcher,
            lifecycle: lifecycle::Lifecycle::default(),
            runtime: tokio::runtime::Handle::current(),
        };
        let inner = Arc::new(inner);
        inner
            .runtime
            .spawn(lifecycle::follow(Arc::downgrade(&inner)));
        weights::size_before_download(&inner);
        Fleet { inner }
    }

    /// Applies a new config. Instances whose process would be the same keep running and serving;
    /// changed ones finish their requests and restart with the new command; removed ones stop
    /// once idle. Requests waiting in a pool that still exists keep their place.
    pub fn reconfigure(&self, config: Arc<Config>) {
        let catalog = Arc::new(Catalog::new(&config));
        let fresh = build_instances(&config, &catalog, &self.inner.fetcher);
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let mut kept = 0;
        for (id, new) in fresh {
            match st.instances.get_mut(&id) {
                Some(old) if same_process(&old.spec, &new.spec) => {
                    old.model = new.model;
                    old.pool = new.pool;
                    old.spec.load_timeout = new.spec.load_timeout;
                    old.spec.stall = new.spec.stall;
                    old.spec.extend_on_progress = new.spec.extend_on_progress;
                    if old.measured.is_none() {
                        old.need = new.need;
                    }
                    old.retire = Retire::No;
                    kept += 1;
                }
                Some(old) if old.phase == Phase::Stopped => *old = new,
                Some(old) => old.retire = Retire::Replace(Box::new(new)),
                None => {
                    st.instances.insert(id, new);
                }
            }
        }
        let known: std::collections::BTreeSet<String> = catalog.instances.keys().cloned().collect();
        st.instances
            .retain(|id, i| known.contains(id) || i.phase != Phase::Stopped);
        for (id, i) in st.instances.iter_mut() {
            if !known.contains(id) {
                i.retire = Retire::Remove;
            }
        }
        let mut old_pools = std::mem::take(&mut st.pools);
        st.pools = build_pools(&config, &catalog, &mut old_pools);
        st.config = config;
        st.catalog = catalog;
        tracing::info!("config applied: {kept} running or stopped instance(s) kept as they were");
        drop(guard);
        weights::size_before_download(&self.inner);
        self.inner.touch();
    }

    /// Stops retired instances once idle, and swaps in their successors once stopped.
    fn retire_idle(st: &mut State) {
        let ids: Vec<String> = st
            .instances
            .iter()
            .filter(|(_, i)| i.retire != Retire::No)
            .map(|(k, _)| k.clone())
            .collect();
        for id in ids {
            let idle = !busy(st, &id);
            let inst = st.instances.get_mut(&id).expect("listed");
            if inst.phase == Phase::Stopped {
                match std::mem::replace(&mut inst.retire, Retire::No) {
                    Retire::Replace(next) => *inst = *next,
                    Retire::Remove => {
                        st.instances.remove(&id);
                    }
                    Retire::No => {}
                }
            } else if idle {
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Reload);
            }
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner.lock().config.clone()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.inner.lock().catalog.clone()
    }

    /// The log ring of one instance's process output (the first replica's for a replicated model).
    pub fn instance_logs(&self, id: &str) -> Option<Arc<LogRing>> {
        let state = self.inner.lock();
        state
            .instances
            .get(id)
            .or_else(|| state.instances.get(&format!("{id}-0")))
            .map(|i| i.logs.clone())
    }

    /// Waits for a lease on a ready instance for `target`; `avoid` skips one pool member (a retry).
    pub async fn acquire(&self, target: &Target, avoid: Option<&str>) -> Result<Lease, Error> {
        self.acquire_for(target, avoid, None).await
    }

    /// As [`Fleet::acquire`], with the request's prompt blocks for a pool that balances by prefix.
    pub async fn acquire_for(
        &self,
        target: &Target,
        avoid: Option<&str>,
        prompt: Option<&prefix::Prefix>,
    ) -> Result<Lease, Error> {
        match target {
            Target::Instance(id) => self.acquire_instance(id).await,
            Target::Pool(id) => self.acquire_pool(id, avoid, prompt).await,
        }
    }

    async fn acquire_instance(&self, id: &str) -> Result<Lease, Error> {
        let reservation = self.reserve(id)?;
        // a place among swap waiters, taken only if the model is not ready at once
        let mut turn: Option<Turn> = None;
        let mut awaited: Option<u64> = None;
        // while memory is held by busy instances, wait at most the model's queue timeout
        let mut no_room: Option<(tokio::time::Instant, String)> = None;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.inner.lock();
                self.check_open(id)?;
                let Some(inst) = st.instances.get(id) else {
                    return Err(Error::UnknownModel); // removed by a reload while waiting
                };
                if let Some(err) = failed_start(inst, awaited) {
                    return Err(err);
                }
                if inst.phase == Phase::Stopped && inst.in_backoff() && awaited.is_none() {
                    return Err(backoff_error(inst));
                }
                if turn.is_none() && inst.phase != Phase::Ready {
                    turn = Some(self.take_turn(&mut st, id));
                }
                match self.prepare(&mut st, id, turn.as_ref().map(|t| t.seq)) {
                    Prepared::Ready => {
                        let inst = st.instances.get_mut(id).expect("known instance");
                        inst.in_flight += 1;
                        return Ok(reservation.into_lease(inst.proxy.clone()));
                    }
                    Prepared::Started(generation) => awaited = Some(generation),
                    Prepared::Starting(generation) if awaited.is_none() => {
                        awaited = Some(generation)
                    }
                    Prepared::NeverFits(why) => return Err(Error::InsufficientMemory(why)),
                    Prepared::NoRoom(why) => {
                        let limit = st.instances[id].model.pool.queue_timeout;
                        let since = no_room
                            .take()
                            .map_or_else(tokio::time::Instant::now, |(t, _)| t);
                        if since.elapsed() >= limit {
                            return Err(Error::InsufficientMemory(why));
                        }
                        no_room = Some((since, why));
                    }
                    _ => no_room = None,
                }
            }
            match &no_room {
                Some((since, _)) => {
                    let limit = self
                        .inner
                        .lock()
                        .instances
                        .get(id)
                        .map_or(Duration::ZERO, |i| i.model.pool.queue_timeout);
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(*since + limit) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Under the lock: is `id` ready with nothing to evict, or what must happen first.
    fn prepare(&self, st: &mut State, id: &str, turn: Option<u64>) -> Prepared {
        if st.instances[id].retire != Retire::No {
            Self::retire_idle(st);
            if st.instances[id].retire != Retire::No {
                return Prepared::Waiting;
            }
        }
        let running: Vec<&str> = st
            .instances
            .iter()
            .filter(|(_, i)| i.phase != Phase::Stopped)
            .map(|(k, _)| k.as_str())
            .collect();
        let conflicts = swap::conflicts(&st.config, &st.catalog, id, running);
        let phase = st.instances[id].phase;
        if phase == Phase::Ready && conflicts.is_empty() {
            return Prepared::Ready;
        }
        if conflicts.iter().any(|c| busy(st, c)) {
            return Prepared::Blocked;
        }
        if phase == Phase::Stopped && turn.is_some_and(|t| self.outranked(st, id, t)) {
            return Prepared::Waiting;
        }
        let grace = st.config.health_check_timeout;
        for c in &conflicts {
            st.instances
                .get_mut(c)
                .expect("known")
                .order_stop(grace, StopReason::Swap);
        }
        let all_stopped = conflicts
            .iter()
            .all(|c| st.instances[c].phase == Phase::Stopped);
        let inst = &st.instances[id];
        match phase {
            Phase::Stopped if all_stopped => match self.make_room(st, id) {
                Some(blocked) => blocked,
                None => Prepared::Started(self.start(st, id)),
            },
            Phase::Starting => Prepared::Starting(inst.generation),
            _ => Prepared::Waiting,
        }
    }

    fn check_open(&self, what: &str) -> Result<(), Error> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown(what.to_string()));
        }
        Ok(())
    }

    /// A place among the requests waiting for swaps, ranked by `fifo.priority`, then arrival.
    fn take_turn(&self, st: &mut State, id: &str) -> Turn {
        let priority = st.instances.get(id).map_or(0, |i| {
            let names = std::iter::once(&i.model.id).chain(i.model.aliases.iter());
            names
                .filter_map(|n| st.config.fifo_priority.get(n))
                .copied()
                .max()
                .unwrap_or(0)
        });
        st.next_ticket += 1;
        let seq = st.next_ticket;
        st.waiting.insert(seq, (priority, id.to_string()));
        Turn {
            inner: self.inner.clone(),
            seq,
        }
    }

    /// True when a request that ranks higher waits for a model that conflicts with `id`: it swaps first.
    fn outranked(&self, st: &State, id: &str, seq: u64) -> bool {
        let Some(&(mine, _)) = st.waiting.get(&seq) else {
            return false;
        };
        st.waiting.iter().any(|(other_seq, (prio, other))| {
            let ahead = *prio > mine || (*prio == mine && *other_seq < seq);
            ahead
                && other != id
                && st
                    .instances
                    .get(other)
                    .is_some_and(|o| o.phase != Phase::Ready)
                && !swap::conflicts(&st.config, &st.catalog, other, [id]).is_empty()
        })
    }

    fn reserve(&self, id: &str) -> Result<Reservation, Error> {
        let mut st = self.inner.lock();
        let inst = st.instances.get_mut(id).ok_or(Error::UnknownModel)?;
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
    fn start(&self, st: &mut State, id: &str) -> u64 {
        let inst = st.instances.get_mut(id).expect("known instance");
        inst.generation += 1;
        inst.phase = Phase::Starting;
        let (tx, rx) = watch::channel(None);
        inst.stop = Some(tx);
        let sinks = Sinks {
            model: inst.logs.clone(),
            logs: self.inner.logs.clone(),
            upstream_to_stdout: st.config.log_to_stdout.upstream(),
            redactor: st.config.redactor.clone(),
        };
        let poll = inst.pool.as_ref().and(inst.model.pool.slots_poll);
        let shown = st.config.redactor.command_line(&inst.spec.argv);
        tracing::info!(instance = id, "starting: {shown}");
        let mut spec = inst.spec.clone();
        let pins = pinning::visible_devices(
            &st.config.devices,
            &ledger::devices_of(&inst.placed),
            &spec.env,
            &spec.argv,
        );
        if !pins.is_empty() {
            tracing::info!(instance = id, "pinned to its devices: {pins:?}");
        }
        spec.env.extend(pins);
        let split = pinning::split_args(&spec.argv, &inst.placed);
        if !split.is_empty() {
            tracing::info!(instance = id, "split over its devices: {}", split.join(" "));
        }
        spec.argv.extend(split);
        // supervision runs on the control runtime, whichever thread's request started it
        self.inner.runtime.spawn(run::run(
            self.inner.clone(),
            spec,
            sinks,
            inst.generation,
            rx,
            poll,
        ));
        self.inner.touch();
        inst.generation
    }

    /// A pool member that could not be reached: stop it and count the failure, so the pool avoids it.
    pub fn report_unreachable(&self, id: &str) {
        let mut st = self.inner.lock();
        if let Some(inst) = st.instances.get_mut(id) {
            tracing::warn!(instance = id, "unreachable; taking it out of its pool");
            inst.order_stop(Duration::from_secs(1), StopReason::Unreachable);
        }
        drop(st);
        self.inner.touch();
    }

    /// Notes a pool member's answer. A member that answers server errors only (its health check
    /// passing while inference is broken) is taken out of its pool after
    /// [`EJECT_AFTER_SERVER_ERRORS`] in a row, as an unreachable one is: stopped, and started
    /// again only when demand needs it, after its backoff, unless no other member is ready.
    /// 503 (busy or loading) does not count.
    pub fn report_answer(&self, id: &str, status: http::StatusCode) {
        let broken = status.is_server_error() && status != http::StatusCode::SERVICE_UNAVAILABLE;
        let mut st = self.inner.lock();
        let Some(inst) = st.instances.get_mut(id) else {
            return;
        };
        if !broken {
            inst.server_errors = 0;
            return;
        }
        inst.server_errors += 1;
        if inst.server_errors < EJECT_AFTER_SERVER_ERRORS {
            return;
        }
        let Some(pool) = inst.pool.clone() else {
            return;
        };
        // never the last ready member: a client that keeps sending a request the engine answers
        // with 500 must not empty the pool
        let sibling_ready = st
            .instances
            .values()
            .any(|i| i.id != id && i.pool.as_ref() == Some(&pool) && i.phase == Phase::Ready);
        let Some(inst) = st.instances.get_mut(id) else {
            return;
        };
        if !sibling_ready {
            return;
        }
        inst.server_errors = 0;
        tracing::warn!(
            instance = id,
            "answered {EJECT_AFTER_SERVER_ERRORS} server errors in a row; taking it out of its pool"
        );
        inst.order_stop(Duration::from_secs(1), StopReason::Ejected);
        let model = inst.model.id.clone();
        drop(st);
        self.inner
            .counters
            .ejections
            .with_label_values(&[&model, id])
            .inc();
        self.inner.touch();
    }

    /// Stops the given models' instances (all when `None`) and waits until they are stopped.
    pub async fn unload(&self, models: Option<&[String]>) {
        let targets: Vec<String> = {
            let mut st = self.inner.lock();
            let targets: Vec<String> = st
                .instances
                .values()
                .filter(|i| models.is_none_or(|ms| ms.contains(&i.model.id) || ms.contains(&i.id)))
                .map(|i| i.id.clone())
                .collect();
            for id in &targets {
                let inst = st.instances.get_mut(id).expect("listed");
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Unload);
            }
            targets
        };
        self.wait_stopped(&targets).await;
    }

    /// Stops everything for shutdown; new requests are refused from now on.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let all: Vec<String> = {
            let mut st = self.inner.lock();
            for inst in st.instances.values_mut() {
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Shutdown);
            }
            st.instances.keys().cloned().collect()
        };
        self.inner.touch();
        self.wait_stopped(&all).await;
    }

    /// SIGKILLs every process group at once (a second shutdown signal).
    pub fn kill_all(&self) {
        for inst in self.inner.lock().instances.values() {
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
            if ids.iter().all(|id| {
                self.inner
                    .lock()
                    .instances
                    .get(id)
                    .is_none_or(|i| i.phase == Phase::Stopped)
            }) {
                return;
            }
            notified.await;
        }
    }

    /// Unloads ready instances idle for longer than their TTL. Runs until aborted.
    pub async fn run_ttl(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let mut st = self.inner.lock();
            let st = &mut *st;
            let retiring = st.instances.values().any(|i| i.retire != Retire::No);
            if retiring {
                Self::retire_idle(st);
            }
            for inst in st.instances.values_mut() {
                let Some(ttl) = inst.model.ttl else { continue };
                let queued = inst
                    .pool
                    .as_ref()
                    .is_some_and(|p| st.pools.get(p).is_some_and(|p| !p.queue.is_empty()));
                if inst.phase == Phase::Ready
                    && inst.reserved == 0
                    && inst.in_flight == 0
                    && !queued
                    && inst.last_used.elapsed() >= ttl
                {
                    tracing::info!(instance = %inst.id, "Unloading model, TTL of {}s reached", ttl.as_secs());
                    let grace = inst.model.unload_timeout;
                    inst.order_stop(grace, StopReason::Ttl);
                }
            }
        }
    }

    pub fn snapshot(&self) -> Vec<Snapshot> {
        snapshot_of(&self.inner.lock())
    }

    /// The download of a model's weights, while one runs for any of its instances.
    pub fn download_of(&self, model: &str) -> Option<Download> {
        let st = self.inner.lock();
        st.instances
            .values()
            .filter(|i| i.model.id == model)
            .find_map(|i| i.download.clone())
    }

    /// Each model's lifecycle status, by model id.
    pub fn statuses(&self) -> BTreeMap<String, lifecycle::Status> {
        let (snapshot, queues) = self.inner.statuses_input();
        lifecycle::statuses(&snapshot, &queues)
    }

    /// Lifecycle events as they happen.
    pub fn lifecycle_events(&self) -> tokio::sync::broadcast::Receiver<serde_json::Value> {
        self.inner.lifecycle.subscribe()
    }

    /// The most recent lifecycle events, oldest first.
    pub fn recent_lifecycle_events(&self) -> Vec<serde_json::Value> {
        self.inner.lifecycle.recent()
    }
}

fn snapshot_of(st: &State) -> Vec<Snapshot> {
    let devices = &st.config.devices;
    st.instances
        .values()
        .map(|i| Snapshot {
            instance: i.id.clone(),
            model: i.model.id.clone(),
            pool: i.pool.clone(),
            state: i.phase,
            in_flight: i.in_flight,
            waiting: i.reserved.saturating_sub(i.in_flight),
            slots: i.slots,
            free: i.free_slots(),
            pid: i.pid,
            failures: i.failures,
            circuit_open: i.circuit_open(),
            memory: i.need.bytes,
            measured: i.measured,
            devices: i
                .placed
                .iter()
                .filter_map(|(d, bytes)| Some((devices.get(*d)?.name.clone(), *bytes)))
                .collect(),
            load_deadline: i.spec.load_timeout,
            last_error: i.last_error.as_ref().map(|(_, e)| e.to_string()),
            download: i.download.clone(),
            argv: i.running_argv.clone(),
        })
        .collect()
}

impl Fleet {
    /// True when the target has a ready instance.
    pub fn is_ready(&self, target: &Target) -> bool {
        let st = self.inner.lock();
        match target {
            Target::Instance(id) => st
                .instances
                .get(id)
                .is_some_and(|i| i.phase == Phase::Ready),
            Target::Pool(p) => st.pools.get(p).is_some_and(|p| {
                p.members
                    .iter()
                    .any(|m| st.instances[m].phase == Phase::Ready)
            }),
        }
    }

    /// The base URL of a ready instance of the target, if there is one.
    pub fn ready_proxy(&self, target: &Target) -> Option<String> {
        let st = self.inner.lock();
        let members: Vec<&String> = match target {
            Target::Instance(id) => vec![id],
            Target::Pool(p) => st.pools.get(p)?.members.iter().collect(),
        };
        members
            .into_iter()
            .filter_map(|m| st.instances.get(m))
            .find(|i| i.phase == Phase::Ready)
            .map(|i| i.proxy.to_string())
    }

    /// A receiver that changes whenever any instance does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// Requests waiting in each pool's queue.
    pub fn queue_depths(&self) -> BTreeMap<String, usize> {
        self.inner
            .lock()
            .pools
            .iter()
            .map(|(k, p)| (k.clone(), p.queue.len()))
            .collect()
    }
}

enum Prepared {
    Ready,
    Started(u64),
    Starting(u64),
    Waiting,
    Blocked,
    /// Memory is held by busy instances; waiting may help.
    NoRoom(String),
    /// The model can never fit on the devices.
    NeverFits(String),
}

/// An instance that must not be evicted: it has requests in flight or waiting for it.
fn busy(st: &State, id: &str) -> bool {
    let i = &st.instances[id];
    let pool_waiting = i
        .pool
        .as_ref()
        .is_some_and(|p| st.pools.get(p).is_some_and(|p| !p.queue.is_empty()));
    i.in_flight > 0
        || i.reserved > 0
        || (pool_waiting && matches!(i.phase, Phase::Starting | Phase::Ready))
}

fn backoff_error(inst: &Instance) -> Error {
    let wait = inst.retry_at.map_or(0, |t| {
        t.saturating_duration_since(Instant::now()).as_secs() + 1
    });
    let last = inst
        .last_error
        .as_ref()
        .map(|(_, e)| format!("; last error: {e}"))
        .unwrap_or_default();
    let what = if inst.circuit_open() {
        "circuit open"
    } else {
        "backing off"
    };
    Error::Busy {
        status: 503,
        message: format!(
            "{} failed {} times in a row ({what}, next start in {wait}s){last}",
            inst.id, inst.failures
        ),
        retry_after: wait.max(1),
    }
}

fn failed_start(inst: &Instance, awaited: Option<u64>) -> Option<Error> {
    let awaited = awaited?;
    match &inst.last_error {
        Some((generation, err)) if *generation == awaited && inst.phase == Phase::Stopped => {
            Some(match **err {
                StartError::Aborted => Error::Unloaded,
                ref e @ StartError::Diagnosed {
                    out_of_memory: Some(_),
                    ..
                } => Error::InsufficientMemory(oom::insufficient(&inst.id, inst.need.bytes, e)),
                ref e => Error::StartFailed(e.to_string()),
            })
        }
        _ => None,
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut Instance)) {
        if let Some(inst) = self.lock().instances.get_mut(id) {
            f(inst);
        }
        self.touch();
    }

    /// Gives back a request's hold on an instance: wakes waiters for capacity, but tells no
    /// watcher, since no state they show has changed (this runs once per request).
    fn release(&self, id: &str, f: impl FnOnce(&mut Instance)) {
        if let Some(inst) = self.lock().instances.get_mut(id) {
            f(inst);
        }
        self.changed.notify_waiters();
    }

    /// A snapshot and each model's queued requests, what lifecycle statuses are computed from.
    fn statuses_input(&self) -> (Vec<Snapshot>, BTreeMap<String, usize>) {
        let st = self.lock();
        let queues = st
            .pools
            .values()
            .map(|p| {
                let model = st.instances[&p.members[0]].model.id.clone();
                (model, p.queue.len())
            })
            .collect();
        (snapshot_of(&st), queues)
    }

    /// Wakes waiters and tells watchers (events, metrics) that something changed.
    fn touch(&self) {
        self.changed.notify_waiters();
        self.generation.send_modify(|g| *g += 1);
    }
}
