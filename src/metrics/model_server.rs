//! The gauges an inference gateway's endpoint picker reads from each model server (the Gateway API
//! Inference Extension's model server protocol): requests waiting, requests running, and how full
//! the KV cache is, per pod and per model. With `vllmMetricNames: true` the pod totals are also
//! published under vLLM's names, for pickers that only know vLLM: KV-cache use under both the
//! name vLLM uses now and the one it used before (`vllm:gpu_cache_usage_perc`), which is what the
//! Gateway API Inference Extension's picker reads by default in v1.0.x and earlier.
//!
//! KV-cache use is the share of slots busy on ready instances: llama-server gives each slot its
//! part of the context up front, so a busy slot holds at most its part of the cache.

use std::collections::BTreeMap;

use prometheus::{Gauge, GaugeVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::fleet::{PhaseName, Snapshot};

/// Work and cache use, summed over what it covers.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Load {
    pub waiting: usize,
    pub running: usize,
    busy_slots: usize,
    slots: usize,
}

impl Load {
    /// The fraction of the KV cache in use, 0 to 1 (0 with nothing loaded).
    pub fn kv_cache_usage(&self) -> f64 {
        match self.slots {
            0 => 0.0,
            n => self.busy_slots as f64 / n as f64,
        }
    }

    fn add(&mut self, other: Load) {
        self.waiting += other.waiting;
        self.running += other.running;
        self.busy_slots += other.busy_slots;
        self.slots += other.slots;
    }
}

/// Each model's load, and the pod's: corral's own requests running and waiting (in a pool's queue,
/// or for a load or a swap), and the slots busy on ready instances.
pub fn loads(
    snapshot: &[Snapshot],
    queues: &BTreeMap<String, usize>,
) -> (BTreeMap<String, Load>, Load) {
    let (mut models, mut pod) = (BTreeMap::<String, Load>::new(), Load::default());
    for s in snapshot {
        models
            .entry(s.model.clone())
            .or_default()
            .add(instance_load(s));
        // members of an implicit pool (`chat-0`, `chat-1`) also count for the pool (`chat`)
        if let Some(pool) = s.pool.as_ref().filter(|p| **p != s.model) {
            models
                .entry(pool.clone())
                .or_default()
                .add(instance_load(s));
        }
        pod.add(instance_load(s));
    }
    for (pool, waiting) in queues {
        models.entry(pool.clone()).or_default().waiting += waiting;
        pod.waiting += waiting;
    }
    (models, pod)
}

fn instance_load(s: &Snapshot) -> Load {
    let ready = s.state == PhaseName::Ready;
    Load {
        waiting: s.waiting,
        running: s.in_flight,
        busy_slots: if ready {
            s.slots - s.free.min(s.slots)
        } else {
            0
        },
        slots: if ready { s.slots } else { 0 },
    }
}

/// The picker's gauges, in corral's names (and vLLM's, in a registry of their own).
pub struct Gauges {
    waiting: IntGauge,
    running: IntGauge,
    kv: Gauge,
    model_waiting: IntGaugeVec,
    model_running: IntGaugeVec,
    model_kv: GaugeVec,
    vllm: Registry,
    vllm_waiting: Gauge,
    vllm_running: Gauge,
    vllm_kv: Gauge,
    vllm_gpu_kv: Gauge,
    /// The models (and pools) the per-model gauges were last set for.
    models: crate::metrics::LabelSets,
}

fn int(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid");
    r.register(Box::new(g.clone())).expect("unique");
    g
}

fn float(r: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid");
    r.register(Box::new(g.clone())).expect("unique");
    g
}

/// A gauge per model.
fn int_by_model(r: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), &["model"]).expect("valid");
    r.register(Box::new(g.clone())).expect("unique");
    g
}

fn float_by_model(r: &Registry, name: &str, help: &str) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), &["model"]).expect("valid");
    r.register(Box::new(g.clone())).expect("unique");
    g
}

