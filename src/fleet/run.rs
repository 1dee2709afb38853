//! The task that owns one started process from spawn to reap: it fetches the weights, spawns the
//! engine, waits for it to be ready, serves until it exits or is told to stop, and publishes each
//! change. Each phase is a method of [`Run`], so the task reads as its life does.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use tokio::sync::watch;

use super::instance::{StopOrder, StopReason, STABLE_UPTIME};
use super::phase::{Phase, Spawned};
use super::Inner;
use crate::engines::{Cause, EngineKind};
use crate::supervisor::{Process, ProcessSpec, Sinks, StartError};

/// One start of one instance.
pub(super) struct Run {
    pub(super) inner: Arc<Inner>,
    pub(super) id: String,
    pub(super) model: String,
    generation: u64,
    started: Instant,
    /// The engine kind whose output and load reports corral reads (llama-server for a `cmd`).
    pub(super) kind: EngineKind,
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
    let (model, engine) = {
        let st = inner.lock();
        let found = st.instances.get(&spec.id);
        let model = found.map_or_else(|| spec.id.clone(), |i| i.model.id.to_string());
        (model, found.and_then(|i| i.model.engine.clone()))
    };
    let kind = engine.as_ref().map_or(EngineKind::LlamaCpp, |e| e.kind);
    let run = Run {
        id: spec.id.clone(),
        inner,
        model,
        generation,
        started: Instant::now(),
        kind,
    };
    if generation > 1 {
        run.count_restart();
    }
    let spec = tokio::select! {
        prepared = super::weights::prepare(&run.inner, &run.id, engine, spec) => match prepared {
            Ok(spec) => spec,
            Err(e) => return run.fail(e, true),
        },
        _ = next_order(&mut stop) => return run.fail(StartError::Aborted, false),
    };
    let Some(process) = run.spawn(&spec, sinks).await else {
        return;
    };
    if !run.wait_ready(&process, &spec, &mut stop).await {
        return;
    }
    run.mark_ready(&process, &spec).await;
    let poller = slots_poll.map(|every| {
        let (inner, id) = (run.inner.clone(), run.id.clone());
        tokio::spawn(poll_slots(inner, id, spec.clone(), run.kind, every))
    });
    let watchers = poller.into_iter().chain(run.watch_idle_sleep(&spec));
    let watchers: Vec<_> = watchers.collect();
    let ready_at = Instant::now();
    let reason = run.serve(&process, &spec, &mut stop).await;
    watchers.iter().for_each(|w| w.abort());
    run.stopped(Some(ready_at.elapsed()), reason);
}

impl Run {
    fn count_restart(&self) {
        let labels = [self.model.as_str(), self.id.as_str()];
        self.inner
            .counters
            .restarts
            .with_label_values(&labels)
            .inc();
    }

    fn count_start(&self, result: &str) {
        let labels = [self.model.as_str(), self.id.as_str(), result];
        self.inner.counters.starts.with_label_values(&labels).inc();
    }

    /// The error with the config's secrets masked: it is published and shown from here on.
    fn masked(&self, err: StartError) -> StartError {
        err.redacted(&self.inner.lock().config.redactor)
    }

    /// A start that failed: counted (unless aborted), published, and left for the waiters to see.
    fn fail(&self, err: StartError, counts: bool) {
        let err = self.masked(err);
        tracing::warn!(instance = %self.id, "start failed: {err}");
        self.count_start(if counts { "failed" } else { "aborted" });
        if counts {
            let reason = json!({"instance": self.id, "reason": err.to_string()});
            self.inner.lifecycle.publish("error", &self.model, reason);
        }
        let generation = self.generation;
        self.inner.update(&self.id, |i| {
            i.phase = Phase::Stopped;
            if counts {
                i.record_failure(None);
            }
            i.last_error = Some((generation, Arc::new(err)));
        });
    }

    async fn spawn(&self, spec: &ProcessSpec, sinks: Sinks) -> Option<Process> {
        let marker = self.inner.state_file.marker();
        let process = match Process::spawn(&self.inner.spawner, spec, sinks, &marker).await {
            Ok(p) => p,
            Err(e) => {
                self.fail(e, true);
                return None;
            }
        };
        self.inner.state_file.record(process.pid);
        let launched = json!({"instance": self.id, "pid": process.pid});
        self.inner
            .lifecycle
            .publish("launched", &self.model, launched);
        self.inner
            .update(&self.id, |i| i.phase.spawned(spawned(&process, spec)));
        Some(process)
    }

