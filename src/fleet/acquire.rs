//! The path of a request for one instance by its own id: reserve a place, then loop under the lock
//! until the instance is ready (or the request must fail), waiting for the next change between
//! tries. The pool path is in `pool.rs`; what each try decides is in `prepare.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::instance::Instance;
use super::lease::{Lease, Reservation, Turn};
use super::prepare::Prepared;
use super::{oom, prefix, Fleet, Retire};
use crate::config::catalog::Target;
use crate::proxy::error::Error;
use crate::supervisor::StartError;

/// What a direct request carries from one try to the next.
#[derive(Default)]
struct Direct {
    /// A place among swap waiters, taken only if the model is not ready at once.
    turn: Option<Turn>,
    /// The generation of the start this request waits on, so that start failing fails it.
    awaited: Option<u64>,
    /// Since when, and why, busy instances have held the memory it needs: waited for at most the
    /// model's queue timeout.
    no_room: Option<(tokio::time::Instant, String)>,
}

impl Fleet {
    /// Waits for a lease on a ready instance for `target`; `avoid` skips one pool member (a retry).
    pub async fn acquire(&self, target: &Target, avoid: Option<&str>) -> Result<Lease, Error> {
        self.acquire_for(target, avoid, None).await
    }

    /// As [`Fleet::acquire`], with the request's prompt blocks for a pool that balances by prefix.
    pub async fn acquire_for(
        &self,
        target: &Target,
        avoid: Option<&str>,
        prompt: Option<&prefix::Prefix>,
    ) -> Result<Lease, Error> {
        match target {
            Target::Instance(id) => self.acquire_instance(id).await,
            Target::Pool(id) => self.acquire_pool(id, avoid, prompt).await,
        }
    }

