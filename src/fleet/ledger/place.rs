//! The placement search: where a new instance's memory can go, given what holders charge now,
//! and what must happen first when it cannot go anywhere yet.

use super::evict::idle_to_evict;
use super::split::{split_by, Sharding};
use super::{room, stopping_on, Charges, Holder};
use crate::config::Device;
use crate::memory;

#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// Start on these devices, charged this much on each.
    Fits(Charges),
    /// Stop these idle instances first (least recently used first).
    Evict(Vec<String>),
    /// Instances that are stopping will free enough: wait for them.
    WaitForStops,
    /// Only busy instances hold the memory: wait for one to become idle. The message names them.
    Blocked(String),
    /// It can never fit.
    Never(String),
}

/// Where `need` bytes can go, given the current holders. `pinned` lists the devices the model must
/// be split across evenly; empty means any single device, or, for a model no single device can
/// hold, a split over the fewest devices that can.
pub fn place(devices: &[Device], need: u64, pinned: &[usize], holders: &[Holder]) -> Placement {
    place_by(devices, need, pinned, holders, false, Sharding::Layers)
}

/// [`place`], choosing among the devices it fits on now by the least room left when `pack` (bin
/// packing: whole devices stay free for big models) instead of the most (spreading), and
/// splitting a model no device holds as its engine shards it.
pub fn place_by(
    devices: &[Device],
    need: u64,
    pinned: &[usize],
    holders: &[Holder],
    pack: bool,
    sharding: Sharding,
) -> Placement {
    let mut search = Search::default();
    for c in candidates(devices, need, pinned, holders, sharding) {
        search.judge(devices, holders, c, pack);
    }
    search.outcome()
}

/// Every way `need` could be charged: evenly over the pinned devices, else on any one device or
/// split over several, so the search can compare them.
fn candidates(
    devices: &[Device],
    need: u64,
    pinned: &[usize],
    holders: &[Holder],
    sharding: Sharding,
) -> Vec<Charges> {
    if pinned.is_empty() {
        let singles = (0..devices.len()).map(|d| vec![(d, need)]);
        let split = split_by(sharding, devices, need, holders);
        singles.chain(split).collect()
    } else {
        let per = need.div_ceil(pinned.len() as u64);
        vec![pinned.iter().map(|d| (*d, per)).collect()]
    }
}

/// The best placement found so far, and why the rejected candidates were rejected, so that when
/// none will do the answer can name what is in the way.
#[derive(Default)]
struct Search {
    best: Option<((u8, u64), Placement)>,
    /// Busy holders in the way of some candidate, as `id (size)`.
    blocked: Vec<String>,
    /// Devices too small for their share whatever is stopped.
    never: Vec<String>,
}

impl Search {
    /// Weighs one candidate: fitting now beats everything, then waiting for stops, then evicting.
    fn judge(&mut self, devices: &[Device], holders: &[Holder], c: Charges, pack: bool) {
        if let Some((d, _)) = c.iter().find(|(d, share)| devices[*d].usable() < *share) {
            self.never.push(format!(
                "{} has {} usable",
                devices[*d].name,
                memory::format_bytes(devices[*d].usable())
            ));
            return;
        }
        let free = |d: usize, extra: u64| room(devices, holders, d) + extra;
        if c.iter().all(|(d, share)| free(*d, 0) >= *share) {
            let headroom = c
                .iter()
                .map(|(d, share)| free(*d, 0) - share)
                .min()
                .unwrap_or(0);
            // one device beats a split; then the most headroom left (spread) or the least (pack)
            let class = if c.len() == 1 { 0 } else { 1 };
            let measure = if pack { headroom } else { u64::MAX - headroom };
            self.consider((class, measure), Placement::Fits(c));
            return;
        }
        if c.iter()
            .all(|(d, share)| free(*d, stopping_on(holders, *d)) >= *share)
        {
            self.consider((2, 0), Placement::WaitForStops);
            return;
        }
        match idle_to_evict(devices, holders, &c) {
            Some(chosen) => {
                let evicted: u64 = chosen.iter().map(|h| h.bytes).sum();
                let ids = chosen.iter().map(|h| h.id.clone()).collect();
                self.consider((3, evicted), Placement::Evict(ids));
            }
            None => self.note_busy(holders, &c),
        }
    }

    /// Keeps the better placement: lower class first (fits on one device, fits split, wait,
    /// evict), then the lower measure.
    fn consider(&mut self, key: (u8, u64), p: Placement) {
        if self.best.as_ref().is_none_or(|(k, _)| key < *k) {
            self.best = Some((key, p));
        }
    }

    /// Remembers the busy holders on a candidate's devices, once each, for the blocked message.
    fn note_busy(&mut self, holders: &[Holder], c: &Charges) {
        for h in holders.iter().filter(|h| h.busy && h.uses(c)) {
            let entry = format!("{} ({})", h.id, memory::format_bytes(h.bytes));
            if !self.blocked.contains(&entry) {
                self.blocked.push(entry);
            }
        }
    }

