//! Why an instance is told to stop, and the order that tells it: what the phases hold and the
//! instance, the metrics and the lifecycle read.

use std::time::Duration;

/// Why an instance is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter)]
pub enum StopReason {
    Ttl,
    Swap,
    Memory,
    Unload,
    Reload,
    Shutdown,
    /// A pool member that could not be reached.
    Unreachable,
    /// A pool member taken out after answering server errors in a row.
    Ejected,
    /// Its sleep calls failed or took too long: stopped instead.
    SleepFailed,
    /// Its wake calls failed or took too long: stopped, to start cold.
    WakeFailed,
}

impl StopReason {
    /// The `reason` label of `corral_instance_stops_total`.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::Ttl => "ttl",
            StopReason::Swap => "swap",
            StopReason::Memory => "memory",
            StopReason::Unload => "unload",
            StopReason::Reload => "reload",
            StopReason::Shutdown => "shutdown",
            StopReason::Unreachable => "unreachable",
            StopReason::Ejected => "ejected",
            StopReason::SleepFailed => "sleep_failed",
            StopReason::WakeFailed => "wake_failed",
        }
    }

    /// A stop that counts as a failure towards the backoff, as a crash does: the instance was
    /// taken out because it was broken.
    pub(crate) fn is_failure(self) -> bool {
        matches!(self, StopReason::Unreachable | StopReason::Ejected)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct StopOrder {
    pub grace: Duration,
    pub reason: StopReason,
}
