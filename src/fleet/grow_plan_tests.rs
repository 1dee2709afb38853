//! Pool growth over members as the fleet keeps them: free and coming slots, backoff, the member a
//! retry left, and `startAll`.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

fn member(id: &str, phase: PhaseName, free: usize, slots: usize) -> Member {
    Member {
        id: id.into(),
        phase,
        free,
        slots,
        backing_off: false,
        usable: true,
        asleep: false,
    }
}

fn starts(order: &[&str], coming: usize, target: Option<usize>) -> Growth {
    Growth::Start(Starts {
        order: order.iter().map(|s| s.to_string()).collect(),
        coming,
        target,
    })
}

#[test]
fn free_slots_that_cover_the_queue_start_nothing() {
    let members = [
        member("a", PhaseName::Ready, 2, 2),
        member("b", PhaseName::Stopped, 0, 2),
    ];
    assert_eq!(plan_growth(&members, 2, false), Growth::Wait);
    assert_eq!(plan_growth(&members, 3, false), starts(&["b"], 0, Some(1)));
}

#[test]
fn asleep_members_are_woken_before_stopped_ones_start_cold() {
    let asleep = Member {
        asleep: true,
        ..member("b", PhaseName::Stopped, 0, 2)
    };
    let members = [member("a", PhaseName::Stopped, 0, 2), asleep];
    assert_eq!(
        plan_growth(&members, 1, false),
        starts(&["b", "a"], 0, Some(1))
    );
}

#[test]
fn slots_on_their_way_count_unless_every_member_starts() {
    let members = [
        member("a", PhaseName::Starting, 0, 4),
        member("b", PhaseName::Stopped, 0, 4),
    ];
    assert_eq!(plan_growth(&members, 3, false), Growth::Wait);
    assert_eq!(plan_growth(&members, 5, false), starts(&["b"], 4, Some(5)));
    assert_eq!(plan_growth(&members, 3, true), starts(&["b"], 4, None));
}

#[test]
fn with_nothing_alive_one_start_is_needed_and_without_any_the_request_fails() {
    let stopped = [member("a", PhaseName::Stopped, 0, 1)];
    assert_eq!(plan_growth(&stopped, 0, false), starts(&["a"], 0, Some(1)));
    let left = Member {
        usable: false,
        ..member("left", PhaseName::Ready, 1, 1)
    };
    let resting = Member {
        backing_off: true,
        ..member("resting", PhaseName::Stopped, 0, 1)
    };
    assert_eq!(
        plan_growth(&[left, resting], 1, false),
        Growth::NoneCanServe
    );
}

#[test]
fn starts_end_once_enough_slots_are_on_their_way() {
    let plan = Starts {
        order: vec!["a".into(), "b".into(), "c".into()],
        coming: 0,
        target: Some(3),
    };
    let mut tried = Vec::new();
    plan.carry_out(|id| {
        tried.push(id.to_string());
        Some(2)
    });
    assert_eq!(tried, ["a", "b"]);
    tried.clear();
    // a start held back (by a swap or memory) brings no slots: the next member is tried
    plan.carry_out(|id| {
        tried.push(id.to_string());
        (id != "a").then_some(2)
    });
    assert_eq!(tried, ["a", "b", "c"]);
}

fn members() -> impl Strategy<Value = Vec<Member>> {
    let one = (
        PhaseName::any(),
        0usize..3,
        1usize..4,
        any::<bool>(),
        any::<bool>(),
    );
    prop::collection::vec(one, 0..6).prop_map(|seeds| {
        seeds
            .into_iter()
            .enumerate()
            .map(|(n, (phase, free, slots, backing_off, usable))| Member {
                backing_off,
                usable,
                ..member(&format!("m{n}"), phase, free.min(slots), slots)
            })
            .collect()
    })
}

proptest! {
    /// Growth plans each start once, only of a usable stopped member out of backoff (never one
    /// starting, ready or stopping), fails only when no member can serve, and starts nothing
    /// while a running member has a free slot for every waiting request.
    #[test]
    fn growth_starts_only_stopped_members_and_each_once(
        members in members(),
        waiting in 0usize..8,
        start_all in any::<bool>(),
    ) {
        let plan = plan_growth(&members, waiting, start_all);
        let by_id = |id: &str| members.iter().find(|m| m.id == id).expect("a member");
        let alive = members.iter().any(|m| m.usable && m.phase != PhaseName::Stopped);
        let startable = members.iter().any(|m| m.usable && !m.backing_off && m.phase == PhaseName::Stopped);
        prop_assert_eq!(plan == Growth::NoneCanServe, !alive && !startable);
        let ready_free: usize = members.iter().filter(|m| m.usable && m.phase == PhaseName::Ready).map(|m| m.free).sum();
        if let Growth::Start(starts) = plan {
            prop_assert!(!starts.order.is_empty());
            prop_assert!(!(alive && waiting <= ready_free), "starts with free slots for all");
            let unique: HashSet<&String> = starts.order.iter().collect();
            prop_assert_eq!(unique.len(), starts.order.len());
            for id in &starts.order {
                let m = by_id(id);
                prop_assert!(m.phase == PhaseName::Stopped && m.usable && !m.backing_off, "starts {m:?}");
            }
        }
    }

    /// Carrying the starts out tries each planned member at most once, in order, and stops
    /// exactly when the target is on its way (never with `startAll`).
    #[test]
    fn starts_stop_exactly_at_the_target(
        slots in prop::collection::vec(prop::option::of(1usize..4), 0..6),
        coming in 0usize..4,
        target in prop::option::of(1usize..10),
    ) {
        let order: Vec<String> = (0..slots.len()).map(|n| format!("m{n}")).collect();
        let plan = Starts { order: order.clone(), coming, target };
        let mut tried = Vec::new();
        plan.carry_out(|id| {
            tried.push(id.to_string());
            slots[tried.len() - 1]
        });
        prop_assert_eq!(&tried[..], &order[..tried.len()]);
        let mut capacity = coming;
        for (n, got) in slots.iter().take(tried.len()).enumerate() {
            capacity += got.unwrap_or(0);
            let last = n + 1 == tried.len();
            let reached = target.is_some_and(|t| capacity >= t);
            prop_assert!(last || !reached, "went on after reaching the target");
        }
        if tried.len() < order.len() {
            prop_assert!(target.is_some_and(|t| capacity >= t), "stopped short of the target");
        }
    }
}
