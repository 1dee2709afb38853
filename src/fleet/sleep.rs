//! Where the fleet puts an idle instance to sleep instead of stopping it, and wakes it for a
//! request. A sleep is chosen only for an idle, ready, sleep-capable instance, and
//! only where the host has room for what the sleep keeps there (level 1: its weights), stopping
//! older sleepers for that room (`host_room.rs`); anything else is stopped as before. While it
//! sleeps, its device charge drops to what the GPUs are read to show its engine holding, else to
//! a fixed residue (see `placement.rs`).

use std::time::Duration;

use super::host_room::{held_asleep, plan_for, stop_sleepers};
use super::ledger::host::HostPlan;
use super::phase::Rest;
use super::prepare::busy;
use super::{Fleet, Retire, State, StopReason};
use crate::config::sleep::SLEEP_RESIDUE;

impl Fleet {
    /// Takes `id` off its device for `reason` (a swap, memory): to sleep where it can, else it
    /// is stopped.
    pub(super) fn put_away(&self, st: &mut State, id: &str, grace: Duration, reason: StopReason) {
        let room = may_sleep(st, id).then(|| host_room_for(st, id)).flatten();
        let Some(sleepers) = room else {
            st.instances[id].order_stop(grace, reason);
            return;
        };
        stop_sleepers(st, &sleepers, &format!("making host room for {id}'s sleep"));
        tracing::info!(instance = id, "putting to sleep ({reason:?})");
        let inst = st.instances.get_mut(id).expect("known");
        inst.phase.fall_asleep();
        inst.asleep_use = None;
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

/// An instance that may be put to sleep now: its model sleeps, it is ready and idle (a pool
/// member while its pool has no requests waiting) and not being replaced by a reload.
fn may_sleep(st: &State, id: &str) -> bool {
    let inst = &st.instances[id];
    inst.model.sleep.is_some()
        && inst.retire == Retire::No
        && inst.phase.is_ready()
        && inst.in_flight == 0
        && !busy(st, id)
}

/// The sleepers to stop so that what `id` keeps asleep fits in host memory (memory already on
/// its way back counts as free); `None` when it does not fit.
fn host_room_for(st: &State, id: &str) -> Option<Vec<String>> {
    match plan_for(st, id, held_asleep(st, id)) {
        HostPlan::Fits | HostPlan::Wait => Some(Vec::new()),
        HostPlan::Stop(sleepers) => Some(sleepers),
        HostPlan::Short(_) => None,
    }
}

/// An asleep instance's device charges, cut down to the residue its engine keeps.
pub(super) fn residue(placed: &super::ledger::Charges) -> super::ledger::Charges {
    let share = SLEEP_RESIDUE / placed.len().max(1) as u64;
    placed.iter().map(|(d, b)| (*d, (*b).min(share))).collect()
}
