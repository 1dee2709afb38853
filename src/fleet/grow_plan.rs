//! How a pool grows, as a pure function over a view of its members: whether any member can serve,
//! and which stopped members to start, in what order and until how many slots are on their way,
//! for the requests waiting in its queue. Kept free of the fleet's state so that what growth may
//! start can be tested without processes. `pool.rs` carries the plan out.

use super::PhaseName;

/// What the decision knows of one pool member.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub id: String,
    pub phase: PhaseName,
    /// Slots a request could take now.
    pub free: usize,
    pub slots: usize,
    /// Waiting out its backoff after failed starts.
    pub backing_off: bool,
    /// Neither the member a retry left nor one whose start this request saw fail.
    pub usable: bool,
    /// Asleep: shown as stopped, and woken before any stopped member is started cold.
    pub asleep: bool,
}

/// What the pool does for its waiting requests.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Growth {
    /// No usable member runs, is on its way, or may start: the request fails.
    NoneCanServe,
    /// Free and coming slots cover the queue, or nothing may start: wait.
    Wait,
    /// Start members, in this order, until enough slots are on their way.
    Start(Starts),
}

/// The starts a pool tries, in order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Starts {
    /// Usable stopped members, not backing off, each once: asleep ones first, since a wake costs
    /// a fraction of a cold start.
    pub order: Vec<String>,
    /// Slots on members already starting.
    pub coming: usize,
    /// Stop trying once this many slots are on their way; `None` starts them all (`startAll`).
    pub target: Option<usize>,
}

/// Decides the growth of a pool whose queue holds `waiting` requests.
pub(super) fn plan_growth(members: &[Member], waiting: usize, start_all: bool) -> Growth {
    let ready_free: usize = members
        .iter()
        .filter(|m| m.phase == PhaseName::Ready && m.usable)
        .map(|m| m.free)
        .sum();
    // a member the request passed over still brings its slots for the others in the queue
    let coming: usize = members
        .iter()
        .filter(|m| m.phase == PhaseName::Starting)
        .map(|m| m.slots)
        .sum();
    let alive = members
        .iter()
        .any(|m| m.phase != PhaseName::Stopped && m.usable);
    let mut startable: Vec<&Member> = members
        .iter()
        .filter(|m| m.phase == PhaseName::Stopped && !m.backing_off && m.usable)
        .collect();
    startable.sort_by_key(|m| !m.asleep);
    let order: Vec<String> = startable.iter().map(|m| m.id.clone()).collect();
    if !alive && order.is_empty() {
        return Growth::NoneCanServe;
    }
    let demand = waiting.saturating_sub(ready_free);
    let covered = demand == 0 || (!start_all && coming >= demand);
    if (alive && covered) || order.is_empty() {
        return Growth::Wait;
    }
    Growth::Start(Starts {
        order,
        coming,
        // with nothing alive, one start is needed whatever the count says
        target: (!start_all).then_some(demand.max(1)),
    })
}

impl Starts {
    /// Tries the starts in order until `target` slots are on their way. `start` tries one member
    /// and gives its slots when it did start (a swap or memory may hold it back).
    pub fn carry_out(&self, mut start: impl FnMut(&str) -> Option<usize>) {
        let mut capacity = self.coming;
        for id in &self.order {
            if let Some(slots) = start(id) {
                capacity += slots;
            }
            if self.target.is_some_and(|t| capacity >= t) {
                break;
            }
        }
    }
}

#[cfg(test)]
#[path = "grow_plan_tests.rs"]
mod tests;
