//! Host memory as the fleet stands: what each instance holds there, what is free (`hostMemory`
//! less what the instances hold, else the host's own reading, which already counts them), and
//! room made for a start or a sleep by the plan in `ledger/host.rs`.

use super::ledger::host::{charged, plan_host, HostHolder, HostPlan};
use super::phase::{Phase, Rest};
use super::prepare::{busy, Prepared};
use super::{Fleet, State, StopReason};
use crate::memory::format_bytes;
use crate::memory::host::HostMemory;

/// What `id` holds in host memory now: what it keeps there while it runs, and, sleeping at a
/// level that keeps the weights, its weights (until its process has exited).
pub(super) fn held(st: &State, id: &str) -> u64 {
    let inst = &st.instances[id];
    match &inst.phase {
        Phase::Stopped => 0,
        Phase::Sleeping { .. } => held_asleep(st, id),
        _ => inst.need.host,
    }
}

/// What `id` holds in host memory asleep: at level 1 its weights (the weights on disk, else its
/// device charge) where more than what it holds running.
pub(super) fn held_asleep(st: &State, id: &str) -> u64 {
    let inst = &st.instances[id];
    let kept = match &inst.model.sleep {
        Some(spec) if spec.keeps_weights() => match inst.need.weights {
            0 => inst.need.bytes,
            weights => weights,
        },
        _ => 0,
    };
    kept.max(inst.need.host)
}

/// Every instance but `except` that holds host memory.
fn holders(st: &State, except: Option<&str>) -> Vec<HostHolder> {
    st.instances
        .values()
        .filter(|i| Some(&*i.id) != except)
        .map(|i| HostHolder {
            id: i.id.to_string(),
            bytes: held(st, &i.id),
            // one a request waits to wake is not given up for memory
            asleep: i.phase.rest() == Some(Rest::Asleep) && !busy(st, &i.id),
            stopping: i.is_stopping(),
            last_used: i.last_used,
        })
        .filter(|h| h.bytes > 0)
        .collect()
}

/// The host memory free now: `hostMemory` less what every instance holds, else what the host
/// reports available.
fn free(st: &State, others: &[HostHolder], own: u64) -> u64 {
    match st.config.host_memory {
        Some(limit) => limit.saturating_sub(charged(others).saturating_add(own)),
        None => crate::memory::host::read().available,
    }
}

/// What must happen before `id` can hold `bytes` in host memory (what it holds now counts
/// toward them), with what the host lacks otherwise.
pub(super) fn plan_for(st: &State, id: &str, bytes: u64) -> HostPlan {
    let own = held(st, id);
    let need = bytes.saturating_sub(own);
    if need == 0 {
        return HostPlan::Fits;
    }
    let others = holders(st, Some(id));
    plan_host(free(st, &others, own), need, &others)
}

/// True when `id` may start in host memory stopping nothing: it fits, or it is short only of the
/// host's own reading, which a start goes ahead against (see [`Fleet::make_host_room`]).
pub(super) fn fits_beside(st: &State, id: &str) -> bool {
    match plan_for(st, id, st.instances[id].need.host) {
        HostPlan::Fits => true,
        HostPlan::Short(_) => st.config.host_memory.is_none(),
        HostPlan::Wait | HostPlan::Stop(_) => false,
    }
}

/// The share of the host's memory kept available: below it, sleepers give theirs back.
const HOST_FLOOR_DIVISOR: u64 = 20;

/// The sleepers to stop, oldest first, for the host's available memory to come back to a
/// twentieth of its total; all of them where that would not be enough.
fn relief(host: HostMemory, holders: &[HostHolder]) -> Vec<String> {
    let mut sleepers: Vec<HostHolder> = holders.iter().filter(|h| h.asleep).cloned().collect();
    sleepers.sort_by_key(|h| h.last_used);
    match plan_host(host.available, host.total / HOST_FLOOR_DIVISOR, &sleepers) {
        HostPlan::Fits | HostPlan::Wait => Vec::new(),
        HostPlan::Stop(some) => some,
        HostPlan::Short(_) => sleepers.into_iter().map(|h| h.id).collect(),
    }
}

