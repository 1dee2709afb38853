//! The families the fleet counts itself (starts, stops, loads, ejections, overruns, prefix hits).

use prometheus::{HistogramVec, IntCounterVec, Registry};

use super::{counter, histogram, LOAD_BUCKETS};
use crate::fleet::counters::{stop_labels, FleetCounters};

pub(super) fn fleet_counters(r: &Registry) -> FleetCounters {
    let (sleeps, wakes, wake_duration, swap_duration) = sleep_counters(r);
    let stops_help = format!("Instance stops, by reason ({}).", stop_labels().join(", "));
    FleetCounters {
        sleeps,
        wakes,
        wake_duration,
        swap_duration,
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

/// Sleeps, wakes, how long wakes take, and how long either half of a swap takes.
fn sleep_counters(r: &Registry) -> (IntCounterVec, IntCounterVec, HistogramVec, HistogramVec) {
    (
        counter(
            r,
            "corral_sleeps_total",
            "Instances put to sleep instead of stopped, by result (ok, failed: stopped instead).",
            &["model", "instance", "result"],
        ),
        counter(
            r,
            "corral_wakes_total",
            "Sleeping instances woken, by result (ok, failed: started cold instead).",
            &["model", "instance", "result"],
        ),
        histogram(
            r,
            "corral_wake_duration_seconds",
            "Time from the first wake call to ready again: a swap back to a sleeping model.",
            &["model"],
            LOAD_BUCKETS,
        ),
        histogram(
            r,
            "corral_swap_duration_seconds",
            "Time for a model to come in: how=cold from spawn to ready, how=wake from the first wake call to ready.",
            &["model", "how"],
            LOAD_BUCKETS,
        ),
    )
}
