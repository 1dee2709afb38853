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
//!
//! The files: `acquire.rs` (a request for one instance) and `pool.rs` (for a pool, its queue in
//! `queue.rs`), `prepare.rs` (what each try decides), `placement.rs` and `ledger/` (device
//! memory), `host_room.rs` (host memory), `start.rs`, `stop.rs`, `eject.rs`, `reload.rs`, `sleep.rs` (sleep instead of a stop,
//! and the wake; the task's side in `rest.rs`), and `snapshot.rs` with `queries.rs`
//! for what the outside reads. Decisions are pure plans over views of the state, carried out by
//! those files: `swap_plan.rs` (which instances a swap stops), `room_plan.rs` (where memory goes
//! and what stops for it), `grow_plan.rs` (which pool members start). `instance.rs` is an
//! instance's state, its `phase.rs` what only one phase has (stop channel, download, process).

mod acquire;
mod build;
mod changes;
pub mod counters;
mod eject;
mod gpu_use;
mod grow_plan;
mod host_room;
pub mod instance;
mod keep_alive;
mod lease;
pub mod ledger;
pub mod lifecycle;
mod oom;
mod outside;
mod phase;
pub mod pick;
mod pinning;
mod placement;
mod pool;
pub mod prefix;
mod prepare;
mod queries;
mod queue;
mod readback;
mod reload;
mod rest;
mod room_plan;
mod run;
mod sleep;
mod snapshot;
mod start;
mod stop;
mod stopping;
mod swap_plan;
#[cfg(test)]
mod testing;
mod weights;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

pub use counters::FleetCounters;
pub use instance::Retire;
pub use instance::StopReason;
pub use lease::Lease;
pub use phase::Download;
use phase::Phase;
pub use phase::PhaseName;
pub use snapshot::{device_totals, Snapshot};

use crate::config::catalog::Catalog;
use crate::config::{Config, PoolSettings};
use crate::logs::Logs;
use crate::supervisor::sweep::StateFile;
use crate::supervisor::{HealthClient, Spawner};
use build::{build_instances, build_pools};
use instance::Instance;

struct PoolState {
    members: Vec<String>,
    settings: PoolSettings,
    queue: queue::Queue,
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
    /// True until the device refresh has read the devices once (since it was last turned on):
    /// until then `used_by_others` says nothing, and placement waits for the reading.
    reading_due: bool,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    changed: changes::Changes,
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
            reading_due: true,
            config,
            catalog,
        };
        let inner = Inner {
            state: Mutex::new(state),
            changed: changes::Changes::default(),
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
    fn release(&self, id: &Arc<str>, f: impl FnOnce(&mut Instance)) {
        if let Some(inst) = holder(&mut self.lock(), id) {
            f(inst);
        }
        self.changed.notify_waiters_if_any();
    }

    /// Gives back a reservation (see `release`), and tells watchers: its count is shown.
    fn unreserve(&self, id: &Arc<str>) {
        if let Some(inst) = holder(&mut self.lock(), id) {
            inst.reserved -= 1;
        }
        self.touch();
    }

    /// Wakes waiters and tells watchers (events, metrics) that something changed.
    fn touch(&self) {
        self.changed.notify_waiters();
        self.generation.send_modify(|g| *g += 1);
    }
}

/// The instance a hold was taken on, if it is still in the fleet. A hold names its instance by
/// the very `Arc` of its id: a successor a reload put in its place keeps that `Arc` (and the
/// holds' counts), while a model removed and later added back under the same id gets a new one,
/// so a hold on the removed instance is never given back to the new.
fn holder<'a>(st: &'a mut State, id: &Arc<str>) -> Option<&'a mut Instance> {
    st.instances
        .get_mut(&**id)
        .filter(|inst| Arc::ptr_eq(&inst.id, id))
}
