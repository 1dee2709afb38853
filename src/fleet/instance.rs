//! One instance's state, and the task that owns its process from spawn to reap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use super::Inner;
use crate::config::ModelConfig;
use crate::engines::{Cause, EngineKind};
use crate::logs::LogRing;
use crate::supervisor::{Process, ProcessSpec, Sinks, StartError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::EnumIter)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Stopped,
    Starting,
    Ready,
    Stopping,
}

impl Phase {
    /// The name clients see in `/running` and events, and the `state` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Stopping => "stopping",
        }
    }
}

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
        }
    }

    /// A stop that counts as a failure towards the backoff, as a crash does: the instance was
    /// taken out because it was broken.
    fn is_failure(self) -> bool {
        matches!(self, StopReason::Unreachable | StopReason::Ejected)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct StopOrder {
    pub grace: Duration,
    pub reason: StopReason,
}

/// A process that ran shorter than this before it failed counts towards the crash loop.
const STABLE_UPTIME: Duration = Duration::from_secs(60);
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
    pub id: String,
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
    pub pid: Option<u32>,
    pub stop: Option<watch::Sender<Option<StopOrder>>>,
    pub failures: u32,
    pub retry_at: Option<Instant>,
    /// Server errors (5xx other than 503) answered in a row since the last other answer.
    pub server_errors: u32,
    /// Device memory this instance needs (the engine's own report once it has loaded).
    pub need: super::ledger::Need,
    /// Devices it is charged on while it runs.
    pub placed: super::ledger::Charges,
    /// What the engine reported allocating on devices, if it did.
    pub measured: Option<u64>,
    /// Whether its last start was already a retry with a charge raised after running out of
    /// memory (the next such failure is final).
    pub oom_retried: bool,
    /// The command line of the process running now (the configured one, over fetched weights and
    /// with its devices' split), while one runs.
    pub running_argv: Option<Vec<String>>,
    /// Its weights' download, while one runs before the engine starts.
    pub download: Option<super::Download>,
    /// Set by a reload that changed or removed this instance while it ran.
    pub retire: super::Retire,
}

