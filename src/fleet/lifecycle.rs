//! Each model's lifecycle status, derived from its instances, and the events that tell of changes.
//!
//! The status is a pure function of a fleet snapshot ([`status_of`]), so it is the same whether
//! `/v1/models`, `/api/models/<id>`, the metrics or the event stream asks. A task follows the
//! fleet's changes and publishes `status_changed` when a model's status moves; the instance task
//! itself publishes `launched`, `destroyed` and `error`, which must not be missed between two
//! looks at the state.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, Weak};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::{Inner, PhaseName, Snapshot};

/// Where a model is in its life, with the names hosts of LLM deployments use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::EnumIter, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum ModelStatus {
    /// Requests wait for it, but nothing is starting yet: waiting for memory or a swap.
    Pending,
    /// Its weights are being fetched.
    Downloading,
    /// An engine is starting and none is ready yet.
    Deploying,
    /// Every instance that runs is ready.
    Active,
    /// Some instances are ready, others starting or failed.
    Degraded,
    /// Its engine sleeps, its device memory freed: the next request wakes it.
    Sleeping,
    /// Nothing runs.
    Inactive,
    /// Its last start failed and nothing runs; the reason says why.
    Error,
}

impl ModelStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A status and, for `error` and `degraded`, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub status: ModelStatus,
    pub reason: Option<String>,
    /// Instances ready to serve, and how many the model has.
    pub ready: usize,
    pub members: usize,
}

/// The status of a model from its instances' snapshots and the requests queued for its pool.
pub fn status_of(members: &[&Snapshot], queued: usize) -> Status {
    let ready = members
        .iter()
        .filter(|s| s.state == PhaseName::Ready)
        .count();
    let with = |status, reason| Status {
        status,
        reason,
        ready,
        members: members.len(),
    };
    let failed = |s: &&&Snapshot| s.state == PhaseName::Stopped && s.failures > 0;
    let first_error = || {
        members
            .iter()
            .filter(failed)
            .find_map(|s| s.last_error.clone())
    };
    let starting = members.iter().any(|s| s.state == PhaseName::Starting);
    if members.iter().any(|s| s.download.is_some()) {
        return with(ModelStatus::Downloading, None);
    }
    if ready > 0 {
        return match first_error() {
            Some(e) => with(ModelStatus::Degraded, Some(e)),
            None if starting => with(ModelStatus::Degraded, Some("replicas starting".into())),
            None => with(ModelStatus::Active, None),
        };
    }
    if starting {
        return with(ModelStatus::Deploying, None);
    }
    if members.iter().any(|s| s.state == PhaseName::Sleeping) {
        return with(ModelStatus::Sleeping, None);
    }
    if let Some(e) = first_error() {
        return with(ModelStatus::Error, Some(e));
    }
    let waiting = queued + members.iter().map(|s| s.waiting).sum::<usize>();
    if waiting > 0 {
        return with(ModelStatus::Pending, None);
    }
    with(ModelStatus::Inactive, None)
}

/// Every model's status in a snapshot, by model id.
pub fn statuses(
    snapshot: &[Snapshot],
    queues: &BTreeMap<String, usize>,
) -> BTreeMap<String, Status> {
    let mut by_model: BTreeMap<&str, Vec<&Snapshot>> = BTreeMap::new();
    for s in snapshot {
        by_model.entry(&s.model).or_default().push(s);
    }
    by_model
        .into_iter()
        .map(|(model, members)| {
            let queued = queues.get(model).copied().unwrap_or(0);
            (model.to_string(), status_of(&members, queued))
        })
        .collect()
}

/// Lifecycle events kept for a late reader (the dashboard's events page).
const KEPT: usize = 256;

/// Published lifecycle events: a live stream and the most recent few.
pub struct Lifecycle {
    sender: broadcast::Sender<Value>,
    recent: Mutex<VecDeque<Value>>,
    last: Mutex<BTreeMap<String, Status>>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            sender: broadcast::channel(1024).0,
            recent: Mutex::new(VecDeque::new()),
            last: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Lifecycle {
    /// Publishes one event: `kind` is `launched`, `status_changed`, `destroyed` or `error`.
    pub fn publish(&self, kind: &str, model: &str, mut fields: Value) {
        fields["type"] = json!(kind);
        fields["model"] = json!(model);
        fields["at"] = json!(crate::clock::rfc3339::format(std::time::SystemTime::now()));
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(fields.clone());
        drop(recent);
        let _ = self.sender.send(fields);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Value> {
        self.sender.subscribe()
    }

    /// The most recent events, oldest first.
    pub fn recent(&self) -> Vec<Value> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().cloned().collect()
    }

    /// Compares `now` with the statuses seen last and publishes a `status_changed` for each move,
    /// and a `nodes_scaled` when the ready replicas of a pool grow or shrink.
    fn observe(&self, now: BTreeMap<String, Status>) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for (model, status) in &now {
            let before = last.get(model);
            let from = before.map_or(ModelStatus::Inactive, |s| s.status);
            if from != status.status {
                let fields = json!({"from": from.as_str(), "to": status.status.as_str(),
                    "reason": status.reason});
                self.publish("status_changed", model, fields);
            }
            let was_ready = before.map_or(0, |s| s.ready);
            if status.members > 1 && was_ready != status.ready {
                let fields =
                    json!({"from": was_ready, "to": status.ready, "replicas": status.members});
                self.publish("nodes_scaled", model, fields);
            }
        }
        *last = now;
    }
}

