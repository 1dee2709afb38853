//! Prometheus metrics from one owned registry.
//!
//! Counters and histograms are updated where things happen (a request ends, a load finishes, an
//! instance stops). Gauges that describe the present (in flight, queue depth, slots, states) are
//! read from a fleet snapshot at scrape time, so scraping costs one short lock and never blocks
//! request handling. Every label value comes from the config: unknown names never become labels.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use strum::IntoEnumIterator;

use crate::fleet::counters::{stop_labels, FleetCounters};
use crate::fleet::{Phase, Snapshot};

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
    pub requests: IntCounterVec,
    pub unknown_model_requests: IntCounter,
    pub request_duration: HistogramVec,
    pub time_to_first_byte: HistogramVec,
    pub prompt_tokens: IntCounterVec,
    pub completion_tokens: IntCounterVec,
    /// The counters the fleet updates itself.
    pub fleet: FleetCounters,
    pub retries: IntCounterVec,
    pub config_reloads: IntCounterVec,
    in_flight: IntGaugeVec,
    slots_total: IntGaugeVec,
    slots_free: IntGaugeVec,
    state: IntGaugeVec,
    model_status: IntGaugeVec,
    download_progress: prometheus::GaugeVec,
    failures: IntGaugeVec,
    circuit_open: IntGaugeVec,
    queue_depth: IntGaugeVec,
    pub memory_capacity: IntGaugeVec,
    pub memory_charged: IntGaugeVec,
    pub memory_used_by_others: IntGaugeVec,
    pub memory_measured: IntGaugeVec,
    pub instance_estimate: IntGaugeVec,
    pub instance_measured: IntGaugeVec,
    system_memory: IntGaugeVec,
    load_average: prometheus::GaugeVec,
    /// What an inference gateway's endpoint picker reads.
    model_server: crate::model_server::Gauges,
    uptime: prometheus::Gauge,
    started: std::time::Instant,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric");
    r.register(Box::new(h.clone())).expect("registered once");
    h
}

