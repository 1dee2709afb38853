//! One instance's state: its phase, load, failures and memory. The task that owns its process is
//! in `run.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::phase::Phase;
pub use super::stopping::{StopOrder, StopReason};
use crate::config::ModelConfig;
use crate::logs::LogRing;
use crate::supervisor::{ProcessSpec, StartError};

/// A process that ran shorter than this before it failed counts towards the crash loop.
pub(super) const STABLE_UPTIME: Duration = Duration::from_secs(60);
/// Consecutive failures at which an instance is held out for [`CIRCUIT_HOLD`].
pub const CIRCUIT_FAILURES: u32 = 5;
const CIRCUIT_HOLD: Duration = Duration::from_secs(60);

/// How long to wait before starting again after `failures` failures in a row: nothing after the
/// first (a fix may already be in place), then 1 s doubling up to 32 s, then the circuit opens.
pub fn backoff(failures: u32) -> Option<Duration> {
    match failures {
        0 | 1 => None,
        n if n >= CIRCUIT_FAILURES => Some(CIRCUIT_HOLD),
        n => Some(Duration::from_secs(1 << (n - 2).min(5))),
    }
}

pub struct Instance {
    pub id: Arc<str>,
    pub model: Arc<ModelConfig>,
    pub pool: Option<String>,
    pub spec: ProcessSpec,
    pub proxy: Arc<str>,
    pub logs: Arc<LogRing>,
    pub phase: Phase,
    /// Direct requests admitted for this instance (waiting or in flight), for `concurrencyLimit`.
    pub reserved: usize,
    /// Requests in flight here, direct or from the pool.
    pub in_flight: usize,
    /// Work the engine reports that did not come through corral (from `/slots`).
    pub external_busy: usize,
    /// When corral's own requests here ended lately: a `/slots` reading may still show them.
    pub recent_ends: super::outside::RecentEnds,
    pub slots: usize,
    pub last_used: Instant,
    pub last_picked: u64,
    pub generation: u64,
    pub last_error: Option<(u64, Arc<StartError>)>,
    pub failures: u32,
    pub retry_at: Option<Instant>,
    /// Server errors (5xx other than 503) answered in a row since the last other answer.
    pub server_errors: u32,
    /// Device memory this instance needs (the engine's own report once it has loaded).
    pub need: super::ledger::Need,
    /// Devices it is charged on while it runs. Kept apart from the phase: placed while still
    /// stopped, just before its start, and shown after it stopped as where it last ran.
    pub placed: super::ledger::Charges,
    /// What the engine reported allocating on devices, if it did.
    pub measured: Option<u64>,
    /// Whether its last start was already a retry with a charge raised after running out of
    /// memory (the next such failure is final).
    pub oom_retried: bool,
    /// Set by a reload that changed or removed this instance while it ran.
    pub retire: super::Retire,
    /// Tells this run's task to put the engine to sleep (`true`) or wake it (`false`); the phase
    /// says the same, set under the lock with it.
    pub rest: tokio::sync::watch::Sender<bool>,
    /// What its engine holds on each device while asleep, as the last reading of the GPUs
    /// showed; `None` until one has (the fixed residue is charged), and reset at each sleep.
    pub asleep_use: Option<super::ledger::Charges>,
    /// llama-server's own idle sleep (`--sleep-idle-seconds`), as its `/props` last said: it still
    /// serves, waking by itself.
    pub engine_sleeping: bool,
    /// An idle time a request set for this run of the instance (Ollama's `keep_alive`), in place
    /// of the model's `ttl`: the generation it was set in, and the time (`None`: never unload).
    pub keep_alive: Option<(u64, Option<Duration>)>,
}

impl Instance {
    pub fn free_slots(&self) -> usize {
        self.slots
            .saturating_sub(self.in_flight + self.external_busy)
    }

    /// How long it may stay idle before it is unloaded: what a request set for this run, else the
    /// model's `ttl`; `None` never unloads.
    pub fn ttl(&self) -> Option<Duration> {
        match self.keep_alive {
            Some((generation, ttl)) if generation == self.generation => ttl,
            _ => self.model.ttl,
        }
    }

    pub fn in_backoff(&self) -> bool {
        self.retry_at.is_some_and(|t| t > Instant::now())
    }

    pub fn circuit_open(&self) -> bool {
        self.failures >= CIRCUIT_FAILURES && self.in_backoff()
    }

    /// Records a failure and sets the time before the next start.
    pub fn record_failure(&mut self, uptime: Option<Duration>) {
        if uptime.is_some_and(|u| u >= STABLE_UPTIME) {
            self.failures = 0;
        }
        self.failures += 1;
        self.retry_at = backoff(self.failures).map(|d| Instant::now() + d);
    }

    /// Stopping, or told to stop: its memory is on its way back and a new order would be ignored.
    pub fn is_stopping(&self) -> bool {
        self.phase.is_stopping()
    }

    pub fn order_stop(&self, grace: Duration, reason: StopReason) {
        self.phase.order_stop(StopOrder { grace, reason });
    }
}

/// What a reload decided for an instance that was running.
pub enum Retire {
    No,
    /// Its command changed: when idle, stop it and start the new one on the next request.
    Replace(Box<Instance>),
    /// The new config has no such instance: stop it when idle.
    Remove,
}

impl PartialEq for Retire {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_then_opens_the_circuit() {
        assert_eq!(backoff(1), None);
        assert_eq!(backoff(2), Some(Duration::from_secs(1)));
        assert_eq!(backoff(3), Some(Duration::from_secs(2)));
        assert_eq!(backoff(4), Some(Duration::from_secs(4)));
        assert_eq!(backoff(5), Some(CIRCUIT_HOLD));
        assert_eq!(backoff(50), Some(CIRCUIT_HOLD));
    }
}
