//! Where the fleet puts an idle instance to sleep instead of stopping it, and wakes it for a
//! request. A sleep is chosen only for an idle, ready, sleep-capable instance outside a pool, and
//! only where the host has room for what the sleep keeps there (level 1: its weights), stopping
//! older sleepers for that room; anything else is stopped as before. While it sleeps, its device
//! charge drops to a residue (see `placement.rs`).

use std::time::Duration;

use super::ledger::host::{make_host_room, Sleeper};
use super::phase::Rest;
use super::prepare::busy;
use super::{Fleet, Retire, State, StopReason};
use crate::config::sleep::SLEEP_RESIDUE;

impl Fleet {
    /// Takes `id` off its device for `reason` (a swap, memory): to sleep where it can, else it
    /// is stopped.
    pub(super) fn put_away(&self, st: &mut State, id: &str, grace: Duration, reason: StopReason) {
        let Some(room) = may_sleep(st, id).then(|| host_room_for(st, id)).flatten() else {
            st.instances[id].order_stop(grace, reason);
            return;
        };
        for old in room {
            tracing::info!(instance = %old, "stopping a sleeper to make host room for {id}");
            st.instances[&old].order_stop(grace, StopReason::Memory);
        }
        tracing::info!(instance = id, "putting to sleep ({reason:?})");
        let inst = st.instances.get_mut(id).expect("known");
        inst.phase.fall_asleep();
        inst.rest.send_replace(true);
        self.inner.touch();
    }

    /// Wakes an asleep instance for a request; the generation of its run, which the request waits
    /// on as on a start.
    pub(super) fn wake(&self, st: &mut State, id: &str) -> u64 {
        let inst = st.instances.get_mut(id).expect("known");
        tracing::info!(instance = id, "waking");
        inst.phase.rest_step(Rest::Waking);
        inst.rest.send_replace(false);
        self.inner.touch();
        inst.generation
    }
}

/// An instance that may be put to sleep now: its model sleeps, it is ready and idle, outside a
/// pool and not being replaced by a reload.
fn may_sleep(st: &State, id: &str) -> bool {
    let inst = &st.instances[id];
    inst.model.sleep.is_some()
        && inst.pool.is_none()
        && inst.retire == Retire::No
        && inst.phase.is_ready()
        && inst.in_flight == 0
        && !busy(st, id)
}

/// The sleepers to stop so that `id`'s sleep fits in host memory (none for a sleep that keeps
/// nothing there); `None` when it does not fit.
fn host_room_for(st: &State, id: &str) -> Option<Vec<String>> {
    let need = host_charge(st, id);
    if need == 0 {
        return Some(Vec::new());
    }
    let sleepers = host_sleepers(st);
    let charged: u64 = sleepers.iter().map(|s| s.bytes).sum();
    let room = match st.config.host_memory {
        Some(limit) => limit.saturating_sub(charged),
        None => crate::memory::host::read().available,
    };
    make_host_room(room, need, &sleepers)
}

/// What `id` holds in host memory while it sleeps: its weights at level 1, nothing at level 2.
pub(super) fn host_charge(st: &State, id: &str) -> u64 {
    let inst = &st.instances[id];
    match &inst.model.sleep {
        Some(spec) if spec.keeps_weights() => match inst.need.weights {
            0 => inst.need.bytes,
            weights => weights,
        },
        _ => 0,
    }
}

/// The sleeping instances that hold host memory (not told to stop).
pub(super) fn host_sleepers(st: &State) -> Vec<Sleeper> {
    st.instances
        .values()
        .filter(|i| i.phase.rest().is_some())
        .map(|i| Sleeper {
            id: i.id.to_string(),
            bytes: host_charge(st, &i.id),
            last_used: i.last_used,
        })
        .filter(|s| s.bytes > 0)
        .collect()
}

/// An asleep instance's device charges, cut down to the residue its engine keeps.
pub(super) fn residue(placed: &super::ledger::Charges) -> super::ledger::Charges {
    let share = SLEEP_RESIDUE / placed.len().max(1) as u64;
    placed.iter().map(|(d, b)| (*d, (*b).min(share))).collect()
}
