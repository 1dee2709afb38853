//! Host memory: what engines hold there while they run (weights or KV left on the CPU) and what
//! level-1 sleepers keep there (their weights). A start or a sleep that needs more than the host
//! has free first waits for holders already stopping, then stops sleepers, oldest first; none is
//! stopped in vain. Running engines are never stopped for host memory: only sleepers give way.

use std::time::Instant;

/// An instance that holds host memory.
#[derive(Debug, Clone)]
pub struct HostHolder {
    pub id: String,
    /// What it holds in host memory now.
    pub bytes: u64,
    /// Asleep, not told to stop and wanted by no request: it may be stopped to make room.
    pub asleep: bool,
    /// Told to stop: its memory comes back when it exits.
    pub stopping: bool,
    /// When it was last used: the oldest sleepers are stopped first.
    pub last_used: Instant,
}

/// What must happen before `need` bytes of host memory can be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPlan {
    /// It fits in what is free now.
    Fits,
    /// It fits once the holders already stopping have exited.
    Wait,
    /// Stop these sleepers (oldest first); it fits once they have exited.
    Stop(Vec<String>),
    /// Stopping every sleeper would still leave it this many bytes short.
    Short(u64),
}

/// Where `need` bytes stand against the `free` bytes of host memory and the holders that may give
/// theirs back.
pub fn plan_host(free: u64, need: u64, holders: &[HostHolder]) -> HostPlan {
    if need <= free {
        return HostPlan::Fits;
    }
    let coming: u64 = holders.iter().filter(|h| h.stopping).map(|h| h.bytes).sum();
    let mut free = free.saturating_add(coming);
    if need <= free {
        return HostPlan::Wait;
    }
    let mut oldest_first: Vec<&HostHolder> = holders
        .iter()
        .filter(|h| h.asleep && !h.stopping && h.bytes > 0)
        .collect();
    oldest_first.sort_by_key(|h| h.last_used);
    let mut stops = Vec::new();
    for h in oldest_first {
        free = free.saturating_add(h.bytes);
        stops.push(h.id.clone());
        if need <= free {
            return HostPlan::Stop(stops);
        }
    }
    HostPlan::Short(need - free)
}

/// What the holders charge in all.
pub fn charged(holders: &[HostHolder]) -> u64 {
    holders.iter().map(|h| h.bytes).sum()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn holder(id: &str, gib: u64, age: u64, asleep: bool, stopping: bool) -> HostHolder {
        HostHolder {
            id: id.into(),
            bytes: gib * GIB,
            asleep,
            stopping,
            last_used: Instant::now() - Duration::from_secs(age),
        }
    }

    #[test]
    fn the_oldest_sleepers_make_room_and_none_is_stopped_in_vain() {
        let holders = [
            holder("new", 4, 1, true, false),
            holder("old", 4, 100, true, false),
            holder("mid", 4, 50, true, false),
            holder("running", 16, 500, false, false),
        ];
        assert_eq!(plan_host(8 * GIB, 8 * GIB, &holders), HostPlan::Fits);
        assert_eq!(
            plan_host(GIB, 8 * GIB, &holders),
            HostPlan::Stop(vec!["old".into(), "mid".into()])
        );
        assert_eq!(
            plan_host(0, 13 * GIB, &holders),
            HostPlan::Short(GIB),
            "a running engine never gives way, and no sleeper is stopped in vain"
        );
    }

    #[test]
    fn memory_on_its_way_back_is_waited_for_before_a_sleeper_is_stopped() {
        let holders = [
            holder("leaving", 4, 10, false, true),
            holder("sleeper", 4, 100, true, false),
        ];
        assert_eq!(plan_host(GIB, 5 * GIB, &holders), HostPlan::Wait);
        assert_eq!(
            plan_host(GIB, 6 * GIB, &holders),
            HostPlan::Stop(vec!["sleeper".into()])
        );
    }
}
