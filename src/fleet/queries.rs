//! Read-only questions about the fleet: its config, readiness, queues and lifecycle statuses.
//! Each takes the lock briefly and decides nothing, so they sit apart from the scheduling.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::snapshot::{snapshot_of, Snapshot};
use super::{lifecycle, Fleet, Inner};
use crate::config::catalog::{Catalog, Target};
use crate::config::Config;
use crate::logs::LogRing;

impl Fleet {
    pub fn config(&self) -> Arc<Config> {
        self.inner.lock().config.clone()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.inner.lock().catalog.clone()
    }

    /// The log ring of one instance's process output (the first replica's for a replicated model).
    pub fn instance_logs(&self, id: &str) -> Option<Arc<LogRing>> {
        let state = self.inner.lock();
        state
            .instances
            .get(id)
            .or_else(|| state.instances.get(&format!("{id}-0")))
            .map(|i| i.logs.clone())
    }

    /// True when the target has a ready instance.
    pub fn is_ready(&self, target: &Target) -> bool {
        let st = self.inner.lock();
        match target {
            Target::Instance(id) => st.instances.get(&**id).is_some_and(|i| i.phase.is_ready()),
            Target::Pool(p) => st
                .pools
                .get(&**p)
                .is_some_and(|p| p.members.iter().any(|m| st.instances[m].phase.is_ready())),
        }
    }

    /// The base URL of a ready instance of the target, if there is one.
    pub fn ready_proxy(&self, target: &Target) -> Option<String> {
        let st = self.inner.lock();
        let members: Vec<&str> = match target {
            Target::Instance(id) => vec![id],
            Target::Pool(p) => st
                .pools
                .get(&**p)?
                .members
                .iter()
                .map(String::as_str)
                .collect(),
        };
        members
            .into_iter()
            .filter_map(|m| st.instances.get(m))
            .find(|i| i.phase.is_ready())
            .map(|i| i.proxy.to_string())
    }

    /// A receiver that changes whenever any instance does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// Requests waiting in each pool's queue.
    pub fn queue_depths(&self) -> BTreeMap<String, usize> {
        self.inner
            .lock()
            .pools
            .iter()
            .map(|(k, p)| (k.clone(), p.queue.len()))
            .collect()
    }

    /// Each model's lifecycle status, by model id.
    pub fn statuses(&self) -> BTreeMap<String, lifecycle::Status> {
        let (snapshot, queues) = self.inner.statuses_input();
        lifecycle::statuses(&snapshot, &queues)
    }

    /// Lifecycle events as they happen.
    pub fn lifecycle_events(&self) -> tokio::sync::broadcast::Receiver<serde_json::Value> {
        self.inner.lifecycle.subscribe()
    }

    /// The most recent lifecycle events, oldest first.
    pub fn recent_lifecycle_events(&self) -> Vec<serde_json::Value> {
        self.inner.lifecycle.recent()
    }
}

impl Inner {
    /// A snapshot and each model's queued requests, what lifecycle statuses are computed from.
    pub(super) fn statuses_input(&self) -> (Vec<Snapshot>, BTreeMap<String, usize>) {
        let st = self.lock();
        let queues = st
            .pools
            .values()
            .map(|p| {
                let model = st.instances[&p.members[0]].model.id.to_string();
                (model, p.queue.len())
            })
            .collect();
        (snapshot_of(&st), queues)
    }
}
