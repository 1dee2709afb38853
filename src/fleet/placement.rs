//! Device-memory placement carried out: the make-room plan (`room_plan.rs`) made from the fleet's
//! state and applied to it, and telling whether an instance could run without evicting anything.

use super::phase::Rest;
use super::prepare::{load_of, Prepared};
use super::room_plan::{holders_of, plan_room, Ask, Occupant, RoomPlan};
use super::sleep::residue;
use super::{host_room, ledger, Fleet, State, StopReason};
use crate::config::catalog::swap;

impl Fleet {
    /// Finds room for `id` on its devices (where configured) and in host memory, or says why
    /// not; `None` means it may start (placed, or with nothing to place).
    pub(super) fn make_room(&self, st: &mut State, id: &str) -> Option<Prepared> {
        match room_for(st, id) {
            RoomPlan::Unplaced => self.make_host_room(st, id),
            RoomPlan::Place(on) => {
                let blocked = self.make_host_room(st, id);
                if blocked.is_none() {
                    st.instances.get_mut(id).expect("known").placed = on;
                }
                blocked
            }
            RoomPlan::Evict(victims) => {
                let grace = st.config.health_check_timeout;
                for v in victims {
                    tracing::info!(instance = %v, "making room for {id}");
                    self.put_away(st, &v, grace, StopReason::Memory);
                }
                Some(Prepared::Waiting)
            }
            RoomPlan::Wait => Some(Prepared::Waiting),
            RoomPlan::NoRoom(why) => Some(Prepared::NoRoom(why)),
            RoomPlan::NeverFits(why) => Some(Prepared::NeverFits(why)),
        }
    }

    /// Places `id` where it fits beside what runs now, stopping nothing; false when it does not
    /// fit so (or must wait for memory on its way back).
    pub(super) fn place_beside(&self, st: &mut State, id: &str) -> bool {
        if !host_room::fits_beside(st, id) {
            return false;
        }
        match room_for(st, id) {
            RoomPlan::Unplaced => true,
            RoomPlan::Place(on) => {
                st.instances.get_mut(id).expect("known").placed = on;
                true
            }
            _ => false,
        }
    }

    /// What every instance but `except` holds now, for the ledger.
    pub(super) fn holders(st: &State, except: Option<&str>) -> Vec<ledger::Holder> {
        holders_of(&occupants(st, except))
    }

    /// What others hold on each device, beside `id`: the other instances' charges and what
    /// other programs use.
    pub(super) fn held_beside(st: &State, id: &str) -> Vec<u64> {
        let holders = Self::holders(st, Some(id));
        (0..st.config.devices.len())
            .map(|d| {
                let outside = st.used_by_others.get(d).copied().unwrap_or(0);
                ledger::charged(&holders, d).saturating_add(outside)
            })
            .collect()
    }

    /// True when `id` could be served without evicting anything.
    pub(super) fn conflict_free(&self, st: &State, id: &str) -> bool {
        let running = st
            .instances
            .iter()
            .filter(|(_, i)| !i.phase.is_stopped() && !i.phase.is_asleep())
            .map(|(k, _)| k.as_str());
        swap::conflicts(&st.config, &st.catalog, id, running).is_empty()
    }
}

/// The make-room decision for `id` as the fleet stands. Before the first reading of what other
/// programs use on the GPUs, a placement would take their memory for free: it waits for that
/// reading (which wakes the fleet), unless the model is not placed or could never fit anyway.
fn room_for(st: &State, id: &str) -> RoomPlan {
    let plan = plan_for(st, id);
    let reading_due = st.reading_due && st.config.device_refresh.is_some();
    match plan {
        RoomPlan::Unplaced | RoomPlan::NeverFits(_) => plan,
        _ if reading_due => RoomPlan::Wait,
        _ => plan,
    }
}

/// The make-room decision for `id` on what is known of the devices now.
fn plan_for(st: &State, id: &str) -> RoomPlan {
    let inst = &st.instances[id];
    let pinned = devices_kept(st, id);
    let ask = Ask {
        id,
        need: &inst.need,
        pinned: pinned.as_deref().unwrap_or(&inst.model.memory.devices),
        pack: inst.model.memory.pack,
        sharding: super::pinning::sharding(&inst.spec.argv),
    };
    plan_room(
        &st.config.devices,
        &st.used_by_others,
        &ask,
        &occupants(st, Some(id)),
    )
}

/// The devices an asleep instance's process lives on, by name: a wake cannot move it.
fn devices_kept(st: &State, id: &str) -> Option<Vec<String>> {
    let inst = &st.instances[id];
    let on = ledger::devices_of(&inst.placed);
    let names = on.iter().filter_map(|d| st.config.devices.get(*d));
    let names: Vec<String> = names.map(|d| d.name.clone()).collect();
    (inst.phase.is_asleep() && !names.is_empty()).then_some(names)
}

/// What an asleep instance holds on its devices: what the GPUs were last read to show its engine
/// holding, else the fixed residue.
pub(super) fn asleep_charges(i: &super::instance::Instance) -> ledger::Charges {
    i.asleep_use.clone().unwrap_or_else(|| residue(&i.placed))
}

/// Every instance but `except`, as the make-room decision sees it: one falling asleep gives its
/// memory back soon, as a stopping one does, and an asleep one holds only its residue.
fn occupants(st: &State, except: Option<&str>) -> Vec<Occupant> {
    st.instances
        .values()
        .filter(|i| Some(&*i.id) != except)
        .map(|i| {
            let rest = i.phase.rest();
            let (placed, bytes) = match rest == Some(Rest::Asleep) {
                true => {
                    let residue = asleep_charges(i);
                    let bytes = residue.iter().map(|(_, b)| b).sum();
                    (residue, bytes)
                }
                false => (i.placed.clone(), i.need.bytes),
            };
            Occupant {
                id: i.id.to_string(),
                phase: i.phase.name(),
                load: load_of(st, &i.id),
                stopping: i.is_stopping() || rest == Some(Rest::Falling),
                placed,
                bytes,
                last_used: i.last_used,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::fleet::testing::{config, fleet_of};

    /// A 24 GiB device read every second, as `devices: auto` sets it up, and a 10 GiB model.
    fn refreshed_fleet() -> Fleet {
        let mut c = (*config(
            "devices:\n  - {name: cuda0, capacity: 24GiB}\nmodels:\n  m:\n    cmd: srv --port ${PORT}\n    memory: 10GiB\n",
        ))
        .clone();
        c.device_refresh = Some(Duration::from_secs(1));
        fleet_of(Arc::new(c))
    }

    #[tokio::test]
    async fn a_placement_waits_for_the_first_device_reading() {
        let fleet = refreshed_fleet();
        assert!(matches!(room_for(&fleet.inner.lock(), "m"), RoomPlan::Wait));
        fleet.note_outside_use(vec![20 << 30]);
        assert!(matches!(
            room_for(&fleet.inner.lock(), "m"),
            RoomPlan::NoRoom(_)
        ));
        fleet.note_outside_use(vec![0]);
        assert!(matches!(
            room_for(&fleet.inner.lock(), "m"),
            RoomPlan::Place(_)
        ));
    }

    #[tokio::test]
    async fn a_failed_reading_lets_placements_go_ahead() {
        let fleet = refreshed_fleet();
        fleet.reading_done();
        assert!(matches!(
            room_for(&fleet.inner.lock(), "m"),
            RoomPlan::Place(_)
        ));
    }
}
