//! Properties of placement over random devices, holders and needs: a start is never charged past
//! what a device can hold, covers what it needs, and neither eviction nor shedding for an overfull
//! device picks a busy or stopping instance.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::super::{less_outside_use, over_capacity};
use super::*;
use crate::config::{Device, Vendor};

const MIB: u64 = 1 << 20;

fn devices() -> impl Strategy<Value = Vec<Device>> {
    prop::collection::vec((1u64..=80 * 1024, 0u64..=10), 1..=4).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (mib, reserve_pct))| Device {
                name: format!("gpu{i}"),
                capacity: mib * MIB,
                reserve: mib * MIB * reserve_pct / 100,
                vendor: Vendor::None,
                select_as: None,
                index: None,
            })
            .collect()
    })
}

/// Holders that fit on their devices as placed (what the ledger keeps true).
fn holders(devices: &[Device], seeds: &[(usize, u64, bool, bool)]) -> Vec<Holder> {
    let mut left: Vec<u64> = devices.iter().map(Device::usable).collect();
    let mut out = Vec::new();
    for (i, &(d, mib, busy, stopping)) in seeds.iter().enumerate() {
        let d = d % devices.len();
        let bytes = (mib * MIB).min(left[d]);
        if bytes == 0 {
            continue;
        }
        left[d] -= bytes;
        out.push(Holder {
            id: format!("h{i}"),
            devices: vec![(d, bytes)],
            bytes,
            busy,
            stopping,
            last_used: Instant::now() - Duration::from_secs(i as u64),
        });
    }
    out
}

fn held_on(holders: &[Holder], device: usize) -> u64 {
    holders.iter().map(|h| h.on(device)).sum()
}

proptest! {
    #[test]
    fn placement_never_overruns_a_device_and_never_evicts_a_busy_instance(
        devices in devices(),
        seeds in prop::collection::vec((0usize..4, 1u64..=40 * 1024, any::<bool>(), any::<bool>()), 0..6),
        need_mib in 1u64..=120 * 1024,
        pack in any::<bool>(),
    ) {
        let holders = holders(&devices, &seeds);
        let need = need_mib * MIB;
        match place_by(&devices, need, &[], &holders, pack, Sharding::Layers) {
            Placement::Fits(charges) => {
                let charged: u64 = charges.iter().map(|(_, b)| b).sum();
                prop_assert!(charged >= need, "charged {charged} for {need}");
                for (d, device) in devices.iter().enumerate() {
                    let here: u64 = charges.iter().filter(|(x, _)| *x == d).map(|(_, b)| b).sum();
                    prop_assert!(
                        here + held_on(&holders, d) <= device.usable(),
                        "{} overrun: {here} + {} > {}", device.name, held_on(&holders, d), device.usable()
                    );
                }
            }
            Placement::Evict(victims) => {
                prop_assert!(!victims.is_empty());
                for v in &victims {
                    let h = holders.iter().find(|h| &h.id == v);
                    prop_assert!(h.is_some_and(|h| !h.busy && !h.stopping), "evicts {v}");
                }
            }
            Placement::WaitForStops | Placement::Blocked(_) | Placement::Never(_) => {}
        }
    }

    #[test]
    fn shedding_an_overfull_device_never_stops_a_busy_or_stopping_instance(
        devices in devices(),
        seeds in prop::collection::vec((0usize..4, 1u64..=40 * 1024, any::<bool>(), any::<bool>()), 0..6),
        outside_mib in prop::collection::vec(0u64..=80 * 1024, 0..=4),
    ) {
        let holders = holders(&devices, &seeds);
        let outside: Vec<u64> = outside_mib.iter().map(|m| m * MIB).collect();
        let seen = less_outside_use(&devices, &outside);
        for v in over_capacity(&seen, &holders) {
            let h = holders.iter().find(|h| h.id == v);
            prop_assert!(h.is_some_and(|h| !h.busy && !h.stopping), "sheds {v}");
        }
    }
}
