//! Device-memory placement: finding room for an instance on the configured devices (evicting idle
//! holders when needed), and telling whether an instance could run without evicting anything.
//! Split out of `mod.rs` so the memory-eviction decisions sit in one place.

use super::prepare::{busy, Prepared};
use super::{ledger, swap, Fleet, Phase, State, StopReason};

impl Fleet {
    /// With devices configured, finds room for `id` or says why not; `None` means it is placed.
    pub(super) fn make_room(&self, st: &mut State, id: &str) -> Option<Prepared> {
        let devices = &st.config.devices.clone();
        let need = st.instances[id].need.bytes;
        if devices.is_empty() || need == 0 {
            return None;
        }
        let pinned: Vec<usize> = st.instances[id]
            .model
            .memory
            .devices
            .iter()
            .filter_map(|name| devices.iter().position(|d| &d.name == name))
            .collect();
        let holders = Self::holders(st, Some(id));
        let seen = ledger::less_outside_use(devices, &st.used_by_others);
        let outside = outside_use_note(devices, &st.used_by_others);
        let pack = st.instances[id].model.memory.pack;
        match ledger::place_by(&seen, need, &pinned, &holders, pack) {
            ledger::Placement::Fits(on) => {
                st.instances.get_mut(id).expect("known").placed = on;
                None
            }
            ledger::Placement::Evict(victims) => {
                for v in victims {
                    tracing::info!(instance = %v, "stopping to make room for {id}");
                    let inst = st.instances.get_mut(&v).expect("holder");
                    let grace = st.config.health_check_timeout;
                    inst.order_stop(grace, StopReason::Memory);
                }
                Some(Prepared::Waiting)
            }
            ledger::Placement::WaitForStops => Some(Prepared::Waiting),
            ledger::Placement::Blocked(why) => Some(Prepared::NoRoom(format!(
                "insufficient_memory: {id} needs {} ({}); {why}{outside}",
                crate::memory::format_bytes(need),
                st.instances[id].need.source
            ))),
            ledger::Placement::Never(why) => {
                let message = format!(
                    "insufficient_memory: {id} needs {} ({}) but {why}{outside}",
                    crate::memory::format_bytes(need),
                    st.instances[id].need.source
                );
                // other programs' use comes and goes: worth waiting for if it alone is in the way
                let without_them = ledger::place(devices, need, &pinned, &[]);
                Some(match without_them {
                    ledger::Placement::Never(_) => Prepared::NeverFits(message),
                    _ => Prepared::NoRoom(message),
                })
            }
        }
    }

    /// What every instance but `except` holds now, for the ledger.
    pub(super) fn holders(st: &State, except: Option<&str>) -> Vec<ledger::Holder> {
        st.instances
            .values()
            .filter(|i| i.phase != Phase::Stopped && Some(i.id.as_str()) != except)
            .map(|i| ledger::Holder {
                id: i.id.clone(),
                devices: i.placed.clone(),
                bytes: i.need.bytes,
                busy: busy(st, &i.id),
                stopping: i.is_stopping(),
                last_used: i.last_used,
            })
            .collect()
    }

    /// True when `id` could be served without evicting anything.
    pub(super) fn conflict_free(&self, st: &State, id: &str) -> bool {
        let running = st
            .instances
            .iter()
            .filter(|(_, i)| i.phase != Phase::Stopped)
            .map(|(k, _)| k.as_str());
        swap::conflicts(&st.config, &st.catalog, id, running).is_empty()
    }
}

/// `" (other programs use 20.00 GiB on cuda0)"`, or nothing when they use none.
fn outside_use_note(devices: &[crate::config::Device], used: &[u64]) -> String {
    let parts: Vec<String> = devices
        .iter()
        .zip(used)
        .filter(|(_, b)| **b > 0)
        .map(|(d, b)| format!("{} on {}", crate::memory::format_bytes(*b), d.name))
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!(" (other programs use {})", parts.join(", "))
}