    async fn acquire_instance(&self, id: &str) -> Result<Lease, Error> {
        let reservation = self.reserve(id)?;
        let mut direct = Direct::default();
        // ready with room, as nearly every request finds it: nothing to wait for
        if let Some(proxy) = self.try_direct(&reservation.id, &mut direct)? {
            return Ok(reservation.into_lease(proxy));
        }
        loop {
            let waiter = self.inner.changed.waiter();
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(proxy) = self.try_direct(&reservation.id, &mut direct)? {
                return Ok(reservation.into_lease(proxy));
            }
            match &direct.no_room {
                Some((since, _)) => {
                    let deadline = crate::clock::deadline::after(*since, self.no_room_limit(id));
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// One try under the lock: the ready instance's address once this request is counted in
    /// flight there, `None` to wait for the next change, or the error that ends the request.
    /// `held` is the id's `Arc` the request reserved on (see `holder`): an instance under the
    /// same id that a later reload added is not the one it holds.
    fn try_direct(&self, held: &Arc<str>, direct: &mut Direct) -> Result<Option<Arc<str>>, Error> {
        let id: &str = held;
        let mut st = self.inner.lock();
        self.check_open(id)?;
        let replaced = |i: &Instance| i.retire != Retire::No && i.phase.is_stopped();
        if st.instances.get(id).is_some_and(replaced) {
            // its successor (if a reload kept it) is this request's now, not the start it awaited
            self.retire_idle(&mut st);
            direct.awaited = None;
        }
        let Some(inst) = st.instances.get(id).filter(|i| Arc::ptr_eq(&i.id, held)) else {
            return Err(Error::UnknownModel); // removed by a reload while waiting
        };
        if let Some(err) = failed_start(inst, direct.awaited) {
            return Err(err);
        }
        if inst.phase.is_stopped() && inst.in_backoff() && direct.awaited.is_none() {
            return Err(backoff_error(inst));
        }
        if direct.turn.is_none() && !inst.phase.is_ready() {
            direct.turn = Some(self.take_turn(&mut st, id));
        }
        match self.prepare(&mut st, id, direct.turn.as_ref().map(|t| t.seq)) {
            Prepared::Ready => {
                let inst = st.instances.get_mut(id).expect("known instance");
                inst.in_flight += 1;
                return Ok(Some(inst.proxy.clone()));
            }
            Prepared::Started(generation) => direct.awaited = Some(generation),
            Prepared::Starting(generation) if direct.awaited.is_none() => {
                direct.awaited = Some(generation)
            }
            Prepared::NeverFits(why) => return Err(Error::InsufficientMemory(why)),
            Prepared::Removed => return Err(Error::UnknownModel),
            Prepared::NoRoom(why) => {
                let limit = st.instances[id].model.pool.queue_timeout;
                let since = direct
                    .no_room
                    .take()
                    .map_or_else(tokio::time::Instant::now, |(t, _)| t);
                if since.elapsed() >= limit {
                    return Err(Error::InsufficientMemory(why));
                }
                direct.no_room = Some((since, why));
            }
            _ => direct.no_room = None,
        }
        Ok(None)
    }

    /// How long a request waits while busy instances hold the memory its model needs: the
    /// model's queue timeout (none for an instance a reload removed).
    fn no_room_limit(&self, id: &str) -> Duration {
        self.inner
            .lock()
            .instances
            .get(id)
            .map_or(Duration::ZERO, |i| i.model.pool.queue_timeout)
    }

    pub(super) fn check_open(&self, what: &str) -> Result<(), Error> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown(what.to_string()));
        }
        Ok(())
    }

    fn reserve(&self, id: &str) -> Result<Reservation, Error> {
        let mut st = self.inner.lock();
        let inst = st.instances.get_mut(id).ok_or(Error::UnknownModel)?;
        if inst.reserved >= inst.model.concurrency_limit {
            return Err(Error::ConcurrencyLimit);
        }
        inst.reserved += 1;
        Ok(Reservation {
            inner: self.inner.clone(),
            id: inst.id.clone(),
            done: false,
        })
    }
}

/// The error for a request that finds its instance backing off after failed starts.
pub(super) fn backoff_error(inst: &Instance) -> Error {
    let wait = inst.retry_at.map_or(0, |t| {
        t.saturating_duration_since(Instant::now()).as_secs() + 1
    });
    let last = inst
        .last_error
        .as_ref()
        .map(|(_, e)| format!("; last error: {e}"))
        .unwrap_or_default();
    let what = if inst.circuit_open() {
        "circuit open"
    } else {
        "backing off"
    };
    Error::Busy {
        status: 503,
        message: format!(
            "{} failed {} times in a row ({what}, next start in {wait}s){last}",
            inst.id, inst.failures
        ),
        retry_after: wait.max(1),
    }
}

/// The error for the start a request waited on (`awaited`, its generation), when that start failed.
pub(super) fn failed_start(inst: &Instance, awaited: Option<u64>) -> Option<Error> {
    let awaited = awaited?;
    match &inst.last_error {
        Some((generation, err)) if *generation == awaited && inst.phase.is_stopped() => {
            Some(match **err {
                StartError::Aborted => Error::Unloaded,
                ref e @ StartError::Diagnosed {
                    out_of_memory: Some(_),
                    ..
                } => Error::InsufficientMemory(oom::insufficient(&inst.id, inst.need.bytes, e)),
                ref e => Error::StartFailed(e.to_string()),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fleet::testing::{fleet, make_ready};
    use crate::fleet::StopReason;

    /// A ready instance told to stop (its idle time ran out, a swap needs its memory) takes no
    /// new request: one that comes before the stop is carried out waits for what comes next,
    /// where it used to be sent to a process about to be stopped under it.
    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_an_instance_told_to_stop() {
        let fleet = fleet("models:\n  m:\n    cmd: /bin/false\n    proxy: http://127.0.0.1:9\n");
        let _engine = make_ready(&fleet, "m");
        let target = Target::Instance("m".into());
        drop(
            fleet
                .acquire(&target, None)
                .await
                .expect("a ready instance serves"),
        );

        fleet.inner.lock().instances["m"].order_stop(Duration::ZERO, StopReason::Ttl);
        let waited = tokio::time::timeout(Duration::from_secs(5), fleet.acquire(&target, None));
        assert!(
            waited.await.is_err(),
            "no lease on an instance told to stop"
        );
    }

    /// A request that waits for a model while a reload removes it and another adds it back is
    /// answered that its model is gone: it holds a reservation on the removed instance, and
    /// counted in flight on the new one it would keep that one busy for good.
    #[tokio::test]
    async fn a_request_for_a_removed_model_is_not_served_by_its_return() {
        use crate::fleet::testing::config;
        let with_m = "models:\n  m:\n    cmd: /bin/false\n    proxy: http://127.0.0.1:9\n";
        let fleet = fleet(with_m);
        let reservation = fleet.reserve("m").unwrap();
        fleet.reconfigure(config(
            "models:\n  n:\n    cmd: /bin/false\n    proxy: http://127.0.0.1:9\n",
        ));
        fleet.reconfigure(config(with_m));
        let _engine = make_ready(&fleet, "m");

        let tried = fleet.try_direct(&reservation.id, &mut Direct::default());
        assert!(matches!(tried, Err(Error::UnknownModel)), "{tried:?}");
        drop(reservation);
        let st = fleet.inner.lock();
        assert_eq!(
            (st.instances["m"].in_flight, st.instances["m"].reserved),
            (0, 0)
        );
    }
}
