//! The instance task's sleep and wake: between serving and stopping, an engine that can sleep
//! frees its device and keeps its process. The fleet decides (`sleep.rs`) and sets the phase under
//! the lock; this carries the decision out with the engine's calls, while still taking stop
//! orders and noticing an exit. A sleep that fails stops the engine; a wake that fails or passes
//! its deadline stops it too, and the request that wanted it then starts it cold.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use tokio::sync::watch;

use super::instance::{StopOrder, StopReason};
use super::phase::Rest;
use super::run::{next_order, Run};
use crate::config::sleep::SleepSpec;
use crate::supervisor::sleep_calls::call_all;
use crate::supervisor::{Process, ProcessSpec};

/// What ends a wait of the task: its process exiting, a stop order, or the fleet asking it to
/// sleep or wake.
pub(super) enum Event {
    Exited(String),
    Ordered(StopOrder),
    Rest,
}

/// Why a sleep or a wake gave up: the process ended (with the reason it ended for), or its calls
/// failed (the error).
enum Broke {
    Ended(Option<StopReason>),
    Failed(String),
}

/// The next event; `rest` is waited for only when given, until it says `want`.
pub(super) async fn next_event(
    process: &Process,
    stop: &mut watch::Receiver<Option<StopOrder>>,
    rest: Option<(&mut watch::Receiver<bool>, bool)>,
) -> Event {
    tokio::select! {
        status = process.exited() => Event::Exited(status),
        order = next_order(stop) => Event::Ordered(order),
        _ = wanted(rest) => Event::Rest,
    }
}

