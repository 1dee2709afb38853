//! Idle times that requests set (Ollama's `keep_alive`) in place of a model's `ttl`, for the run
//! of an instance they were set in, and when each running instance is due to unload for idleness.
//! The TTL loop (`stop.rs`) reads them through [`super::instance::Instance::ttl`].

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::Fleet;

impl Fleet {
    /// From now on, the running instances of `model` unload after `ttl` idle (`None`: never),
    /// until each stops: a start goes back to the model's `ttl`. A zero unloads each as soon as
    /// the requests on it are done. Returns how many instances took it.
    pub fn keep_alive(&self, model: &str, ttl: Option<Duration>) -> usize {
        let mut st = self.inner.lock();
        let running = st
            .instances
            .values_mut()
            .filter(|i| *i.model.id == *model && !i.phase.is_stopped() && !i.is_stopping());
        let mut set = 0;
        for inst in running {
            inst.keep_alive = Some((inst.generation, ttl));
            set += 1;
        }
        set
    }

    /// When each instance that is not stopped is due to unload for idleness, by instance id:
    /// `None` for one that never is. A busy one counts its idle time from now, the earliest its
    /// requests could end.
    pub fn idle_deadlines(&self) -> BTreeMap<String, Option<SystemTime>> {
        let st = self.inner.lock();
        let now = SystemTime::now();
        st.instances
            .values()
            .filter(|i| !i.phase.is_stopped())
            .map(|i| {
                let idle_since = match i.in_flight + i.reserved {
                    0 => now.checked_sub(i.last_used.elapsed()).unwrap_or(now),
                    _ => now,
                };
                let due = i.ttl().and_then(|ttl| idle_since.checked_add(ttl));
                (i.id.to_string(), due)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fleet, make_ready};
    use super::*;

    const YAML: &str = "models:\n  m: {cmd: srv, proxy: 'http://h:1', ttl: 60}\n  other: {cmd: srv, proxy: 'http://h:2'}\n";

    #[tokio::test]
    async fn a_keep_alive_replaces_the_ttl_for_the_run_it_was_set_in() {
        let fleet = fleet(YAML);
        let ttl = |f: &Fleet| f.inner.lock().instances["m"].ttl();
        assert_eq!(
            fleet.keep_alive("m", None),
            0,
            "a stopped instance takes none"
        );
        assert_eq!(ttl(&fleet), Some(Duration::from_secs(60)));
        let _engine = make_ready(&fleet, "m");
        assert_eq!(fleet.keep_alive("m", None), 1);
        assert_eq!(ttl(&fleet), None, "kept loaded");
        assert_eq!(fleet.keep_alive("m", Some(Duration::ZERO)), 1);
        assert_eq!(ttl(&fleet), Some(Duration::ZERO));
        fleet
            .inner
            .lock()
            .instances
            .get_mut("m")
            .unwrap()
            .generation += 1;
        assert_eq!(
            ttl(&fleet),
            Some(Duration::from_secs(60)),
            "the next run goes back to the model's ttl"
        );
    }

    #[tokio::test]
    async fn idle_deadlines_follow_the_ttl_in_force() {
        let fleet = fleet(YAML);
        assert!(fleet.idle_deadlines().is_empty(), "nothing runs");
        let (_m, _other) = (make_ready(&fleet, "m"), make_ready(&fleet, "other"));
        let deadlines = fleet.idle_deadlines();
        assert_eq!(deadlines["other"], None, "no ttl: never");
        let due = deadlines["m"].expect("a ttl of 60s");
        let left = due.duration_since(SystemTime::now()).unwrap();
        assert!(left > Duration::from_secs(55) && left <= Duration::from_secs(60));
        fleet.keep_alive("m", Some(Duration::from_secs(600)));
        let due = fleet.idle_deadlines()["m"].unwrap();
        assert!(due.duration_since(SystemTime::now()).unwrap() > Duration::from_secs(590));
    }
}
