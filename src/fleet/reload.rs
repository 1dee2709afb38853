//! Applying a new config while running: which instances keep their process, which are replaced
//! or removed once idle. Kept apart because it is the one path that rebuilds the fleet's state.

use std::sync::Arc;

use super::build::{build_instances, build_pools, same_process};
use super::instance::Instance;
use super::{weights, Fleet, PhaseName, Retire, State, StopReason};
use crate::config::catalog::Catalog;
use crate::config::Config;

impl Fleet {
    /// Applies a new config. Instances whose process would be the same keep running and serving;
    /// changed ones finish their requests and restart with the new command; removed ones stop
    /// once idle. Requests waiting in a pool that still exists keep their place.
    pub fn reconfigure(&self, config: Arc<Config>) {
        let catalog = Arc::new(Catalog::new(&config));
        let fresh = build_instances(&config, &catalog, &self.inner.fetcher);
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let mut kept = 0;
        for (id, new) in fresh {
            match st.instances.get_mut(&id) {
                Some(old) if same_process(&old.spec, &new.spec) => {
                    old.model = new.model;
                    old.pool = new.pool;
                    old.spec.load_timeout = new.spec.load_timeout;
                    old.spec.stall = new.spec.stall;
                    old.spec.extend_on_progress = new.spec.extend_on_progress;
                    if old.measured.is_none() {
                        old.need = new.need;
                    }
                    old.retire = Retire::No;
                    kept += 1;
                }
                Some(old) if old.phase.is_stopped() => succeed(old, new),
                Some(old) => old.retire = Retire::Replace(Box::new(new)),
                None => {
                    st.instances.insert(id, new);
                }
            }
        }
        let known: std::collections::BTreeSet<String> = catalog.instances.keys().cloned().collect();
        st.instances
            .retain(|id, i| known.contains(id) || !i.phase.is_stopped());
        for (id, i) in st.instances.iter_mut() {
            if !known.contains(id) {
                i.retire = Retire::Remove;
            }
        }
        let mut old_pools = std::mem::take(&mut st.pools);
        st.pools = build_pools(&config, &catalog, &mut old_pools);
        st.config = config;
        st.catalog = catalog;
        tracing::info!("config applied: {kept} running or stopped instance(s) kept as they were");
        drop(guard);
        weights::size_before_download(&self.inner);
        self.inner.touch();
    }

    /// Stops retired instances once no request is in flight there, and swaps in their successors
    /// once stopped. Requests that wait for a retired instance (a reservation, a place in its
    /// pool's queue) do not hold it: they want its successor, or, when it was removed, an answer.
    /// A changed pool keeps a ready replica throughout (`start_successors`, `stands_in`).
    pub(super) fn retire_idle(&self, st: &mut State) {
        let retired = |st: &State| -> Vec<String> {
            let ids = st.instances.iter().filter(|(_, i)| i.retire != Retire::No);
            ids.map(|(k, _)| k.clone()).collect()
        };
        for id in retired(st) {
            let inst = st.instances.get_mut(&id).expect("listed");
            if !inst.phase.is_stopped() {
                continue;
            }
            match std::mem::replace(&mut inst.retire, Retire::No) {
                Retire::Replace(next) => succeed(inst, *next),
                Retire::Remove => {
                    st.instances.remove(&id);
                }
                Retire::No => {}
            }
        }
        self.start_successors(st);
        for id in retired(st) {
            let stands_in = stands_in(st, &id);
            let inst = st.instances.get_mut(&id).expect("listed");
            if inst.in_flight == 0 && !stands_in && !inst.phase.is_stopped() {
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Reload);
            }
        }
    }

    /// Starts a stopped member of each pool whose one ready member a reload retired, where it fits
    /// beside what runs (no swap, no eviction): the retired member serves until it is ready, then
    /// makes way (`stands_in`, `pool::draining`). A pool with one member, or no room for two,
    /// restarts it in place.
    fn start_successors(&self, st: &mut State) {
        let pools: Vec<String> = st.pools.keys().cloned().collect();
        for pool in pools {
            let members = st.pools[&pool].members.clone();
            let ready: Vec<&Instance> = members
                .iter()
                .map(|m| &st.instances[m])
                .filter(|i| i.phase.is_ready())
                .collect();
            let retiring = matches!(ready[..], [only] if only.retire != Retire::No);
            if !retiring || successor_on_its_way(st, &members) {
                continue;
            }
            let next = members.iter().find(|m| {
                let i = &st.instances[*m];
                i.retire == Retire::No
                    && i.phase.is_stopped()
                    && !i.in_backoff()
                    && self.conflict_free(st, m)
            });
            if let Some(next) = next.cloned() {
                if self.place_beside(st, &next) {
                    tracing::info!(instance = %next, "starting in place of a replica a reload changed");
                    self.start(st, &next);
                }
            }
        }
    }
}

