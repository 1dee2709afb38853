//! Taking a pool member out when it fails its clients: unreachable, or answering server errors
//! only. Kept apart because it acts on what the proxy saw, not on the fleet's own state.

use std::time::Duration;

use super::{Fleet, StopReason};

/// Server errors in a row after which a pool member is taken out (Envoy's outlier detection
/// default for consecutive 5xx).
pub const EJECT_AFTER_SERVER_ERRORS: u32 = 5;

impl Fleet {
    /// A pool member that could not be reached: stop it and count the failure, so the pool avoids it.
    pub fn report_unreachable(&self, id: &str) {
        let mut st = self.inner.lock();
        if let Some(inst) = st.instances.get_mut(id) {
            tracing::warn!(instance = id, "unreachable; taking it out of its pool");
            inst.order_stop(Duration::from_secs(1), StopReason::Unreachable);
        }
        drop(st);
        self.inner.touch();
    }

    /// Notes a pool member's answer. A member that answers server errors only (its health check
    /// passing while inference is broken) is taken out of its pool after
    /// [`EJECT_AFTER_SERVER_ERRORS`] in a row, as an unreachable one is: stopped, and started
    /// again only when demand needs it, after its backoff, unless no other member is ready.
    /// 503 (busy or loading) does not count.
    pub fn report_answer(&self, id: &str, status: http::StatusCode) {
        let broken = status.is_server_error() && status != http::StatusCode::SERVICE_UNAVAILABLE;
        let mut st = self.inner.lock();
        let Some(inst) = st.instances.get_mut(id) else {
            return;
        };
        if !broken {
            inst.server_errors = 0;
            return;
        }
        inst.server_errors += 1;
        if inst.server_errors < EJECT_AFTER_SERVER_ERRORS {
            return;
        }
        let Some(pool) = inst.pool.clone() else {
            return;
        };
        // never the last ready member: a client that keeps sending a request the engine answers
        // with 500 must not empty the pool
        let sibling_ready = st
            .instances
            .values()
            .any(|i| *i.id != *id && i.pool.as_ref() == Some(&pool) && i.phase.is_ready());
        let Some(inst) = st.instances.get_mut(id) else {
            return;
        };
        if !sibling_ready {
            return;
        }
        inst.server_errors = 0;
        tracing::warn!(
            instance = id,
            "answered {EJECT_AFTER_SERVER_ERRORS} server errors in a row; taking it out of its pool"
        );
        inst.order_stop(Duration::from_secs(1), StopReason::Ejected);
        let model = inst.model.id.clone();
        drop(st);
        self.inner
            .counters
            .ejections
            .with_label_values(&[&model, id])
            .inc();
        self.inner.touch();
    }
}
