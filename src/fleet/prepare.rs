//! What one try of a request decides under the lock: whether its instance is ready, or which
//! conflicting instances to stop for a swap, whether to wait its turn, and when to start it.
//! Shared by the direct path (`acquire.rs`) and the pool path (`pool.rs`).

use super::lease::Turn;
use super::phase::Rest;
use super::room_plan::Load;
use super::swap_plan::{plan_swap, Conflict, SwapPlan};
use super::{Fleet, PhaseName, Retire, State, StopReason};
use crate::config::catalog::swap;

/// The outcome of one try: ready, or what the request waits for.
pub(super) enum Prepared {
    Ready,
    Started(u64),
    Starting(u64),
    Waiting,
    Blocked,
    /// Memory is held by busy instances; waiting may help.
    NoRoom(String),
    /// The model can never fit on the devices.
    NeverFits(String),
    /// A reload removed the instance, which has now stopped.
    Removed,
}

impl Fleet {
    /// Under the lock: is `id` ready with nothing to evict, or what must happen first.
    pub(super) fn prepare(&self, st: &mut State, id: &str, turn: Option<u64>) -> Prepared {
        if st.instances[id].retire != Retire::No {
            self.retire_idle(st);
            match st.instances.get(id) {
                None => return Prepared::Removed,
                Some(i) if i.retire != Retire::No => return Prepared::Waiting,
                Some(_) => {}
            }
        }
        let rest = st.instances[id].phase.rest();
        if rest == Some(Rest::Falling) {
            return Prepared::Waiting; // woken once asleep
        }
        // an asleep instance is brought back as a stopped one is, by a wake instead of a start
        let asleep = rest == Some(Rest::Asleep);
        let phase = match asleep {
            true => PhaseName::Stopped,
            false => st.instances[id].phase.name(),
        };
        let conflicts = conflicts_seen(st, id);
        let outranked =
            phase == PhaseName::Stopped && turn.is_some_and(|t| self.outranked(st, id, t));
        let stops = match plan_swap(phase, outranked, &conflicts) {
            SwapPlan::Ready => return Prepared::Ready,
            SwapPlan::Blocked => return Prepared::Blocked,
            SwapPlan::Outranked => return Prepared::Waiting,
            SwapPlan::Swap { start: true, .. } => {
                return match self.make_room(st, id) {
                    Some(blocked) => blocked,
                    None if asleep => Prepared::Starting(self.wake(st, id)),
                    None => Prepared::Started(self.start(st, id)),
                };
            }
            SwapPlan::Swap { stops, .. } => stops,
        };
        let grace = st.config.health_check_timeout;
        for c in &stops {
            self.put_away(st, c, grace, StopReason::Swap);
        }
        match phase {
            PhaseName::Starting => Prepared::Starting(st.instances[id].generation),
            _ => Prepared::Waiting,
        }
    }

    /// A place among the requests waiting for swaps, ranked by `fifo.priority`, then arrival.
    pub(super) fn take_turn(&self, st: &mut State, id: &str) -> Turn {
        let priority = st.instances.get(id).map_or(0, |i| {
            let names =
                std::iter::once(&*i.model.id).chain(i.model.aliases.iter().map(String::as_str));
            names
                .filter_map(|n| st.config.fifo_priority.get(n))
                .copied()
                .max()
                .unwrap_or(0)
        });
        st.next_ticket += 1;
        let seq = st.next_ticket;
        st.waiting.insert(seq, (priority, id.to_string()));
        Turn {
            inner: self.inner.clone(),
            seq,
        }
    }

    /// True when a request that ranks higher waits for a model that conflicts with `id`: it swaps first.
    fn outranked(&self, st: &State, id: &str, seq: u64) -> bool {
        let Some(&(mine, _)) = st.waiting.get(&seq) else {
            return false;
        };
        st.waiting.iter().any(|(other_seq, (prio, other))| {
            let ahead = *prio > mine || (*prio == mine && *other_seq < seq);
            ahead
                && other != id
                && st.instances.get(other).is_some_and(|o| !o.phase.is_ready())
                && !swap::conflicts(&st.config, &st.catalog, other, [id]).is_empty()
        })
    }
}

/// An instance that must not be evicted: it has requests in flight or waiting for it.
pub(super) fn busy(st: &State, id: &str) -> bool {
    load_of(st, id).busy(st.instances[id].phase.name())
}

/// The requests that hold `id`: its own, and its pool's waiting ones.
pub(super) fn load_of(st: &State, id: &str) -> Load {
    let i = &st.instances[id];
    let pool_waiting = i
        .pool
        .as_ref()
        .is_some_and(|p| st.pools.get(p).is_some_and(|p| !p.queue.is_empty()));
    Load {
        in_flight: i.in_flight,
        reserved: i.reserved,
        pool_waiting,
    }
}

/// The running instances that conflict with `id`, as the swap decision sees them: an asleep one
/// holds no place (its memory is the ledger's business), one falling asleep is on its way out.
fn conflicts_seen(st: &State, id: &str) -> Vec<Conflict> {
    let running = st
        .instances
        .iter()
        .filter(|(_, i)| !i.phase.is_stopped() && !i.phase.is_asleep())
        .map(|(k, _)| k.as_str());
    swap::conflicts(&st.config, &st.catalog, id, running)
        .into_iter()
        .map(|c| {
            let i = &st.instances[&c];
            Conflict {
                busy: busy(st, &c),
                phase: i.phase.name(),
                stopping: i.is_stopping() || i.phase.rest().is_some(),
                id: c,
            }
        })
        .collect()
}
