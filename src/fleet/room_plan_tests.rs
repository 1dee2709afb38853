//! The make-room decision over instances as the fleet keeps them: requests in flight, admitted or
//! queued in the pool keep an instance from being stopped, whatever the devices look like.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::config::Vendor;

const GIB: u64 = 1 << 30;

fn gpu(name: &str, gib: u64) -> Device {
    Device {
        name: name.into(),
        capacity: gib * GIB,
        reserve: 0,
        vendor: Vendor::None,
        select_as: None,
        index: None,
    }
}

fn need(gib: u64) -> Need {
    Need {
        bytes: gib * GIB,
        weights: 0,
        host: 0,
        source: "memory.bytes".into(),
    }
}

/// A ready, idle instance holding `gib` on device 0, last used `age_s` ago.
fn idle(id: &str, gib: u64, age_s: u64) -> Occupant {
    Occupant {
        id: id.into(),
        phase: PhaseName::Ready,
        load: Load::default(),
        stopping: false,
        placed: vec![(0, gib * GIB)],
        bytes: gib * GIB,
        last_used: Instant::now() - Duration::from_secs(age_s),
    }
}

fn plan(devices: &[Device], others: &[u64], gib: u64, occupants: &[Occupant]) -> RoomPlan {
    let need = need(gib);
    let ask = Ask {
        id: "new",
        need: &need,
        pinned: &[],
        pack: false,
        sharding: Default::default(),
    };
    plan_room(devices, others, &ask, occupants)
}

#[test]
fn requests_in_flight_admitted_or_queued_keep_an_instance_from_eviction() {
    let serving = Occupant {
        load: Load {
            in_flight: 1,
            ..Load::default()
        },
        ..idle("serving", 3, 400)
    };
    let admitted = Occupant {
        load: Load {
            reserved: 1,
            ..Load::default()
        },
        ..idle("admitted", 3, 300)
    };
    let queued = Occupant {
        load: Load {
            pool_waiting: true,
            ..Load::default()
        },
        ..idle("queued", 3, 200)
    };
    let occupants = [serving, admitted, queued, idle("idle", 3, 100)];
    assert_eq!(
        plan(&[gpu("g0", 12)], &[], 3, &occupants),
        RoomPlan::Evict(vec!["idle".into()]),
        "the least recently used are busy: only the idle one goes"
    );
    let no_idle = &occupants[..3];
    match plan(&[gpu("g0", 9)], &[], 3, no_idle) {
        RoomPlan::NoRoom(why) => assert!(why.contains("held by serving"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stopped_instance_holds_nothing_and_a_stopping_one_is_waited_for() {
    let gone = Occupant {
        phase: PhaseName::Stopped,
        ..idle("gone", 10, 0)
    };
    assert_eq!(
        plan(&[gpu("g0", 10)], &[], 4, &[gone]),
        RoomPlan::Place(vec![(0, 4 * GIB)])
    );
    let leaving = Occupant {
        phase: PhaseName::Stopping,
        stopping: true,
        ..idle("leaving", 10, 0)
    };
    assert_eq!(plan(&[gpu("g0", 10)], &[], 4, &[leaving]), RoomPlan::Wait);
}

#[test]
fn other_programs_alone_in_the_way_are_waited_for_and_too_big_never_fits() {
    let devices = [gpu("g0", 24)];
    match plan(&devices, &[20 * GIB], 8, &[]) {
        RoomPlan::NoRoom(why) => assert_eq!(
            why,
            "insufficient_memory: new needs 8.00 GiB (memory.bytes) but g0 has 4.00 GiB usable \
             (other programs use 20.00 GiB on g0)"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        plan(&devices, &[], 30, &[]),
        RoomPlan::NeverFits(_)
    ));
}

#[test]
fn nothing_is_placed_without_devices_or_a_known_need() {
    assert_eq!(plan(&[], &[], 4, &[]), RoomPlan::Unplaced);
    assert_eq!(plan(&[gpu("g0", 8)], &[], 0, &[]), RoomPlan::Unplaced);
}

#[test]
fn a_pinned_model_is_split_over_its_devices_by_name() {
    let need = need(8);
    let ask = Ask {
        id: "new",
        need: &need,
        pinned: &["g1".into(), "g0".into()],
        pack: false,
        sharding: Default::default(),
    };
    assert_eq!(
        plan_room(&[gpu("g0", 10), gpu("g1", 10)], &[], &ask, &[]),
        RoomPlan::Place(vec![(1, 4 * GIB), (0, 4 * GIB)])
    );
}

/// Random instances on up to three devices: phase, requests, stop order, device, size, age.
fn occupants() -> impl Strategy<Value = Vec<Occupant>> {
    let one = (
        PhaseName::any(),
        (0usize..3, 0usize..2, any::<bool>()),
        any::<bool>(),
        (0usize..3, 1u64..=16),
        0u64..1000,
    );
    prop::collection::vec(one, 0..8).prop_map(|seeds| {
        seeds
            .into_iter()
            .enumerate()
            .map(
                |(n, (phase, (in_flight, reserved, pool_waiting), ordered, (d, gib), age))| {
                    Occupant {
                        phase,
                        load: Load {
                            in_flight,
                            reserved,
                            pool_waiting,
                        },
                        // an instance in the stopping phase is stopping whatever its order says
                        stopping: ordered || phase == PhaseName::Stopping,
                        placed: vec![(d, gib * GIB)],
                        ..idle(&format!("i{n}"), gib, age)
                    }
                },
            )
            .collect()
    })
}

proptest! {
    /// Whatever the devices and instances, making room stops only idle running instances that
    /// are not stopping already: none with a request in flight, admitted, or queued in its pool.
    #[test]
    fn making_room_never_stops_a_busy_or_stopping_instance(
        sizes in prop::collection::vec(4u64..=48, 1..=3),
        others in prop::collection::vec(0u64..=8, 0..=3),
        occupants in occupants(),
        gib in 0u64..=60,
    ) {
        let devices: Vec<Device> = sizes.iter().enumerate().map(|(i, g)| gpu(&format!("g{i}"), *g)).collect();
        let others: Vec<u64> = others.iter().map(|g| g * GIB).collect();
        if let RoomPlan::Evict(victims) = plan(&devices, &others, gib, &occupants) {
            prop_assert!(!victims.is_empty());
            for v in &victims {
                let o = occupants.iter().find(|o| &o.id == v).expect("an occupant");
                // an asleep instance is stopped for its residue like any idle one
                let running = matches!(o.phase, PhaseName::Starting | PhaseName::Ready | PhaseName::Sleeping);
                prop_assert!(running, "stops {o:?}");
                prop_assert!(!o.stopping, "stops {o:?}");
                let Load { in_flight, reserved, pool_waiting } = o.load;
                prop_assert!(in_flight == 0 && reserved == 0 && !pool_waiting, "stops {o:?}");
            }
            let mut unique = victims.clone();
            unique.sort();
            unique.dedup();
            prop_assert_eq!(unique.len(), victims.len());
        }
    }
}
