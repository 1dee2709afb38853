//! What the fleet shows of itself: a snapshot of every instance, as `/running`, the UI, the
//! metrics and the lifecycle events read it. Kept apart from the scheduling so the shape the
//! outside sees is in one place.

use serde::Serialize;

use super::ledger::Charges;
use super::placement::asleep_charges;
use super::{host_room, Download, Fleet, PhaseName, State};

/// One instance's state, as `/running` and the events show it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub instance: String,
    pub model: String,
    pub pool: Option<String>,
    pub state: PhaseName,
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
    /// Device memory charged while it runs: the estimate, or the engine's report once loaded;
    /// asleep, the residue its engine keeps.
    pub memory: u64,
    /// What the engine reported holding (asleep: what the GPUs were read to show it holding).
    pub measured: Option<u64>,
    /// Host memory it holds: what it keeps on the CPU, and asleep at level 1 its weights.
    pub host: u64,
    /// The devices it is charged on, by name, with the bytes placed on each.
    pub devices: Vec<(String, u64)>,
    pub load_deadline: std::time::Duration,
    /// Why its last start failed, when it did.
    pub last_error: Option<String>,
    /// Its weights' download, while one runs.
    pub download: Option<Download>,
    /// The command line of its process, while one runs.
    pub argv: Option<Vec<String>>,
    /// When it became ready, while it serves.
    #[serde(skip)]
    pub ready_since: Option<std::time::SystemTime>,
    /// The loading progress its engine last reported, while it starts.
    pub loading: Option<crate::supervisor::LoadingProgress>,
    /// A ready llama-server that put itself to sleep while idle (`is_sleeping` in its `/props`).
    pub engine_sleeping: bool,
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
        .filter(|s| s.state != PhaseName::Stopped)
        .fold((0, 0), |(c, m), s| {
            (
                c + share(s.memory, s),
                m + share(s.measured.unwrap_or(0), s),
            )
        })
}

/// Every instance's snapshot, under the lock the caller holds.
pub(super) fn snapshot_of(st: &State) -> Vec<Snapshot> {
    let devices = &st.config.devices;
    st.instances
        .values()
        .map(|i| Snapshot {
            instance: i.id.to_string(),
            model: i.model.id.to_string(),
            pool: i.pool.clone(),
            state: i.phase.name(),
            in_flight: i.in_flight,
            waiting: i.reserved.saturating_sub(i.in_flight),
            slots: i.slots,
            free: i.free_slots(),
            pid: i.phase.process().map(|p| p.pid),
            failures: i.failures,
            circuit_open: i.circuit_open(),
            memory: i.need.bytes,
            measured: i.measured,
            host: host_room::held(st, &i.id),
            devices: named(devices, &i.placed),
            load_deadline: i.spec.load_timeout,
            last_error: i.last_error.as_ref().map(|(_, e)| e.to_string()),
            download: i.phase.download().cloned(),
            argv: i.phase.process().map(|p| p.argv.clone()),
            ready_since: i.phase.ready_since(),
            loading: i.phase.loading().cloned(),
            engine_sleeping: i.engine_sleeping && i.phase.is_ready(),
        })
        .map(
            |snap| match st.instances[&*snap.instance].phase.is_asleep() {
                true => asleep(st, snap),
                false => snap,
            },
        )
        .collect()
}

/// Charges with their devices named.
fn named(devices: &[crate::config::Device], charges: &Charges) -> Vec<(String, u64)> {
    charges
        .iter()
        .filter_map(|(d, bytes)| Some((devices.get(*d)?.name.clone(), *bytes)))
        .collect()
}

/// An asleep instance's snapshot charged what it holds asleep: its residue on its devices.
fn asleep(st: &State, snap: Snapshot) -> Snapshot {
    let inst = &st.instances[&*snap.instance];
    let charges = asleep_charges(inst);
    Snapshot {
        memory: charges.iter().map(|(_, b)| b).sum(),
        measured: inst
            .asleep_use
            .as_ref()
            .map(|seen| seen.iter().map(|(_, b)| b).sum()),
        devices: named(&st.config.devices, &charges),
        ..snap
    }
}

impl Fleet {
    pub fn snapshot(&self) -> Vec<Snapshot> {
        snapshot_of(&self.inner.lock())
    }

    /// The loading progress an engine of the model last reported, while one starts.
    pub fn loading_of(&self, model: &str) -> Option<crate::supervisor::LoadingProgress> {
        let st = self.inner.lock();
        st.instances
            .values()
            .filter(|i| *i.model.id == *model)
            .find_map(|i| i.phase.loading().cloned())
    }

    /// The download of a model's weights, while one runs for any of its instances.
    pub fn download_of(&self, model: &str) -> Option<Download> {
        let st = self.inner.lock();
        st.instances
            .values()
            .filter(|i| *i.model.id == *model)
            .find_map(|i| i.phase.download().cloned())
    }
}