    /// Waits for the engine to be ready; on failure stops it and reports why (or arranges the one
    /// retry after running out of memory). True when ready.
    async fn wait_ready(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        stop: &mut watch::Receiver<Option<StopOrder>>,
    ) -> bool {
        let (ready, ordered) = tokio::select! {
            r = process.wait_ready(spec, &self.inner.health, |report| self.loading(report)) => (r, None),
            order = next_order(stop) => {
                process.stop(spec, order.grace, &self.inner.spawner).await;
                (Err(StartError::Aborted), Some(order.reason))
            }
        };
        let Err(e) = ready else { return true };
        let e = explain(e, self.kind);
        let counts = !matches!(e, StartError::Aborted);
        let spawner = &self.inner.spawner;
        process.stop(spec, Duration::from_secs(5), spawner).await;
        // launched, so its end is told too: why it was stopped, or that its start failed
        let reason = ordered.map_or("failed", StopReason::label);
        let destroyed = json!({"instance": self.id, "reason": reason});
        self.inner
            .lifecycle
            .publish("destroyed", &self.model, destroyed);
        if self.inner.retry_after_out_of_memory(&self.id, &e) {
            tracing::warn!(instance = %self.id, "{e}; starting again with the larger charge");
            self.count_start("failed");
        } else {
            self.fail(e, counts);
        }
        false
    }

    /// Shows the loading progress the engine reported.
    fn loading(&self, report: crate::supervisor::LoadingProgress) {
        tracing::debug!(instance = %self.id, "loading progress: {report:?}");
        self.inner.update(&self.id, |i| i.phase.set_loading(report));
    }

    /// Counts the start, learns the slots and the memory the engine reports, and marks it ready.
    async fn mark_ready(&self, process: &Process, spec: &ProcessSpec) {
        let took = self.started.elapsed().as_secs_f64();
        tracing::info!(instance = %self.id, "ready in {took:.2}s");
        self.count_start("ready");
        let counters = &self.inner.counters;
        counters
            .load_duration
            .with_label_values(&[&self.model])
            .observe(took);
        counters
            .swap_duration
            .with_label_values(&[&self.model, "cold"])
            .observe(took);
        let reported_slots = match &spec.health_url {
            Some(_) if self.slots_unknown() => self.inner.health.total_slots(spec).await,
            _ => None,
        };
        process.log_caught_up().await;
        // this start's output alone: an earlier start's report is in the same log
        let history = String::from_utf8_lossy(&process.output()).into_owned();
        let measured = super::ledger::measured_from_log(&history);
        self.inner.update(&self.id, |i| {
            i.phase.ready(spawned(process, spec), SystemTime::now());
            i.oom_retried = false;
            i.last_used = Instant::now();
            if let Some(n) = reported_slots {
                i.slots = n;
            }
            if let Some(m) = measured {
                log_measured(&i.id, m, i.need.bytes);
                i.measured = Some(m);
                i.need.bytes = m;
            }
        });
        self.inner.read_back(&self.id, &history);
    }

    /// True when the command line did not say how many slots the engine has.
    fn slots_unknown(&self) -> bool {
        let st = self.inner.lock();
        st.instances.get(&self.id).is_some_and(|i| {
            let spec = i.model.instances.iter().find(|s| *s.id == *i.id);
            spec.is_none_or(|s| s.slots.is_none())
        })
    }

    /// Counts and publishes the stop, and leaves the instance stopped; a crash or a broken
    /// replica counts towards the backoff, a stable run clears it.
    fn stopped(&self, uptime: Option<Duration>, reason: Option<StopReason>) {
        let label = super::counters::stop_label(reason);
        let labels = [self.model.as_str(), self.id.as_str(), label];
        self.inner.counters.stops.with_label_values(&labels).inc();
        let destroyed = json!({"instance": self.id, "reason": label});
        self.inner
            .lifecycle
            .publish("destroyed", &self.model, destroyed);
        self.inner.update(&self.id, |i| {
            i.phase = Phase::Stopped;
            i.rest.send_replace(false); // the next run starts awake
            i.engine_sleeping = false;
            i.external_busy = 0;
            match reason {
                None => i.record_failure(uptime),
                Some(r) if r.is_failure() => i.record_failure(uptime),
                Some(_) if uptime.is_some_and(|u| u >= STABLE_UPTIME) => i.failures = 0,
                Some(_) => {}
            }
        });
    }
}

/// The process as the instance's phase keeps it.
fn spawned(process: &Process, spec: &ProcessSpec) -> Spawned {
    Spawned {
        pid: process.pid,
        argv: spec.argv.clone(),
    }
}

fn log_measured(id: &str, measured: u64, estimate: u64) {
    let size = crate::memory::format_bytes;
    let off = (measured as f64 - estimate as f64) / (estimate.max(1) as f64) * 100.0;
    tracing::info!(
        instance = %id,
        "reported {} on devices; estimated {} ({off:+.1}%)",
        size(measured),
        size(estimate)
    );
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

pub(super) async fn next_order(stop: &mut watch::Receiver<Option<StopOrder>>) -> StopOrder {
    loop {
        if let Some(order) = *stop.borrow_and_update() {
            return order;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
