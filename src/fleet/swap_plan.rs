//! The swap decision as a pure function over a snapshot of the instances that conflict with the
//! one a request wants: which to stop, and whether to start it. Kept free of the fleet's state so
//! the rule that a busy or stopping instance is never chosen can be tested without processes.

use super::PhaseName;

/// What the decision needs to know of one conflicting instance.
#[derive(Debug, Clone)]
pub(super) struct Conflict {
    pub id: String,
    pub phase: PhaseName,
    /// Requests in flight or waiting for it.
    pub busy: bool,
    /// Already told to stop: ordering it again would change nothing.
    pub stopping: bool,
}

/// What must happen before the wanted instance can serve.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum SwapPlan {
    /// It is ready and nothing conflicts: serve now.
    Ready,
    /// A conflicting instance is busy: wait until it is idle.
    Blocked,
    /// A request that ranks higher waits for a conflicting model: it swaps first.
    Outranked,
    /// Stop these conflicting instances, and start the wanted one when `start` (it is stopped and
    /// every conflict has stopped too).
    Swap { stops: Vec<String>, start: bool },
}

/// Decides the swap for an instance in phase `wanted`, given the instances it conflicts with and
/// whether a higher-ranked request goes first. Only idle instances that are starting or ready and
/// not already stopping are chosen to stop.
pub(super) fn plan_swap(wanted: PhaseName, outranked: bool, conflicts: &[Conflict]) -> SwapPlan {
    if wanted == PhaseName::Ready && conflicts.is_empty() {
        return SwapPlan::Ready;
    }
    if conflicts.iter().any(|c| c.busy) {
        return SwapPlan::Blocked;
    }
    if wanted == PhaseName::Stopped && outranked {
        return SwapPlan::Outranked;
    }
    let stops = conflicts
        .iter()
        .filter(|c| !c.stopping && matches!(c.phase, PhaseName::Starting | PhaseName::Ready))
        .map(|c| c.id.clone())
        .collect();
    let start =
        wanted == PhaseName::Stopped && conflicts.iter().all(|c| c.phase == PhaseName::Stopped);
    SwapPlan::Swap { stops, start }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn conflict(id: &str, phase: PhaseName, busy: bool, stopping: bool) -> Conflict {
        Conflict {
            id: id.into(),
            phase,
            busy,
            stopping,
        }
    }

    #[test]
    fn idle_running_conflicts_are_stopped_and_the_start_waits_for_them() {
        let conflicts = [
            conflict("ready", PhaseName::Ready, false, false),
            conflict("starting", PhaseName::Starting, false, false),
            conflict("ordered", PhaseName::Ready, false, true),
            conflict("exiting", PhaseName::Stopping, false, true),
            conflict("gone", PhaseName::Stopped, false, false),
        ];
        assert_eq!(
            plan_swap(PhaseName::Stopped, false, &conflicts),
            SwapPlan::Swap {
                stops: vec!["ready".into(), "starting".into()],
                start: false
            }
        );
        let stopped = [conflict("gone", PhaseName::Stopped, false, false)];
        assert_eq!(
            plan_swap(PhaseName::Stopped, false, &stopped),
            SwapPlan::Swap {
                stops: vec![],
                start: true
            }
        );
    }

    #[test]
    fn a_busy_conflict_blocks_before_anything_is_stopped() {
        let conflicts = [
            conflict("idle", PhaseName::Ready, false, false),
            conflict("busy", PhaseName::Ready, true, false),
        ];
        assert_eq!(
            plan_swap(PhaseName::Stopped, false, &conflicts),
            SwapPlan::Blocked
        );
    }

    #[test]
    fn ready_without_conflicts_serves_and_an_outranked_request_waits() {
        assert_eq!(plan_swap(PhaseName::Ready, true, &[]), SwapPlan::Ready);
        let idle = [conflict("idle", PhaseName::Ready, false, false)];
        assert_eq!(
            plan_swap(PhaseName::Stopped, true, &idle),
            SwapPlan::Outranked
        );
        // only a stopped instance waits its turn: one on its way goes on
        assert_eq!(
            plan_swap(PhaseName::Starting, true, &idle),
            SwapPlan::Swap {
                stops: vec!["idle".into()],
                start: false
            }
        );
    }

    proptest! {
        /// A busy (serving) or stopping instance is never chosen to be stopped for a swap, and
        /// the wanted instance starts only once every conflict has stopped.
        #[test]
        fn a_swap_never_stops_a_busy_or_stopping_instance(
            wanted in PhaseName::any(),
            outranked in any::<bool>(),
            seeds in prop::collection::vec((PhaseName::any(), any::<bool>(), any::<bool>()), 0..6),
        ) {
            let conflicts: Vec<Conflict> = seeds
                .iter()
                .enumerate()
                .map(|(i, (phase, busy, stopping))| {
                    // an instance in the stopping phase is stopping whatever its order says
                    let stopping = *stopping || *phase == PhaseName::Stopping;
                    conflict(&format!("c{i}"), *phase, *busy, stopping)
                })
                .collect();
            if let SwapPlan::Swap { stops, start } = plan_swap(wanted, outranked, &conflicts) {
                for id in &stops {
                    let c = conflicts.iter().find(|c| &c.id == id).expect("a conflict");
                    prop_assert!(!c.busy && !c.stopping, "stops {c:?}");
                }
                if start {
                    prop_assert!(wanted == PhaseName::Stopped);
                    prop_assert!(stops.is_empty());
                    prop_assert!(conflicts.iter().all(|c| c.phase == PhaseName::Stopped));
                }
            }
        }
    }
}
