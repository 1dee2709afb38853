//! What one try of a request decides under the lock: whether its instance is ready, or which
//! conflicting instances to stop for a swap, whether to wait its turn, and when to start it.
//! Shared by the direct path (`acquire.rs`) and the pool path (`pool.rs`).

use super::lease::Turn;
use super::{swap, Fleet, Phase, Retire, State, StopReason};

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
}

impl Fleet {
    /// Under the lock: is `id` ready with nothing to evict, or what must happen first.
    pub(super) fn prepare(&self, st: &mut State, id: &str, turn: Option<u64>) -> Prepared {
        if st.instances[id].retire != Retire::No {
            Self::retire_idle(st);
            if st.instances[id].retire != Retire::No {
                return Prepared::Waiting;
            }
        }
        let running: Vec<&str> = st
            .instances
            .iter()
            .filter(|(_, i)| i.phase != Phase::Stopped)
            .map(|(k, _)| k.as_str())
            .collect();
        let conflicts = swap::conflicts(&st.config, &st.catalog, id, running);
        let phase = st.instances[id].phase;
        if phase == Phase::Ready && conflicts.is_empty() {
            return Prepared::Ready;
        }
        if conflicts.iter().any(|c| busy(st, c)) {
            return Prepared::Blocked;
        }
        if phase == Phase::Stopped && turn.is_some_and(|t| self.outranked(st, id, t)) {
            return Prepared::Waiting;
        }
        let grace = st.config.health_check_timeout;
        for c in &conflicts {
            st.instances
                .get_mut(c)
                .expect("known")
                .order_stop(grace, StopReason::Swap);
        }
        let all_stopped = conflicts
            .iter()
            .all(|c| st.instances[c].phase == Phase::Stopped);
        let inst = &st.instances[id];
        match phase {
            Phase::Stopped if all_stopped => match self.make_room(st, id) {
                Some(blocked) => blocked,
                None => Prepared::Started(self.start(st, id)),
            },
            Phase::Starting => Prepared::Starting(inst.generation),
            _ => Prepared::Waiting,
        }
    }

    /// A place among the requests waiting for swaps, ranked by `fifo.priority`, then arrival.
    pub(super) fn take_turn(&self, st: &mut State, id: &str) -> Turn {
        let priority = st.instances.get(id).map_or(0, |i| {
            let names = std::iter::once(&i.model.id).chain(i.model.aliases.iter());
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
                && st
                    .instances
                    .get(other)
                    .is_some_and(|o| o.phase != Phase::Ready)
                && !swap::conflicts(&st.config, &st.catalog, other, [id]).is_empty()
        })
    }
}

/// An instance that must not be evicted: it has requests in flight or waiting for it.
pub(super) fn busy(st: &State, id: &str) -> bool {
    let i = &st.instances[id];
    let pool_waiting = i
        .pool
        .as_ref()
        .is_some_and(|p| st.pools.get(p).is_some_and(|p| !p.queue.is_empty()));
    i.in_flight > 0
        || i.reserved > 0
        || (pool_waiting && matches!(i.phase, Phase::Starting | Phase::Ready))
}