impl Gauges {
    pub fn new(r: &Registry) -> Gauges {
        let vllm = Registry::new();
        Gauges {
            waiting: int(
                r,
                "corral_requests_waiting",
                "Requests waiting in this corral: in pool queues and for loads or swaps.",
            ),
            running: int(
                r,
                "corral_requests_running",
                "Requests this corral is serving.",
            ),
            kv: float(
                r,
                "corral_kv_cache_usage_ratio",
                "Share of the KV cache in use across ready instances (busy slots), 0 to 1.",
            ),
            model_waiting: int_by_model(
                r,
                "corral_model_requests_waiting",
                "Requests waiting for a model or pool.",
            ),
            model_running: int_by_model(
                r,
                "corral_model_requests_running",
                "Requests a model or pool is serving.",
            ),
            model_kv: float_by_model(
                r,
                "corral_model_kv_cache_usage_ratio",
                "Share of a model's KV cache in use (busy slots of its ready instances), 0 to 1.",
            ),
            vllm_waiting: float(
                &vllm,
                "vllm:num_requests_waiting",
                "Requests waiting (corral_requests_waiting).",
            ),
            vllm_running: float(
                &vllm,
                "vllm:num_requests_running",
                "Requests running (corral_requests_running).",
            ),
            vllm_kv: float(
                &vllm,
                "vllm:kv_cache_usage_perc",
                "KV cache in use, 0 to 1 (corral_kv_cache_usage_ratio).",
            ),
            vllm_gpu_kv: float(
                &vllm,
                "vllm:gpu_cache_usage_perc",
                "KV cache in use, 0 to 1 (corral_kv_cache_usage_ratio), under vLLM's older name.",
            ),
            vllm,
            models: Default::default(),
        }
    }

    /// Sets every gauge from the fleet's state.
    pub fn update(&self, snapshot: &[Snapshot], queues: &BTreeMap<String, usize>) {
        let (models, pod) = loads(snapshot, queues);
        for (model, load) in &models {
            self.model_waiting
                .with_label_values(&[model])
                .set(load.waiting as i64);
            self.model_running
                .with_label_values(&[model])
                .set(load.running as i64);
            self.model_kv
                .with_label_values(&[model])
                .set(load.kv_cache_usage());
        }
        for gone in self
            .models
            .replace(models.keys().map(|m| vec![m.clone()]).collect())
        {
            let _ = self.model_waiting.remove_label_values(&[&gone[0]]);
            let _ = self.model_running.remove_label_values(&[&gone[0]]);
            let _ = self.model_kv.remove_label_values(&[&gone[0]]);
        }
        self.waiting.set(pod.waiting as i64);
        self.running.set(pod.running as i64);
        self.kv.set(pod.kv_cache_usage());
        self.vllm_waiting.set(pod.waiting as f64);
        self.vllm_running.set(pod.running as f64);
        self.vllm_kv.set(pod.kv_cache_usage());
        self.vllm_gpu_kv.set(pod.kv_cache_usage());
    }

    /// The vLLM-named copies, as exposition families.
    pub fn vllm_families(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.vllm.gather()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(
        model: &str,
        state: PhaseName,
        slots: usize,
        free: usize,
        in_flight: usize,
        waiting: usize,
    ) -> Snapshot {
        Snapshot {
            instance: format!("{model}-x"),
            model: model.into(),
            state,
            in_flight,
            waiting,
            slots,
            free,
            ..Default::default()
        }
    }

    #[test]
    fn loads_sum_per_model_and_per_pod() {
        let snapshot = [
            instance("a", PhaseName::Ready, 4, 1, 3, 0),
            instance("a", PhaseName::Ready, 4, 4, 0, 0),
            instance("b", PhaseName::Starting, 2, 0, 0, 2),
        ];
        let queues = BTreeMap::from([("a".to_string(), 5)]);
        let (models, pod) = loads(&snapshot, &queues);
        assert_eq!((models["a"].running, models["a"].waiting), (3, 5));
        assert_eq!(models["a"].kv_cache_usage(), 3.0 / 8.0);
        assert_eq!(
            (models["b"].waiting, models["b"].kv_cache_usage()),
            (2, 0.0),
            "not loaded: no cache"
        );
        assert_eq!((pod.running, pod.waiting), (3, 7));
        assert_eq!(pod.kv_cache_usage(), 3.0 / 8.0);
    }

    /// Every vLLM-named gauge and its value, from what `vllm_families` exposes.
    fn vllm_values(g: &Gauges) -> BTreeMap<String, f64> {
        g.vllm_families()
            .iter()
            .map(|f| {
                (
                    f.name().to_string(),
                    f.get_metric()[0].get_gauge().get_value(),
                )
            })
            .collect()
    }

    #[test]
    fn kv_cache_use_is_published_under_both_of_vllms_names() {
        let g = Gauges::new(&Registry::new());
        let snapshot = [
            instance("a", PhaseName::Ready, 4, 1, 3, 1),
            instance("b", PhaseName::Ready, 4, 4, 0, 0),
        ];
        g.update(&snapshot, &BTreeMap::new());
        let values = vllm_values(&g);
        assert_eq!(
            values,
            BTreeMap::from([
                ("vllm:gpu_cache_usage_perc".to_string(), 3.0 / 8.0),
                ("vllm:kv_cache_usage_perc".to_string(), 3.0 / 8.0),
                ("vllm:num_requests_running".to_string(), 3.0),
                ("vllm:num_requests_waiting".to_string(), 1.0),
            ])
        );
    }
}