impl Instance {
    pub fn free_slots(&self) -> usize {
        self.slots
            .saturating_sub(self.in_flight + self.external_busy)
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

    pub fn order_stop(&mut self, grace: Duration, reason: StopReason) {
        if matches!(self.phase, Phase::Starting | Phase::Ready) {
            if let Some(stop) = &self.stop {
                if stop.borrow().is_none() {
                    let _ = stop.send(Some(StopOrder { grace, reason }));
                }
            }
        }
    }
}

/// Owns one started process from spawn to reap, publishing each phase change.
pub(crate) async fn run(
    inner: Arc<Inner>,
    spec: ProcessSpec,
    sinks: Sinks,
    generation: u64,
    mut stop: watch::Receiver<Option<StopOrder>>,
    slots_poll: Option<Duration>,
) {
    let id = spec.id.clone();
    let model = inner
        .lock()
        .instances
        .get(&id)
        .map_or_else(|| id.clone(), |i| i.model.id.clone());
    let started = Instant::now();
    if generation > 1 {
        inner
            .counters
            .restarts
            .with_label_values(&[&model, &id])
            .inc();
    }
    let fail = |err: StartError, counts: bool| {
        tracing::warn!(instance = %id, "start failed: {err}");
        let result = if counts { "failed" } else { "aborted" };
        inner
            .counters
            .starts
            .with_label_values(&[&model, &id, result])
            .inc();
        if counts {
            let reason = json!({"instance": id, "reason": err.to_string()});
            inner.lifecycle.publish("error", &model, reason);
        }
        inner.update(&id, |i| {
            i.phase = Phase::Stopped;
            i.pid = None;
            i.stop = None;
            i.download = None;
            i.running_argv = None;
            if counts {
                i.record_failure(None);
            }
            i.last_error = Some((generation, Arc::new(err)));
        });
    };
    let log = sinks.model.clone();
    let engine = inner
        .lock()
        .instances
        .get(&id)
        .and_then(|i| i.model.engine.clone());
    let engine_kind = engine.as_ref().map(|e| e.kind);
    let spec = tokio::select! {
        prepared = super::weights::prepare(&inner, &id, engine, spec) => match prepared {
            Ok(spec) => spec,
            Err(e) => return fail(e, true),
        },
        _ = next_order(&mut stop) => return fail(StartError::Aborted, false),
    };
    let process =
        match Process::spawn(&inner.spawner, &spec, sinks, &inner.state_file.marker()).await {
            Ok(p) => p,
            Err(e) => return fail(e, true),
        };
    inner.state_file.record(process.pid);
    let launched = json!({"instance": id, "pid": process.pid});
    inner.lifecycle.publish("launched", &model, launched);
    inner.update(&id, |i| {
        i.pid = Some(process.pid);
        i.running_argv = Some(spec.argv.clone());
    });
    let ready = tokio::select! {
        r = process.wait_ready(&spec, &inner.health) => r,
        order = next_order(&mut stop) => {
            process.stop(&spec, order.grace, &inner.spawner).await;
            Err(StartError::Aborted)
        }
    };
    if let Err(e) = ready {
        let e = explain(e, engine_kind.unwrap_or(EngineKind::LlamaCpp));
        let counts = !matches!(e, StartError::Aborted);
        process
            .stop(&spec, Duration::from_secs(5), &inner.spawner)
            .await;
        if inner.retry_after_out_of_memory(&id, &e) {
            tracing::warn!(instance = %id, "{e}; starting again with the larger charge");
            inner
                .counters
                .starts
                .with_label_values(&[&model, &id, "failed"])
                .inc();
            return;
        }
        return fail(e, counts);
    }
    let ready_at = Instant::now();
    tracing::info!(instance = %id, "ready in {:.2}s", started.elapsed().as_secs_f64());
    inner
        .counters
        .starts
        .with_label_values(&[&model, &id, "ready"])
        .inc();
    inner
        .counters
        .load_duration
        .with_label_values(&[&model])
        .observe(started.elapsed().as_secs_f64());
    let reported_slots = match &spec.health_url {
        Some(_)
            if inner
                .lock()
                .instances
                .get(&id)
                .is_some_and(|i| i.spec_slots_unknown()) =>
        {
            inner.health.total_slots(&spec).await
        }
        _ => None,
    };
    let history = String::from_utf8_lossy(&log.history()).into_owned();
    let measured = super::ledger::measured_from_log(&history);
    inner.update(&id, |i| {
        i.phase = Phase::Ready;
        i.oom_retried = false;
        i.last_used = Instant::now();
        if let Some(n) = reported_slots {
            i.slots = n;
        }
        if let Some(m) = measured {
            let estimate = i.need.bytes;
            tracing::info!(
                instance = %id,
                "reported {} on devices; estimated {} ({:+.1}%)",
                crate::memory::format_bytes(m),
                crate::memory::format_bytes(estimate),
                (m as f64 - estimate as f64) / (estimate.max(1) as f64) * 100.0
            );
            i.measured = Some(m);
            i.need.bytes = m;
        }
    });
    inner.read_back(&id, &history);
    let poller = slots_poll.map(|every| {
        let kind = engine_kind.unwrap_or(EngineKind::LlamaCpp);
        tokio::spawn(poll_slots(
            inner.clone(),
            id.clone(),
            spec.clone(),
            kind,
            every,
        ))
    });
    let (uptime, reason) = tokio::select! {
        status = process.exited() => {
            tracing::warn!(instance = %id, "upstream process exited unexpectedly ({status})");
            process.stop(&spec, Duration::ZERO, &inner.spawner).await;
            (Some(ready_at.elapsed()), None)
        }
        order = next_order(&mut stop) => {
            inner.update(&id, |i| i.phase = Phase::Stopping);
            tracing::info!(instance = %id, "stopping ({:?})", order.reason);
            process.stop(&spec, order.grace, &inner.spawner).await;
            (Some(ready_at.elapsed()), Some(order.reason))
        }
    };
    if let Some(p) = poller {
        p.abort();
    }
    let label = super::counters::stop_label(reason);
    inner
        .counters
        .stops
        .with_label_values(&[&model, &id, label])
        .inc();
    let destroyed = json!({"instance": id, "reason": label});
    inner.lifecycle.publish("destroyed", &model, destroyed);
    inner.update(&id, |i| {
        i.phase = Phase::Stopped;
        i.pid = None;
        i.stop = None;
        i.running_argv = None;
        i.external_busy = 0;
        match reason {
            None => i.record_failure(uptime),
            Some(r) if r.is_failure() => i.record_failure(uptime),
            Some(_) if uptime.is_some_and(|u| u >= STABLE_UPTIME) => i.failures = 0,
            Some(_) => {}
        }
    });
}

impl Instance {
    /// True when the command line did not say how many slots the engine has.
    fn spec_slots_unknown(&self) -> bool {
        self.model
            .instances
            .iter()
            .find(|s| s.id == self.id)
            .is_none_or(|s| s.slots.is_none())
    }
}

/// Reads the engine's load now and then (llama-server's `/slots`, other engines' own gauges), so
/// work sent to it by other clients counts as busy.
async fn poll_slots(
    inner: Arc<Inner>,
    id: String,
    spec: ProcessSpec,
    kind: EngineKind,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let asked = Instant::now();
        let processing = match kind {
            EngineKind::LlamaCpp => inner.health.slots_processing(&spec).await,
            // Ollama counts a model loaded for its keep-alive as in use: no sign of outside work
            EngineKind::Ollama => None,
            other => inner.health.engine_load(&spec, other).await,
        };
        let Some(processing) = processing else {
            return; // the engine publishes no load: stop asking
        };
        inner.update(&id, |i| {
            let ended = i.recent_ends.around(asked);
            i.external_busy = super::outside::outside_work(processing, i.in_flight, ended);
        });
    }
}

/// Puts what the engine's last output shows (out of GPU memory, port taken) before a failed
/// start's error, so the first words say what to fix.
fn explain(err: StartError, kind: EngineKind) -> StartError {
    let tail = match &err {
        StartError::Exited { tail, .. } | StartError::Timeout { tail, .. } => tail,
        _ => return err,
    };
    match crate::engines::diagnose(kind, tail) {
        Some(d) => StartError::Diagnosed {
            diagnosis: d.to_string(),
            out_of_memory: match d.cause {
                Cause::OutOfMemory { requested_bytes } => Some(requested_bytes),
                Cause::PortTaken => None,
            },
            cause: Box::new(err),
        },
        None => err,
    }
}

async fn next_order(stop: &mut watch::Receiver<Option<StopOrder>>) -> StopOrder {
    loop {
        if let Some(order) = *stop.borrow_and_update() {
            return order;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
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
