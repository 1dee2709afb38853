//! System gauges llama-swap users chart (memory, load average), corral's uptime and build, read
//! cheaply from /proc at scrape time.

use prometheus::{GaugeVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::{gauge, registered};

pub(super) struct SystemGauges {
    system_memory: IntGaugeVec,
    load_average: GaugeVec,
    uptime: prometheus::Gauge,
    started: std::time::Instant,
}

impl SystemGauges {
    pub(super) fn new(r: &Registry) -> SystemGauges {
        let build = IntGauge::with_opts(
            Opts::new("corral_build_info", "Build information; always 1.")
                .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("valid");
        build.set(1);
        registered(r, build);
        let load_average = GaugeVec::new(
            Opts::new("corral_system_load_average", "System load average."),
            &["interval"],
        )
        .expect("valid");
        let uptime =
            prometheus::Gauge::new("corral_uptime_seconds", "Seconds since corral started.")
                .expect("valid");
        SystemGauges {
            system_memory: gauge(
                r,
                "corral_system_memory_bytes",
                "System memory (total, available), within corral's cgroup memory limit where one is set.",
                &["kind"],
            ),
            load_average: registered(r, load_average),
            uptime: registered(r, uptime),
            started: std::time::Instant::now(),
        }
    }

    pub(super) fn update(&self) {
        self.read_proc();
        self.uptime.set(self.started.elapsed().as_secs_f64());
    }

    /// System gauges llama-swap users chart, read cheaply from /proc (and the cgroup's limit).
    fn read_proc(&self) {
        let memory = crate::memory::host::read();
        for (bytes, kind) in [(memory.total, "total"), (memory.available, "available")] {
            self.system_memory
                .with_label_values(&[kind])
                .set(bytes.min(i64::MAX as u64) as i64);
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