impl Fleet {
    /// Stops sleepers, oldest first, while the host's own available memory is under its floor:
    /// what they keep there is the first memory to give back when other programs need it.
    pub(super) fn relieve_host(&self, st: &State) {
        // every tick of the TTL loop: nothing is read or gathered while nothing sleeps
        if !st.instances.values().any(|i| i.phase.is_asleep()) {
            return;
        }
        let host = crate::memory::host::read();
        let stops = relief(host, &holders(st, None));
        if !stops.is_empty() {
            let (available, total) = (format_bytes(host.available), format_bytes(host.total));
            let why = format!("host memory is low ({available} available of {total})");
            stop_sleepers(st, &stops, &why);
        }
    }

    /// Makes host room for `id` to start (or wake); `None` when it may go ahead. Sleepers are
    /// stopped for it; with `hostMemory` set, a start that would still not fit waits, or fails
    /// when the limit could never hold it. Against the host's own reading it goes ahead with a
    /// warning: what the kernel can reclaim is not known well enough to refuse a start.
    pub(super) fn make_host_room(&self, st: &mut State, id: &str) -> Option<Prepared> {
        let bytes = st.instances[id].need.host;
        match plan_for(st, id, bytes) {
            HostPlan::Fits => None,
            HostPlan::Wait => Some(Prepared::Waiting),
            HostPlan::Stop(sleepers) => {
                stop_sleepers(st, &sleepers, &format!("making host room for {id}"));
                Some(Prepared::Waiting)
            }
            HostPlan::Short(short) => short_of_host(st, id, short),
        }
    }
}

/// Stops `sleepers` for host memory, saying `why`.
pub(super) fn stop_sleepers(st: &State, sleepers: &[String], why: &str) {
    let grace = st.config.health_check_timeout;
    for s in sleepers {
        tracing::info!(instance = %s, "stopping a sleeper: {why}");
        st.instances[s].order_stop(grace, StopReason::Memory);
    }
}

/// What a start `short` bytes short of host memory does: waits or fails under `hostMemory`,
/// else goes ahead.
fn short_of_host(st: &State, id: &str, short: u64) -> Option<Prepared> {
    let need = &st.instances[id].need;
    let what = format!(
        "insufficient_memory: {id} needs {} of host memory ({})",
        format_bytes(need.host),
        need.source
    );
    let Some(limit) = st.config.host_memory else {
        tracing::warn!(
            instance = id,
            "{what}, {} more than the host has available; starting it anyway",
            format_bytes(short)
        );
        return None;
    };
    let limit_text = format_bytes(limit);
    if need.host > limit {
        return Some(Prepared::NeverFits(format!(
            "{what} but hostMemory is {limit_text}"
        )));
    }
    let held: Vec<String> = holders(st, Some(id))
        .iter()
        .map(|h| format!("{} ({})", h.id, format_bytes(h.bytes)))
        .collect();
    Some(Prepared::NoRoom(format!(
        "{what}, {} more than hostMemory {limit_text} has free; held by {}",
        format_bytes(short),
        held.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn holder(id: &str, gib: u64, age: u64, asleep: bool) -> HostHolder {
        HostHolder {
            id: id.into(),
            bytes: gib * GIB,
            asleep,
            stopping: false,
            last_used: Instant::now() - Duration::from_secs(age),
        }
    }

    fn host(total_gib: u64, available_gib: u64) -> HostMemory {
        HostMemory {
            total: total_gib * GIB,
            available: available_gib * GIB,
            ..HostMemory::default()
        }
    }

    #[test]
    fn sleepers_give_host_memory_back_oldest_first_when_it_runs_low() {
        let holders = [
            holder("new", 2, 1, true),
            holder("old", 2, 100, true),
            holder("running", 8, 500, false),
        ];
        assert!(relief(host(100, 5), &holders).is_empty(), "5% is kept");
        assert_eq!(relief(host(100, 4), &holders), ["old"]);
        assert_eq!(relief(host(100, 0), &holders), ["old", "new"]);
        assert_eq!(
            relief(host(100, 0), &holders[2..]),
            Vec::<String>::new(),
            "running engines never give way"
        );
    }
}
