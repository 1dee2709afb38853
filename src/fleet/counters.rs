//! The counters the fleet updates as instances start, stop and are taken out.
//!
//! The fleet owns what it counts and knows nothing of the metrics registry: `metrics.rs` creates
//! these handles, registers them, and reads the rest of the fleet through [`super::Snapshot`]. So
//! metrics depends on the fleet and never the other way round.

use prometheus::{HistogramVec, IntCounterVec};
use strum::IntoEnumIterator;

use super::StopReason;

/// Handles into the registry (cheap to clone: each is a shared pointer).
#[derive(Clone)]
pub struct FleetCounters {
    /// Starts by result: labels model, instance, result (`ready`, `failed`, `aborted`).
    pub starts: IntCounterVec,
    /// Spawn to ready: label model.
    pub load_duration: HistogramVec,
    /// Sleeps by result: labels model, instance, result (`ok`, `failed`).
    pub sleeps: IntCounterVec,
    /// Wakes by result: labels model, instance, result (`ok`, `failed`).
    pub wakes: IntCounterVec,
    /// Wake calls sent to ready again: label model. A wake is the fast half of a swap, beside
    /// `load_duration`'s cold starts.
    pub wake_duration: HistogramVec,
    /// Either way a model comes in, side by side: labels model, how (`cold`, `wake`).
    pub swap_duration: HistogramVec,
    /// Stops by reason: labels model, instance, reason (see [`stop_label`]).
    pub stops: IntCounterVec,
    /// Starts of an instance that ran before: labels model, instance.
    pub restarts: IntCounterVec,
    /// Pool members taken out after server errors in a row: labels model, instance.
    pub ejections: IntCounterVec,
    /// Engines that allocated more on a device than they were charged: label device.
    pub overruns: IntCounterVec,
    /// Requests sent to the replica holding their prompt's longest prefix (`balance: prefix`):
    /// label model.
    pub prefix_hits: IntCounterVec,
    /// Prompt bytes those hits matched, in whole blocks: label model.
    pub prefix_matched_bytes: IntCounterVec,
}

/// The `reason` label of a stop: the order's reason, or `crash` for an exit nobody ordered.
pub fn stop_label(reason: Option<StopReason>) -> &'static str {
    reason.map_or(CRASH, StopReason::label)
}

/// The label of a process that exited on its own.
pub const CRASH: &str = "crash";

/// Every `reason` label a stop can have: each stop reason's, and a crash's.
pub fn stop_labels() -> Vec<&'static str> {
    StopReason::iter()
        .map(StopReason::label)
        .chain([CRASH])
        .collect()
}
