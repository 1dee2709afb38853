//! Prometheus metrics from one owned registry.
//!
//! Counters and histograms are updated where things happen (a request ends, a load finishes, an
//! instance stops). Gauges that describe the present (in flight, queue depth, slots, states) are
//! read from a fleet snapshot at scrape time, so scraping costs one short lock and never blocks
//! request handling. Every label value comes from the config: unknown names never become labels.

mod fleet;
pub(crate) mod model_server;
mod present;
mod requests;
mod system;

use prometheus::{
    core::Collector, Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::fleet::counters::FleetCounters;
use crate::fleet::Snapshot;
use present::PresentGauges;
pub use requests::{status_class, KeySeries, RequestMetrics, RequestSeries};
use system::SystemGauges;

/// Buckets for LLM latencies: milliseconds to ten minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Buckets for model loads: a tenth of a second to half an hour.
const LOAD_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

pub struct Metrics {
    registry: Registry,
    /// What model requests record.
    pub requests: RequestMetrics,
    /// The counters the fleet updates itself.
    pub fleet: FleetCounters,
    pub config_reloads: IntCounterVec,
    present: PresentGauges,
    system: SystemGauges,
    /// What an inference gateway's endpoint picker reads.
    model_server: crate::metrics::model_server::Gauges,
}

/// Registers `c` in `r` and returns it.
/// The label values a group of series was last set for. A reload can remove a model, an
/// instance (fewer replicas), a pool or a device, and a series that is no longer set would stand
/// at its last value for good: sums over it, and alerts on it, would stay wrong until a restart.
/// Gone series are removed after the current ones are set, so a scrape never misses one that
/// still exists.
#[derive(Default)]
pub(crate) struct LabelSets(Mutex<BTreeSet<Vec<String>>>);

impl LabelSets {
    /// Keeps `now` as the current label values; gives those set last time and not now.
    pub(crate) fn replace(&self, now: BTreeSet<Vec<String>>) -> Vec<Vec<String>> {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let gone = last.difference(&now).cloned().collect();
        *last = now;
        gone
    }
}

fn registered<C: Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    registered(r, HistogramVec::new(opts, labels).expect("valid metric"))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        Metrics {
            model_server: crate::metrics::model_server::Gauges::new(&r),
            requests: RequestMetrics::new(&r),
            fleet: fleet::fleet_counters(&r),
            config_reloads: counter(
                &r,
                "corral_config_reloads_total",
                "Config reloads, by result.",
                &["result"],
            ),
            present: PresentGauges::new(&r),
            system: SystemGauges::new(&r),
            registry: r,
        }
    }

    /// Sets each model's lifecycle status gauge: 1 for its status, 0 for every other.
    pub fn set_model_statuses(
        &self,
        statuses: &std::collections::BTreeMap<String, crate::fleet::lifecycle::Status>,
    ) {
        self.present.set_model_statuses(statuses);
    }

    /// Registers a collector made elsewhere (the download counter of the model sources).
    pub fn register(&self, collector: Box<dyn Collector>) {
        self.registry.register(collector).expect("registered once");
    }

    /// Creates each configured instance's series, so dashboards see zeros before the first event.
    pub fn register_instances(&self, snapshot: &[Snapshot]) {
        self.present.register_instances(snapshot);
    }

    /// Renders the text exposition, refreshing the present-tense gauges from `snapshot` first.
    pub fn render(
        &self,
        snapshot: &[Snapshot],
        queues: &std::collections::BTreeMap<String, usize>,
        devices: &[crate::config::Device],
        used_by_others: &[u64],
        vllm_names: bool,
    ) -> String {
        self.model_server.update(snapshot, queues);
        self.present
            .update(snapshot, queues, devices, used_by_others);
        self.system.update();
        let mut out = Vec::new();
        let mut families = self.registry.gather();
        if vllm_names {
            families.extend(self.model_server.vllm_families());
        }
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::counters::stop_labels;

    /// The stop reasons are pinned here, and the README's metrics table lists exactly these: a new
    /// reason fails this test until the README documents it.
    #[test]
    fn every_stop_reason_is_pinned_and_documented() {
        let labels = stop_labels();
        assert_eq!(
            labels,
            [
                "ttl",
                "swap",
                "memory",
                "unload",
                "reload",
                "shutdown",
                "unreachable",
                "ejected",
                "sleep_failed",
                "wake_failed",
                "crash"
            ]
        );
        let readme = include_str!("../../README.md");
        let row = readme
            .lines()
            .find(|l| l.starts_with("| `corral_instance_stops_total` |"))
            .expect("the README documents corral_instance_stops_total");
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let documented: std::collections::BTreeSet<&str> = cells[3].split(", ").collect();
        let existing: std::collections::BTreeSet<&str> = labels.into_iter().collect();
        assert_eq!(
            documented, existing,
            "the README row lists every reason and no other"
        );
        let metrics = Metrics::new();
        metrics
            .fleet
            .stops
            .with_label_values(&["a", "a", "ttl"])
            .inc();
        let text = metrics.render(&[], &Default::default(), &[], &[], false);
        assert!(
            text.contains(&format!("by reason ({}).", cells[3])),
            "{text}"
        );
    }

    #[test]
    fn render_includes_build_info() {
        let m = Metrics::new();
        let text = m.render(&[], &Default::default(), &[], &[], false);
        assert!(text.contains("corral_build_info{version="));
    }
}