    fn outcome(self) -> Placement {
        match self.best {
            Some((_, p)) => p,
            None if !self.blocked.is_empty() => {
                Placement::Blocked(format!("held by {} (serving)", self.blocked.join(", ")))
            }
            None if !self.never.is_empty() => Placement::Never(self.never.join("; ")),
            None => Placement::Blocked("no device has room".into()),
        }
    }
}

#[cfg(test)]
#[path = "place_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::super::charged;
    use super::super::fixtures::{gpu, holder, GIB};
    use super::*;

    #[test]
    fn fits_when_there_is_room() {
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &[holder("a", 4, false, 0)]),
            Placement::Fits(vec![(0, 4 * GIB)])
        );
    }

    #[test]
    fn evicts_the_least_recently_used_idle_instance() {
        let holders = [holder("a", 4, false, 10), holder("b", 4, false, 100)];
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &holders),
            Placement::Evict(vec!["b".into()])
        );
    }

    #[test]
    fn never_evicts_a_busy_instance() {
        let holders = [holder("a", 8, true, 100)];
        match place(&[gpu("g", 10)], 4 * GIB, &[], &holders) {
            Placement::Blocked(msg) => assert!(msg.contains("a (8.00 GiB)"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let mixed = [holder("busy", 4, true, 100), holder("idle", 4, false, 1)];
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &mixed),
            Placement::Evict(vec!["idle".into()])
        );
    }

    #[test]
    fn waits_for_stopping_instances_instead_of_evicting_more() {
        let mut stopping = holder("s", 4, false, 0);
        stopping.stopping = true;
        let holders = [stopping, holder("idle", 4, false, 100)];
        assert_eq!(
            place(&[gpu("g", 10)], 6 * GIB, &[], &holders),
            Placement::WaitForStops
        );
    }

    #[test]
    fn too_big_is_never() {
        assert!(matches!(
            place(&[gpu("g", 10)], 11 * GIB, &[], &[]),
            Placement::Never(_)
        ));
    }

    #[test]
    fn picks_the_device_with_room_and_splits_pinned_models() {
        let devices = [gpu("g0", 10), gpu("g1", 10)];
        assert_eq!(
            place(&devices, 4 * GIB, &[], &[holder("a", 8, true, 0)]),
            Placement::Fits(vec![(1, 4 * GIB)])
        );
        // 16 GiB split over both: 8 each, but g0 has only 2 free and its holder is busy
        assert!(matches!(
            place(&devices, 16 * GIB, &[0, 1], &[holder("a", 8, true, 0)]),
            Placement::Blocked(_)
        ));
        assert_eq!(
            place(&devices, 16 * GIB, &[0, 1], &[]),
            Placement::Fits(vec![(0, 8 * GIB), (1, 8 * GIB)])
        );
    }

    #[test]
    fn pack_fills_the_fullest_device_that_fits_and_spread_the_emptiest() {
        let devices = [gpu("g0", 24), gpu("g1", 24)];
        let held = [Holder {
            devices: vec![(1, 10 * GIB)],
            ..holder("a", 10, true, 0)
        }];
        assert_eq!(
            place(&devices, 4 * GIB, &[], &held),
            Placement::Fits(vec![(0, 4 * GIB)]),
            "spread: the most room"
        );
        assert_eq!(
            place_by(&devices, 4 * GIB, &[], &held, true, Sharding::Layers),
            Placement::Fits(vec![(1, 4 * GIB)]),
            "pack: the least room that still fits"
        );
        assert_eq!(
            place_by(&devices, 20 * GIB, &[], &held, true, Sharding::Layers),
            Placement::Fits(vec![(0, 20 * GIB)]),
            "pack: only where it fits"
        );
    }

    /// Whatever the devices and holders, a placement that fits charges exactly the need, and never
    /// more on a device than its capacity less its reserve and what others hold there.
    #[test]
    fn a_fit_never_overcommits_a_device() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..5000 {
            let devices: Vec<Device> = (0..1 + next(4))
                .map(|i| Device {
                    reserve: next(2) * GIB,
                    ..gpu(&format!("g{i}"), 4 + next(44))
                })
                .collect();
            let holders: Vec<Holder> = (0..next(4))
                .map(|i| {
                    let d = next(devices.len() as u64) as usize;
                    let gib = 1 + next(8);
                    Holder {
                        devices: vec![(d, gib * GIB)],
                        ..holder(&format!("h{i}"), gib, next(2) == 0, i)
                    }
                })
                .collect();
            let need = (1 + next(80)) * GIB / 2;
            if let Placement::Fits(charges) = place(&devices, need, &[], &holders) {
                assert_eq!(charges.iter().map(|(_, b)| b).sum::<u64>(), need);
                for (d, b) in &charges {
                    let room = devices[*d].usable().saturating_sub(charged(&holders, *d));
                    assert!(
                        *b <= room,
                        "{b} on {d} with {room} free: {devices:?} {holders:?}"
                    );
                }
            }
        }
    }
}