/// True for a changed pool member that is its pool's last ready one while a successor is on its
/// way: it serves on until one is ready, rather than leave the pool with none.
fn stands_in(st: &State, id: &str) -> bool {
    let inst = &st.instances[id];
    let Some(pool) = inst.pool.as_ref().and_then(|p| st.pools.get(p)) else {
        return false;
    };
    let member = pool.members.iter().any(|m| m == id);
    let another_ready = (pool.members.iter()).any(|m| m != id && st.instances[m].phase.is_ready());
    member && inst.phase.is_ready() && !another_ready && successor_on_its_way(st, &pool.members)
}

/// True when a member that no reload retired is starting, or a retired one is stopping (its
/// successor takes its place once it has stopped, and `start_successors` starts it).
fn successor_on_its_way(st: &State, members: &[String]) -> bool {
    members.iter().any(|m| {
        let i = &st.instances[m];
        matches!(
            (i.retire == Retire::No, i.phase.name()),
            (true, PhaseName::Starting) | (false, PhaseName::Stopping)
        )
    })
}

/// Puts `next` in the place of a stopped instance. The holds that live requests have on the place
/// go with it: a waiting request's reservation, and the leases of answers still being sent (the
/// process can stop under them), each given back once when it ends. Its generations go on from
/// the old ones, so a request that waited on an old start cannot take a new one for it. It keeps
/// the old id's `Arc`, by which those holds name the instance they are on.
fn succeed(old: &mut Instance, mut next: Instance) {
    next.id = old.id.clone();
    next.reserved = old.reserved;
    next.in_flight = old.in_flight;
    next.generation = old.generation;
    *old = next;
}

#[cfg(test)]
mod tests {
    use crate::config::catalog::Target;
    use crate::fleet::phase::Phase;
    use crate::fleet::testing::{config, fleet, make_ready};

    const WITH_M: &str = "models:\n  m:\n    cmd: /bin/false\n    proxy: http://127.0.0.1:9\n";
    const WITHOUT_M: &str = "models:\n  n:\n    cmd: /bin/false\n    proxy: http://127.0.0.1:9\n";

    /// A lease on `m`, which then stops under it (its engine crashed, or was unloaded).
    async fn stopped_under_a_lease(fleet: &crate::fleet::Fleet) -> crate::fleet::Lease {
        let engine = make_ready(fleet, "m");
        let lease = fleet
            .acquire(&Target::Instance("m".into()), None)
            .await
            .expect("a ready instance serves");
        fleet.inner.lock().instances.get_mut("m").unwrap().phase = Phase::Stopped;
        drop(engine);
        lease
    }

    /// An answer still being sent when its engine stopped (it crashed, or was unloaded), its model
    /// then removed by one reload and added back by another: the answer's end gives its hold back
    /// to nothing, where it used to take it from the new instance (an underflow: a panic here, a
    /// count of `usize::MAX` requests in flight in a release build, and the model never idle).
    #[tokio::test]
    async fn a_hold_on_a_removed_model_is_not_given_back_to_its_return() {
        let fleet = fleet(WITH_M);
        let lease = stopped_under_a_lease(&fleet).await;

        fleet.reconfigure(config(WITHOUT_M));
        assert!(!fleet.inner.lock().instances.contains_key("m"));
        fleet.reconfigure(config(WITH_M));
        drop(lease);

        let st = fleet.inner.lock();
        assert_eq!(
            (st.instances["m"].in_flight, st.instances["m"].reserved),
            (0, 0)
        );
    }

    /// The successor of a stopped instance takes over the holds of the answers still being sent,
    /// and their ends give them back to it.
    #[tokio::test]
    async fn a_hold_on_a_changed_model_is_given_back_to_its_successor() {
        let fleet = fleet(WITH_M);
        let lease = stopped_under_a_lease(&fleet).await;

        fleet.reconfigure(config(&WITH_M.replace("/bin/false", "/bin/true")));
        assert_eq!(fleet.inner.lock().instances["m"].in_flight, 1);
        drop(lease);

        let st = fleet.inner.lock();
        assert_eq!(
            (st.instances["m"].in_flight, st.instances["m"].reserved),
            (0, 0)
        );
    }
}
