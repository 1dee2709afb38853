//! The make-room decision as a pure function over a view of the devices and of every instance that
//! may hold memory: where a new instance goes, which idle holders stop first, or why it waits or
//! fails. Kept free of the fleet's state so the rule that an instance with requests, or one already
//! stopping, is never stopped for memory can be tested without processes. `placement.rs` carries
//! the plan out.

use std::time::Instant;

use super::ledger::{self, Charges, Need, Placement};
use super::PhaseName;
use crate::config::Device;

/// What the decision knows of one instance other than the one it places.
#[derive(Debug, Clone)]
pub(super) struct Occupant {
    pub id: String,
    pub phase: PhaseName,
    pub load: Load,
    /// Told to stop already: its memory is on its way back.
    pub stopping: bool,
    pub placed: Charges,
    pub bytes: u64,
    pub last_used: Instant,
}

/// The requests that hold an instance, for telling whether it may be stopped.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Load {
    pub in_flight: usize,
    /// Direct requests admitted for it, in flight or not yet.
    pub reserved: usize,
    /// Its pool has requests waiting, which a running member is about to serve.
    pub pool_waiting: bool,
}

impl Load {
    /// True when stopping the instance would fail or strand requests: never evicted or swapped.
    pub fn busy(&self, phase: PhaseName) -> bool {
        self.in_flight > 0
            || self.reserved > 0
            || (self.pool_waiting
                && matches!(
                    phase,
                    PhaseName::Starting | PhaseName::Ready | PhaseName::Sleeping
                ))
    }
}

/// The instance that needs room.
pub(super) struct Ask<'a> {
    pub id: &'a str,
    pub need: &'a Need,
    /// Names of the devices its model must be split across; empty for any.
    pub pinned: &'a [String],
    /// Bin packing rather than spreading (`memory.pack`).
    pub pack: bool,
    /// How its engine splits a model over several devices.
    pub sharding: ledger::Sharding,
}

/// What must happen before the instance can start.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RoomPlan {
    /// No devices are configured, or its need is unknown: it starts unplaced.
    Unplaced,
    /// It starts charged on these devices.
    Place(Charges),
    /// Stop these idle instances for memory, then wait for their memory to come back.
    Evict(Vec<String>),
    /// Instances already stopping will free enough: wait for them.
    Wait,
    /// Busy instances (or other programs) hold the memory: waiting may help.
    NoRoom(String),
    /// It can never fit on these devices.
    NeverFits(String),
}

/// Decides where `ask` goes on `devices`, of which other programs use `used_by_others`, given
/// every other instance. Only running instances hold memory, and only idle ones that are not
/// stopping already may be chosen to stop.
pub(super) fn plan_room(
    devices: &[Device],
    used_by_others: &[u64],
    ask: &Ask<'_>,
    occupants: &[Occupant],
) -> RoomPlan {
    let need = ask.need.bytes;
    if devices.is_empty() || need == 0 {
        return RoomPlan::Unplaced;
    }
    let pinned: Vec<usize> = ask
        .pinned
        .iter()
        .filter_map(|name| devices.iter().position(|d| &d.name == name))
        .collect();
    let seen = ledger::less_outside_use(devices, used_by_others);
    let outside = outside_use_note(devices, used_by_others);
    let needs = |what: &str| {
        let (id, bytes) = (ask.id, crate::memory::format_bytes(need));
        format!(
            "insufficient_memory: {id} needs {bytes} ({}){what}{outside}",
            ask.need.source
        )
    };
    let holders = holders_of(occupants);
    match ledger::place_by(&seen, need, &pinned, &holders, ask.pack, ask.sharding) {
        Placement::Fits(on) => RoomPlan::Place(on),
        Placement::Evict(victims) => RoomPlan::Evict(victims),
        Placement::WaitForStops => RoomPlan::Wait,
        Placement::Blocked(why) => RoomPlan::NoRoom(needs(&format!("; {why}"))),
        // other programs' use comes and goes: worth waiting for if it alone is in the way
        Placement::Never(why) => {
            match ledger::place_by(devices, need, &pinned, &[], ask.pack, ask.sharding) {
                Placement::Never(_) => RoomPlan::NeverFits(needs(&format!(" but {why}"))),
                _ => RoomPlan::NoRoom(needs(&format!(" but {why}"))),
            }
        }
    }
}

/// The ledger's holders: the occupants that are not stopped, each busy or not by [`Load::busy`].
pub(super) fn holders_of(occupants: &[Occupant]) -> Vec<ledger::Holder> {
    occupants
        .iter()
        .filter(|o| o.phase != PhaseName::Stopped)
        .map(|o| ledger::Holder {
            id: o.id.clone(),
            devices: o.placed.clone(),
            bytes: o.bytes,
            busy: o.load.busy(o.phase),
            stopping: o.stopping,
            last_used: o.last_used,
        })
        .collect()
}

/// `" (other programs use 20.00 GiB on cuda0)"`, or nothing when they use none.
fn outside_use_note(devices: &[Device], used: &[u64]) -> String {
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

#[cfg(test)]
#[path = "room_plan_tests.rs"]
mod tests;
