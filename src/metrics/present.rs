//! Gauges that describe the present (instances, devices, queues, model statuses, downloads), set
//! from a fleet snapshot at scrape time, so scraping costs one short lock and never blocks
//! request handling.

use std::collections::BTreeMap;

use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};
use strum::IntoEnumIterator;

use super::{gauge, registered, LabelSets};
use crate::fleet::{PhaseName, Snapshot};

pub(super) struct PresentGauges {
    in_flight: IntGaugeVec,
    slots_total: IntGaugeVec,
    slots_free: IntGaugeVec,
    state: IntGaugeVec,
    model_status: IntGaugeVec,
    download_progress: GaugeVec,
    failures: IntGaugeVec,
    circuit_open: IntGaugeVec,
    queue_depth: IntGaugeVec,
    memory_capacity: IntGaugeVec,
    memory_charged: IntGaugeVec,
    memory_used_by_others: IntGaugeVec,
    memory_measured: IntGaugeVec,
    host_charged: prometheus::IntGauge,
    instance_estimate: IntGaugeVec,
    instance_measured: IntGaugeVec,
    /// The instances, models, pools and devices the gauges were last set for.
    instances: LabelSets,
    models: LabelSets,
    pools: LabelSets,
    devices: LabelSets,
}

/// Removes the series of `labels` from each of `vecs`; absent ones are no error.
fn remove<T: prometheus::core::Atomic>(
    vecs: &[&prometheus::core::GenericGaugeVec<T>],
    labels: &[&str],
) {
    for vec in vecs {
        let _ = vec.remove_label_values(labels);
    }
}

impl PresentGauges {
    #[rustfmt::skip]
    pub(super) fn new(r: &Registry) -> PresentGauges {
        let download = Opts::new("corral_download_progress_ratio", "How far the download of a model's weights has come (0 to 1), while one runs.");
        PresentGauges {
            in_flight: gauge(r, "corral_in_flight_requests", "Requests in flight, by instance.", &["model", "instance"]),
            slots_total: gauge(r, "corral_slots", "Parallel slots of an instance.", &["model", "instance"]),
            slots_free: gauge(r, "corral_slots_free", "Free slots of a ready instance.", &["model", "instance"]),
            state: gauge(r, "corral_instance_state", "1 for the instance's current state, 0 for the others.", &["model", "instance", "state"]),
            download_progress: registered(r, GaugeVec::new(download, &["model"]).expect("valid metric")),
            model_status: gauge(r, "corral_model_status", "1 for the model's current lifecycle status, 0 for the others.", &["model", "status"]),
            failures: gauge(r, "corral_instance_consecutive_failures", "Failed starts or crashes in a row.", &["model", "instance"]),
            circuit_open: gauge(r, "corral_instance_circuit_open", "1 while an instance that keeps failing is held out.", &["model", "instance"]),
            queue_depth: gauge(r, "corral_queue_depth", "Requests waiting for a free slot in a pool.", &["pool"]),
            memory_capacity: gauge(r, "corral_device_memory_capacity_bytes", "Usable memory of a device (capacity less reserve).", &["device"]),
            memory_charged: gauge(r, "corral_device_memory_charged_bytes", "Memory charged to instances on a device.", &["device"]),
            memory_used_by_others: gauge(r, "corral_device_memory_used_by_others_bytes", "Memory that programs other than corral's engines use on a device (NVML, nvidia-smi or rocm-smi).", &["device"]),
            memory_measured: gauge(r, "corral_device_memory_measured_bytes", "Memory the engines reported allocating on a device.", &["device"]),
            host_charged: registered(r, prometheus::IntGauge::new("corral_host_memory_charged_bytes", "Host memory charged to instances: what engines keep on the CPU, and level-1 sleepers' weights.").expect("valid metric")),
            instance_estimate: gauge(r, "corral_instance_memory_estimate_bytes", "Estimated device memory of an instance (asleep: its residue).", &["model", "instance"]),
            instance_measured: gauge(r, "corral_instance_memory_measured_bytes", "Device memory an instance reported after loading.", &["model", "instance"]),
            instances: LabelSets::default(),
            models: LabelSets::default(),
            pools: LabelSets::default(),
            devices: LabelSets::default(),
        }
    }

    /// Sets each model's lifecycle status gauge: 1 for its status, 0 for every other.
    pub(super) fn set_model_statuses(
        &self,
        statuses: &BTreeMap<String, crate::fleet::lifecycle::Status>,
    ) {
        use crate::fleet::lifecycle::ModelStatus;
        for (model, now) in statuses {
            for status in ModelStatus::iter() {
                self.model_status
                    .with_label_values(&[model.as_str(), status.as_str()])
                    .set((now.status == status) as i64);
            }
        }
        for gone in self
            .models
            .replace(statuses.keys().map(|m| vec![m.clone()]).collect())
        {
            for status in ModelStatus::iter() {
                let _ = self
                    .model_status
                    .remove_label_values(&[gone[0].as_str(), status.as_str()]);
            }
        }
    }

