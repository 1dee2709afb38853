//! Choosing idle holders to stop: to make room for a new instance, or because a device holds more
//! than it can. Either way busy holders are never chosen and stopping ones already count as gone.

use super::{room, stopping_on, Charges, Holder};
use crate::config::Device;

/// Idle instances to stop because a device holds more than it can (other programs grew, or an
/// engine allocated more than it was charged): on each such device, least recently used first,
/// until what is left fits. Busy instances are never chosen; stopping ones already count as gone.
pub fn over_capacity(devices: &[Device], holders: &[Holder]) -> Vec<String> {
    let mut chosen: Vec<&Holder> = Vec::new();
    for (d, device) in devices.iter().enumerate() {
        let staying = |chosen: &[&Holder]| {
            holders
                .iter()
                .filter(|h| !h.stopping && !chosen.iter().any(|c| c.id == h.id))
                .map(|h| h.on(d))
                .sum::<u64>()
        };
        let mut idle: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.busy && !h.stopping && h.on(d) > 0)
            .collect();
        idle.sort_by_key(|h| h.last_used);
        for h in idle {
            if staying(&chosen) <= device.usable() {
                break;
            }
            if !chosen.iter().any(|c| c.id == h.id) {
                chosen.push(h);
            }
        }
    }
    chosen.into_iter().map(|h| h.id.clone()).collect()
}

/// The idle holders on the candidate's devices to stop, least recently used first, until the
/// candidate fits once they and the stopping holders are gone; `None` when stopping every idle
/// one would still not make room (busy holders are in the way).
pub(super) fn idle_to_evict<'h>(
    devices: &[Device],
    holders: &'h [Holder],
    c: &Charges,
) -> Option<Vec<&'h Holder>> {
    let mut idle: Vec<&Holder> = holders
        .iter()
        .filter(|h| !h.busy && !h.stopping && h.uses(c))
        .collect();
    idle.sort_by_key(|h| h.last_used);
    let fits = |chosen: &[&Holder]| {
        c.iter().all(|(d, share)| {
            let freed = stopping_on(holders, *d) + chosen.iter().map(|h| h.on(*d)).sum::<u64>();
            room(devices, holders, *d) + freed >= *share
        })
    };
    let mut chosen: Vec<&Holder> = Vec::new();
    for h in idle {
        if fits(&chosen) {
            break;
        }
        chosen.push(h);
    }
    fits(&chosen).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{gpu, holder, GIB};
    use super::super::less_outside_use;
    use super::*;

    #[test]
    fn an_overfull_device_sheds_idle_holders_least_recently_used_first() {
        let devices = [gpu("g", 10)];
        let holders = [
            holder("busy", 4, true, 300),
            holder("old", 3, false, 200),
            holder("new", 3, false, 100),
        ];
        assert!(over_capacity(&devices, &holders).is_empty());
        let shrunk = less_outside_use(&devices, &[2 * GIB]);
        assert_eq!(over_capacity(&shrunk, &holders), ["old"]);
        let tiny = less_outside_use(&devices, &[9 * GIB]);
        assert_eq!(
            over_capacity(&tiny, &holders),
            ["old", "new"],
            "never the busy one, even when it alone is too much"
        );
    }
}