/// Resolves once the fleet asks for `want` (never without a channel, or once it is gone).
async fn wanted(rest: Option<(&mut watch::Receiver<bool>, bool)>) {
    let Some((rx, want)) = rest else {
        return std::future::pending().await;
    };
    if rx.wait_for(|asked| *asked == want).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How often a llama-server that sleeps by itself is asked whether it sleeps.
const IDLE_SLEEP_POLL: Duration = Duration::from_secs(1);

/// The idle time after which llama-server sleeps by itself (`--sleep-idle-seconds N`, N > 0).
fn idle_sleep_seconds(argv: &[String]) -> Option<u64> {
    let at = argv.iter().position(|a| a == "--sleep-idle-seconds")?;
    argv.get(at + 1)?.parse().ok().filter(|n| *n > 0)
}

/// Follows a llama-server's own idle sleep through its `/props` (`is_sleeping`), for the state
/// to show it; runs until aborted.
async fn follow_idle_sleep(inner: Arc<super::Inner>, id: String, base: String) {
    let url = format!("{}/props", base.trim_end_matches('/'));
    let mut tick = tokio::time::interval(IDLE_SLEEP_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let Some((status, body)) = inner.health.get(url.clone()).await else {
            continue;
        };
        let props: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let sleeping = status.is_success() && props["is_sleeping"] == true;
        let changed = inner
            .lock()
            .instances
            .get(&id)
            .is_some_and(|i| i.engine_sleeping != sleeping);
        if changed {
            inner.update(&id, |i| i.engine_sleeping = sleeping);
        }
    }
}

impl Run {
    /// For a llama-server that sleeps by itself when idle, a task that follows its sleep.
    pub(super) fn watch_idle_sleep(
        &self,
        spec: &ProcessSpec,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let ours = self.kind == crate::engines::EngineKind::LlamaCpp;
        idle_sleep_seconds(&spec.argv).filter(|_| ours)?;
        let (inner, id, base) = (self.inner.clone(), self.id.clone(), spec.base.clone());
        Some(tokio::spawn(follow_idle_sleep(inner, id, base)))
    }

    /// Serves, sleeping and waking as the fleet asks, until the process exits (`None`) or is told
    /// to stop (the reason). The calls are read when a sleep is asked for: a reload may have
    /// changed them since the start.
    pub(super) async fn serve(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        stop: &mut watch::Receiver<Option<StopOrder>>,
    ) -> Option<StopReason> {
        let rest = self
            .inner
            .lock()
            .instances
            .get(&self.id)
            .map(|i| i.rest.subscribe());
        let Some(mut rx) = rest else {
            let event = next_event(process, stop, None).await;
            return self.end(process, spec, event).await;
        };
        loop {
            match next_event(process, stop, Some((&mut rx, true))).await {
                Event::Rest => {}
                other => return self.end(process, spec, other).await,
            }
            let sleep = self
                .inner
                .lock()
                .instances
                .get(&self.id)
                .and_then(|i| i.model.sleep.clone());
            let rested = match sleep {
                Some(sleep) => self.rest(process, spec, stop, &mut rx, &sleep).await,
                None => Err(Broke::Failed("its model no longer sleeps".into())),
            };
            if let Err(broke) = rested {
                return self.broke(process, spec, broke).await;
            }
        }
    }

    /// Carries out an exit or a stop order: what ends the run.
    pub(super) async fn end(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        event: Event,
    ) -> Option<StopReason> {
        let spawner = &self.inner.spawner;
        match event {
            Event::Exited(status) => {
                tracing::warn!(instance = %self.id, "upstream process exited unexpectedly ({status})");
                process.stop(spec, Duration::ZERO, spawner).await;
                None
            }
            Event::Ordered(order) => {
                self.inner.update(&self.id, |i| i.phase.stopping());
                tracing::info!(instance = %self.id, "stopping ({:?})", order.reason);
                process.stop(spec, order.grace, spawner).await;
                Some(order.reason)
            }
            Event::Rest => unreachable!("only asked for while serving"),
        }
    }

    /// Stops an engine whose sleep or wake failed, or passes on the end that came meanwhile.
    async fn broke(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        broke: Broke,
    ) -> Option<StopReason> {
        let why = match broke {
            Broke::Ended(reason) => return reason,
            Broke::Failed(why) => why,
        };
        let reason = match self
            .inner
            .lock()
            .instances
            .get(&self.id)
            .and_then(|i| i.phase.rest())
        {
            Some(Rest::Falling) => StopReason::SleepFailed,
            _ => StopReason::WakeFailed,
        };
        tracing::warn!(instance = %self.id, "{why}; stopping it instead");
        self.inner.update(&self.id, |i| i.phase.stopping());
        process
            .stop(spec, Duration::from_secs(5), &self.inner.spawner)
            .await;
        Some(reason)
    }

    /// One sleep and the wake after it: `Ok` once the engine serves again.
    async fn rest(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        stop: &mut watch::Receiver<Option<StopOrder>>,
        rx: &mut watch::Receiver<bool>,
        sleep: &Arc<SleepSpec>,
    ) -> Result<(), Broke> {
        let slept = self
            .calls(process, spec, stop, &sleep.sleep, "sleep", None)
            .await;
        self.count_rest(true, slept.is_ok());
        slept?;
        tracing::info!(instance = %self.id, "asleep (level {})", sleep.level);
        self.inner
            .update(&self.id, |i| i.phase.rest_step(Rest::Asleep));
        let slept = json!({"instance": self.id, "level": sleep.level});
        self.inner.lifecycle.publish("slept", &self.model, slept);
        match next_event(process, stop, Some((rx, false))).await {
            Event::Rest => {}
            other => return Err(Broke::Ended(self.end(process, spec, other).await)),
        }
        let began = Instant::now();
        let woke = self
            .calls(
                process,
                spec,
                stop,
                &sleep.wake,
                "wake",
                Some(sleep.wake_timeout),
            )
            .await;
        self.count_rest(false, woke.is_ok());
        woke?;
        self.woke(began.elapsed());
        Ok(())
    }

    /// Makes one sequence of calls (under `deadline` in all, when given), racing an exit or a
    /// stop order.
    async fn calls(
        &self,
        process: &Process,
        spec: &ProcessSpec,
        stop: &mut watch::Receiver<Option<StopOrder>>,
        calls: &[crate::config::sleep::SleepCall],
        what: &str,
        deadline: Option<Duration>,
    ) -> Result<(), Broke> {
        let sequence = async {
            match deadline {
                None => call_all(&spec.base, calls, what).await,
                Some(limit) => tokio::time::timeout(limit, call_all(&spec.base, calls, what))
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!("{what} took longer than {}s", limit.as_secs()))
                    }),
            }
        };
        tokio::select! {
            done = sequence => done.map_err(Broke::Failed),
            event = next_event(process, stop, None) => Err(Broke::Ended(self.end(process, spec, event).await)),
        }
    }

    /// A woken engine serves again: counted, timed, published and marked ready.
    fn woke(&self, took: Duration) {
        tracing::info!(instance = %self.id, "awake in {:.2}s", took.as_secs_f64());
        let counters = &self.inner.counters;
        let labels = [self.model.as_str()];
        counters
            .wake_duration
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
        counters
            .swap_duration
            .with_label_values(&[self.model.as_str(), "wake"])
            .observe(took.as_secs_f64());
        let woke = json!({"instance": self.id, "seconds": took.as_secs_f64()});
        self.inner.lifecycle.publish("woke", &self.model, woke);
        self.inner.update(&self.id, |i| {
            i.phase.awake(SystemTime::now());
            i.last_used = Instant::now();
        });
    }

    /// Counts a sleep (`sleeping`) or a wake by its result.
    fn count_rest(&self, sleeping: bool, ok: bool) {
        let counters = &self.inner.counters;
        let family = if sleeping {
            &counters.sleeps
        } else {
            &counters.wakes
        };
        let labels = [
            self.model.as_str(),
            self.id.as_str(),
            if ok { "ok" } else { "failed" },
        ];
        family.with_label_values(&labels).inc();
    }
}
