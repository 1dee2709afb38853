//! Stopping instances on demand, at shutdown and when their TTL runs out, and waiting until they
//! have. Evictions for memory and swaps are decided elsewhere (`placement.rs`, `prepare.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Fleet, Retire, StopReason};

impl Fleet {
    /// Stops the given models' instances (all when `None`) and waits until they are stopped.
    pub async fn unload(&self, models: Option<&[String]>) {
        let targets: Vec<String> = {
            let mut st = self.inner.lock();
            let targets: Vec<String> = st
                .instances
                .values()
                .filter(|i| {
                    models.is_none_or(|ms| {
                        ms.iter().any(|m| **m == *i.model.id) || ms.iter().any(|m| **m == *i.id)
                    })
                })
                .map(|i| i.id.to_string())
                .collect();
            for id in &targets {
                let inst = st.instances.get_mut(id).expect("listed");
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Unload);
            }
            targets
        };
        self.wait_stopped(&targets).await;
    }

    /// Stops everything for shutdown; new requests are refused from now on.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let all: Vec<String> = {
            let mut st = self.inner.lock();
            for inst in st.instances.values_mut() {
                let grace = inst.model.unload_timeout;
                inst.order_stop(grace, StopReason::Shutdown);
            }
            st.instances.keys().cloned().collect()
        };
        self.inner.touch();
        self.wait_stopped(&all).await;
    }

    /// SIGKILLs every process group at once (a second shutdown signal).
    pub fn kill_all(&self) {
        for inst in self.inner.lock().instances.values() {
            if let Some(pid) = inst.phase.process().map(|p| p.pid) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    async fn wait_stopped(&self, ids: &[String]) {
        loop {
            let waiter = self.inner.changed.waiter();
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ids.iter().all(|id| {
                self.inner
                    .lock()
                    .instances
                    .get(id)
                    .is_none_or(|i| i.phase.is_stopped())
            }) {
                return;
            }
            notified.await;
        }
    }

    /// Unloads ready instances idle for longer than their TTL, carries a reload's changes out
    /// (`reload.rs`) and stops sleepers when the host runs low on memory. Runs until aborted.
    pub async fn run_ttl(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let mut st = self.inner.lock();
            let st = &mut *st;
            let retiring = st.instances.values().any(|i| i.retire != Retire::No);
            if retiring {
                self.retire_idle(st);
            }
            self.relieve_host(st);
            for inst in st.instances.values_mut() {
                let Some(ttl) = inst.ttl() else { continue };
                let queued = inst
                    .pool
                    .as_ref()
                    .is_some_and(|p| st.pools.get(p).is_some_and(|p| !p.queue.is_empty()));
                if (inst.phase.is_ready() || inst.phase.is_asleep())
                    && inst.reserved == 0
                    && inst.in_flight == 0
                    && !queued
                    && inst.last_used.elapsed() >= ttl
                {
                    tracing::info!(instance = %inst.id, "Unloading model, TTL of {}s reached", ttl.as_secs());
                    let grace = inst.model.unload_timeout;
                    inst.order_stop(grace, StopReason::Ttl);
                }
            }
        }
    }
}