/// Follows the fleet's changes until the fleet is gone, publishing status changes.
pub(super) async fn follow(inner: Weak<Inner>) {
    let Some(mut changes) = inner.upgrade().map(|i| i.generation.subscribe()) else {
        return;
    };
    loop {
        {
            let Some(inner) = inner.upgrade() else { return };
            let (snapshot, queues) = inner.statuses_input();
            inner.lifecycle.observe(statuses(&snapshot, &queues));
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(state: PhaseName) -> Snapshot {
        Snapshot {
            instance: "m".into(),
            model: "m".into(),
            state,
            slots: 1,
            free: 1,
            ..Default::default()
        }
    }

    fn failed(error: &str) -> Snapshot {
        Snapshot {
            failures: 1,
            last_error: Some(error.into()),
            ..member(PhaseName::Stopped)
        }
    }

    fn status(members: &[Snapshot], queued: usize) -> (ModelStatus, Option<String>) {
        let refs: Vec<&Snapshot> = members.iter().collect();
        let s = status_of(&refs, queued);
        (s.status, s.reason)
    }

    #[test]
    fn a_stopped_model_is_inactive_and_pending_once_requests_wait() {
        let stopped = [member(PhaseName::Stopped)];
        assert_eq!(status(&stopped, 0).0, ModelStatus::Inactive);
        assert_eq!(status(&stopped, 2).0, ModelStatus::Pending);
        let waiting = [Snapshot {
            waiting: 1,
            ..member(PhaseName::Stopped)
        }];
        assert_eq!(status(&waiting, 0).0, ModelStatus::Pending);
    }

    #[test]
    fn starting_then_ready() {
        assert_eq!(
            status(&[member(PhaseName::Starting)], 0).0,
            ModelStatus::Deploying
        );
        let pool = [member(PhaseName::Ready), member(PhaseName::Stopped)];
        assert_eq!(
            status(&pool, 0).0,
            ModelStatus::Active,
            "idle replicas are fine"
        );
    }

    #[test]
    fn a_pool_with_a_failed_or_starting_replica_is_degraded() {
        let pool = [member(PhaseName::Ready), failed("exited (1)")];
        assert_eq!(
            status(&pool, 0),
            (ModelStatus::Degraded, Some("exited (1)".into()))
        );
        let pool = [member(PhaseName::Ready), member(PhaseName::Starting)];
        assert_eq!(status(&pool, 0).0, ModelStatus::Degraded);
    }

    #[test]
    fn a_failed_start_is_an_error_with_its_reason_even_with_requests_waiting() {
        assert_eq!(
            status(&[failed("out of GPU memory")], 3),
            (ModelStatus::Error, Some("out of GPU memory".into()))
        );
        let retrying = [failed("x"), member(PhaseName::Starting)];
        assert_eq!(status(&retrying, 0).0, ModelStatus::Deploying);
    }

    #[test]
    fn a_sleeping_engine_makes_a_sleeping_model_and_its_wake_a_deploying_one() {
        assert_eq!(
            status(&[member(PhaseName::Sleeping)], 0).0,
            ModelStatus::Sleeping
        );
        let pool = [member(PhaseName::Sleeping), member(PhaseName::Ready)];
        assert_eq!(status(&pool, 0).0, ModelStatus::Active);
    }

    #[test]
    fn downloading_comes_first() {
        let fetching = [Snapshot {
            download: Some(super::super::Download::default()),
            ..member(PhaseName::Starting)
        }];
        assert_eq!(status(&fetching, 0).0, ModelStatus::Downloading);
    }

    #[test]
    fn each_move_is_published_once_with_from_and_to() {
        let lifecycle = Lifecycle::default();
        let mut rx = lifecycle.subscribe();
        let one = |s| {
            BTreeMap::from([(
                "m".to_string(),
                Status {
                    status: s,
                    reason: None,
                    ready: 0,
                    members: 1,
                },
            )])
        };
        lifecycle.observe(one(ModelStatus::Inactive));
        lifecycle.observe(one(ModelStatus::Deploying));
        lifecycle.observe(one(ModelStatus::Deploying));
        lifecycle.observe(one(ModelStatus::Active));
        let first = rx.try_recv().unwrap();
        assert_eq!(
            (
                first["type"].as_str(),
                first["from"].as_str(),
                first["to"].as_str()
            ),
            (Some("status_changed"), Some("inactive"), Some("deploying"))
        );
        let second = rx.try_recv().unwrap();
        assert_eq!(
            (second["from"].as_str(), second["to"].as_str()),
            (Some("deploying"), Some("active"))
        );
        assert!(rx.try_recv().is_err(), "no event without a change");
        assert_eq!(lifecycle.recent().len(), 2);
    }

    #[test]
    fn a_pool_that_gains_or_loses_ready_replicas_is_scaled() {
        let lifecycle = Lifecycle::default();
        let mut rx = lifecycle.subscribe();
        let pool = |ready| {
            let status = Status {
                status: ModelStatus::Active,
                reason: None,
                ready,
                members: 3,
            };
            BTreeMap::from([("p".to_string(), status)])
        };
        for ready in [1, 3, 3, 2] {
            lifecycle.observe(pool(ready));
        }
        let scaled: Vec<(u64, u64)> = std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|e| e["type"] == "nodes_scaled")
            .map(|e| (e["from"].as_u64().unwrap(), e["to"].as_u64().unwrap()))
            .collect();
        assert_eq!(scaled, [(0, 1), (1, 3), (3, 2)]);
    }
}