    /// Creates each configured instance's series, so dashboards see zeros before the first event.
    pub(super) fn register_instances(&self, snapshot: &[Snapshot]) {
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.in_flight.with_label_values(&l);
            self.slots_total.with_label_values(&l).set(s.slots as i64);
        }
    }

    pub(super) fn update(
        &self,
        snapshot: &[Snapshot],
        queues: &BTreeMap<String, usize>,
        devices: &[crate::config::Device],
        used_by_others: &[u64],
    ) {
        self.set_download_progress(snapshot);
        self.set_devices(snapshot, devices, used_by_others);
        self.set_instances(snapshot);
        for (pool, depth) in queues {
            self.queue_depth
                .with_label_values(&[pool])
                .set(*depth as i64);
        }
        for gone in self
            .pools
            .replace(queues.keys().map(|p| vec![p.clone()]).collect())
        {
            let _ = self.queue_depth.remove_label_values(&[gone[0].as_str()]);
        }
        self.forget_gone_instances(snapshot);
    }

    /// Removes the series of instances no longer in the fleet (their model removed, or fewer
    /// replicas).
    fn forget_gone_instances(&self, snapshot: &[Snapshot]) {
        let now = snapshot
            .iter()
            .map(|s| vec![s.model.clone(), s.instance.clone()])
            .collect();
        for gone in self.instances.replace(now) {
            let l = [gone[0].as_str(), gone[1].as_str()];
            remove(
                &[
                    &self.in_flight,
                    &self.slots_total,
                    &self.slots_free,
                    &self.failures,
                    &self.circuit_open,
                    &self.instance_estimate,
                    &self.instance_measured,
                ],
                &l,
            );
            for phase in PhaseName::iter() {
                let _ = self
                    .state
                    .remove_label_values(&[l[0], l[1], phase.as_str()]);
            }
        }
    }

    /// Each model's download progress while one runs; the series goes when the download ends.
    fn set_download_progress(&self, snapshot: &[Snapshot]) {
        let mut by_model = BTreeMap::new();
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

    fn set_devices(
        &self,
        snapshot: &[Snapshot],
        devices: &[crate::config::Device],
        used_by_others: &[u64],
    ) {
        self.host_charged
            .set(snapshot.iter().map(|s| s.host).sum::<u64>() as i64);
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
        for gone in self
            .devices
            .replace(devices.iter().map(|d| vec![d.name.clone()]).collect())
        {
            remove(
                &[
                    &self.memory_used_by_others,
                    &self.memory_capacity,
                    &self.memory_charged,
                    &self.memory_measured,
                ],
                &[gone[0].as_str()],
            );
        }
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.instance_estimate
                .with_label_values(&l)
                .set(s.memory as i64);
            // a stopped instance holds no memory, as the device totals count it
            match s.measured.filter(|_| s.state != PhaseName::Stopped) {
                Some(m) => self.instance_measured.with_label_values(&l).set(m as i64),
                None => {
                    let _ = self.instance_measured.remove_label_values(&l);
                }
            }
        }
    }

    fn set_instances(&self, snapshot: &[Snapshot]) {
        for s in snapshot {
            let l = [s.model.as_str(), s.instance.as_str()];
            self.in_flight.with_label_values(&l).set(s.in_flight as i64);
            self.slots_total.with_label_values(&l).set(s.slots as i64);
            let free = if s.state == PhaseName::Ready {
                s.free
            } else {
                0
            };
            self.slots_free.with_label_values(&l).set(free as i64);
            for phase in PhaseName::iter() {
                self.state
                    .with_label_values(&[l[0], l[1], phase.as_str()])
                    .set((s.state == phase) as i64);
            }
            self.failures.with_label_values(&l).set(s.failures as i64);
            self.circuit_open
                .with_label_values(&l)
                .set(s.circuit_open as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(state: PhaseName, measured: Option<u64>) -> Snapshot {
        Snapshot {
            model: "m".into(),
            instance: "m".into(),
            state,
            measured,
            ..Default::default()
        }
    }

    /// A stopped instance holds no memory, as the device totals count it: its measured size goes.
    #[test]
    fn a_stopped_instance_shows_no_measured_memory() {
        use prometheus::core::Collector;
        let gauges = PresentGauges::new(&Registry::new());
        let measured = |gauges: &PresentGauges| -> Vec<i64> {
            let families = gauges.instance_measured.collect();
            let series = families.first().map(|f| f.get_metric()).unwrap_or_default();
            series
                .iter()
                .map(|m| m.get_gauge().get_value() as i64)
                .collect()
        };
        let queues = BTreeMap::new();
        gauges.update(
            &[instance(PhaseName::Ready, Some(1 << 30))],
            &queues,
            &[],
            &[],
        );
        assert_eq!(measured(&gauges), [1 << 30]);
        gauges.update(
            &[instance(PhaseName::Stopped, Some(1 << 30))],
            &queues,
            &[],
            &[],
        );
        assert_eq!(measured(&gauges), [0; 0]);
    }
}