fn fleet_counters(r: &Registry) -> FleetCounters {
    let stops_help = format!("Instance stops, by reason ({}).", stop_labels().join(", "));
    FleetCounters {
        starts: counter(
            r,
            "corral_instance_starts_total",
            "Instance starts, by result (ready, failed, aborted).",
            &["model", "instance", "result"],
        ),
        load_duration: histogram(
            r,
            "corral_load_duration_seconds",
            "Time from spawn to ready.",
            &["model"],
            LOAD_BUCKETS,
        ),
        stops: counter(
            r,
            "corral_instance_stops_total",
            &stops_help,
            &["model", "instance", "reason"],
        ),
        restarts: counter(
            r,
            "corral_instance_restarts_total",
            "Starts of an instance that had run before.",
            &["model", "instance"],
        ),
        ejections: counter(
            r,
            "corral_ejections_total",
            "Pool members taken out after answering server errors in a row.",
            &["model", "instance"],
        ),
        overruns: counter(
            r,
            "corral_device_overrun_total",
            "Engines that reported allocating more on a device than they were charged (beyond 10%).",
            &["device"],
        ),
        prefix_hits: counter(
            r,
            "corral_prefix_hits_total",
            "Pool requests sent to the replica that last served the longest prefix of their prompt.",
            &["model"],
        ),
        prefix_matched_bytes: counter(
            r,
            "corral_prefix_matched_bytes_total",
            "Prompt bytes of prefix hits that the chosen replica had served before.",
            &["model"],
        ),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let unknown = IntCounter::new(
            "corral_unknown_model_requests_total",
            "Requests naming no configured model (answered 404).",
        )
        .expect("valid");
        r.register(Box::new(unknown.clone()))
            .expect("registered once");
        let build = IntGauge::with_opts(
            Opts::new("corral_build_info", "Build information; always 1.")
                .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("valid");
        build.set(1);
        r.register(Box::new(build)).expect("registered once");
        let load_average = prometheus::GaugeVec::new(
            Opts::new("corral_system_load_average", "System load average."),
            &["interval"],
        )
        .expect("valid");
        r.register(Box::new(load_average.clone()))
            .expect("registered once");
        let uptime =
            prometheus::Gauge::new("corral_uptime_seconds", "Seconds since corral started.")
                .expect("valid");
        r.register(Box::new(uptime.clone()))
            .expect("registered once");
        Metrics {
            model_server: crate::model_server::Gauges::new(&r),
            requests: counter(&r, "corral_requests_total", "Requests answered, by model, route and status class.", &["model", "route", "status"]),
            unknown_model_requests: unknown,
            request_duration: histogram(&r, "corral_request_duration_seconds", "Time from request to the last byte of the response.", &["model", "route"], LATENCY_BUCKETS),
            time_to_first_byte: histogram(&r, "corral_time_to_first_byte_seconds", "Time from request to the first byte of the response body, waiting and loading included.", &["model", "route"], LATENCY_BUCKETS),
            prompt_tokens: counter(&r, "corral_prompt_tokens_total", "Prompt tokens, from the responses' usage or timings.", &["model"]),
            completion_tokens: counter(&r, "corral_completion_tokens_total", "Completion tokens, from the responses' usage or timings.", &["model"]),
            fleet: fleet_counters(&r),
            retries: counter(&r, "corral_retries_total", "Requests retried on another replica after one could not be reached.", &["model"]),
            config_reloads: counter(&r, "corral_config_reloads_total", "Config reloads, by result.", &["result"]),
            in_flight: gauge(&r, "corral_in_flight_requests", "Requests in flight, by instance.", &["model", "instance"]),
            slots_total: gauge(&r, "corral_slots", "Parallel slots of an instance.", &["model", "instance"]),
            slots_free: gauge(&r, "corral_slots_free", "Free slots of a ready instance.", &["model", "instance"]),
            state: gauge(&r, "corral_instance_state", "1 for the instance's current state, 0 for the others.", &["model", "instance", "state"]),
            download_progress: {
                let opts = Opts::new("corral_download_progress_ratio", "How far the download of a model's weights has come (0 to 1), while one runs.");
                let g = prometheus::GaugeVec::new(opts, &["model"]).expect("valid metric");
                r.register(Box::new(g.clone())).expect("registered once");
                g
            },
            model_status: gauge(&r, "corral_model_status", "1 for the model's current lifecycle status, 0 for the others.", &["model", "status"]),
            failures: gauge(&r, "corral_instance_consecutive_failures", "Failed starts or crashes in a row.", &["model", "instance"]),
            circuit_open: gauge(&r, "corral_instance_circuit_open", "1 while an instance that keeps failing is held out.", &["model", "instance"]),
            queue_depth: gauge(&r, "corral_queue_depth", "Requests waiting for a free slot in a pool.", &["pool"]),
            memory_capacity: gauge(&r, "corral_device_memory_capacity_bytes", "Usable memory of a device (capacity less reserve).", &["device"]),
            memory_charged: gauge(&r, "corral_device_memory_charged_bytes", "Memory charged to instances on a device.", &["device"]),
            memory_used_by_others: gauge(&r, "corral_device_memory_used_by_others_bytes", "Memory that programs other than corral's engines use on a device (NVML, nvidia-smi or rocm-smi).", &["device"]),
            memory_measured: gauge(&r, "corral_device_memory_measured_bytes", "Memory the engines reported allocating on a device.", &["device"]),
            instance_estimate: gauge(&r, "corral_instance_memory_estimate_bytes", "Estimated device memory of an instance.", &["model", "instance"]),
            instance_measured: gauge(&r, "corral_instance_memory_measured_bytes", "Device memory an instance reported after loading.", &["model", "instance"]),
            system_memory: gauge(&r, "corral_system_memory_bytes", "System memory (total, available).", &["kind"]),
            load_average,
            uptime,
            started: std::time::Instant::now(),
            registry: r,
        }
    }

    /// Sets each model's lifecycle status gauge: 1 for its status, 0 for every other.
    pub fn set_model_statuses(
        &self,
        statuses: &std::collections::BTreeMap<String, crate::fleet::lifecycle::Status>,
    ) {
        use crate::fleet::lifecycle::ModelStatus;
        for (model, now) in statuses {
            for status in ModelStatus::iter() {
                self.model_status
                    .with_label_values(&[model.as_str(), status.as_str()])
                    .set((now.status == status) as i64);
            }
        }
    }

    /// Registers a collector made elsewhere (the download counter of the model sources).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.register(collector).expect("registered once");
    }

    /// Each model's download progress while one runs; the series goes when the download ends.
    fn set_download_progress(&self, snapshot: &[Snapshot]) {
        let mut by_model = std::collections::BTreeMap::new();
        for s in snapshot {
            let ratio = s.download.as_ref().map(|d| match d.total {
                Some(t) if t > 0 => d.bytes as f64 / t as f64,
                _ => 0.0,
            });
            let entry = by_model.entry(s.model.as_str()).or_insert(None);
            *entry = entry.or(ratio);
        }
        for (model, ratio) in by_model {
            match ratio {
                Some(r) => self.download_progress.with_label_values(&[model]).set(r),
                None => {
                    let _ = self.download_progress.remove_label_values(&[model]);
                }
            }
        }
    }

    /// Creates each configured instance's series, so dashboards see zeros before the first event.
    pub fn register_instances(&self, snapshot: &[Snapshot]) {
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.in_flight.with_label_values(&l);
            self.slots_total.with_label_values(&l).set(s.slots as i64);
        }
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
        self.set_download_progress(snapshot);
        for (i, d) in devices.iter().enumerate() {
            self.memory_used_by_others
                .with_label_values(&[&d.name])
                .set(used_by_others.get(i).copied().unwrap_or(0) as i64);
            let (charged, measured) = crate::fleet::device_totals(snapshot, &d.name);
            self.memory_capacity
                .with_label_values(&[&d.name])
                .set(d.usable() as i64);
            self.memory_charged
                .with_label_values(&[&d.name])
                .set(charged as i64);
            self.memory_measured
                .with_label_values(&[&d.name])
                .set(measured as i64);
        }
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.instance_estimate
                .with_label_values(&l)
                .set(s.memory as i64);
            if let Some(m) = s.measured {
                self.instance_measured.with_label_values(&l).set(m as i64);
            }
        }
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.in_flight.with_label_values(&l).set(s.in_flight as i64);
            self.slots_total.with_label_values(&l).set(s.slots as i64);
            let free = if s.state == Phase::Ready { s.free } else { 0 };
            self.slots_free.with_label_values(&l).set(free as i64);
            for phase in Phase::iter() {
                self.state
                    .with_label_values(&[l[0], l[1], phase.as_str()])
                    .set((s.state == phase) as i64);
            }
            self.failures.with_label_values(&l).set(s.failures as i64);
            self.circuit_open
                .with_label_values(&l)
                .set(s.circuit_open as i64);
        }
        for (pool, depth) in queues {
            self.queue_depth
                .with_label_values(&[pool])
                .set(*depth as i64);
        }
        self.read_system();
        self.uptime.set(self.started.elapsed().as_secs_f64());
        let mut out = Vec::new();
        let mut families = self.registry.gather();
        if vllm_names {
            families.extend(self.model_server.vllm_families());
        }
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// System gauges llama-swap users chart, read cheaply from /proc.
    fn read_system(&self) {
        if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") {
            for (key, label) in [("MemTotal:", "total"), ("MemAvailable:", "available")] {
                let kib = meminfo
                    .lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<i64>().ok());
                if let Some(kib) = kib {
                    self.system_memory
                        .with_label_values(&[label])
                        .set(kib * 1024);
                }
            }
        }
        if let Ok(loadavg) = std::fs::read_to_string("/proc/loadavg") {
            for (value, interval) in loadavg.split_whitespace().zip(["1m", "5m", "15m"]) {
                if let Ok(v) = value.parse::<f64>() {
                    self.load_average.with_label_values(&[interval]).set(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "crash"
            ]
        );
        let readme = include_str!("../README.md");
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
