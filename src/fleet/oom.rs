//! An engine that ran out of device memory although corral placed it: its charge was too low.
//! The charge is raised by what the engine asked for (or a margin when it did not say), and the
//! start tried once more, so placement evicts idle holders to make the room; a second failure is
//! final and answered as `insufficient_memory` with the figures.

use serde_json::json;

use super::{Inner, Phase};
use crate::supervisor::StartError;

/// The least a charge is raised by when the engine did not say how much it asked for.
const MIN_MARGIN: u64 = 1 << 30;

impl Inner {
    /// Raises `id`'s charge and leaves it stopped, for its waiters to start it again, when `err`
    /// is its first out-of-memory failure and corral places memory; false otherwise.
    pub(super) fn retry_after_out_of_memory(&self, id: &str, err: &StartError) -> bool {
        let StartError::Diagnosed {
            out_of_memory: Some(asked),
            ..
        } = err
        else {
            return false;
        };
        let mut st = self.lock();
        if st.config.devices.is_empty() {
            return false;
        }
        let Some(inst) = st.instances.get_mut(id) else {
            return false;
        };
        if inst.oom_retried {
            return false;
        }
        let extra = asked.unwrap_or_else(|| (inst.need.bytes / 4).max(MIN_MARGIN));
        let size = crate::memory::format_bytes;
        inst.need.source = format!(
            "{} + {} the engine asked for when it ran out of memory",
            inst.need.source,
            size(extra)
        );
        inst.need.bytes = inst.need.bytes.saturating_add(extra);
        inst.oom_retried = true;
        inst.phase = Phase::Stopped;
        let model = inst.model.id.clone();
        let charge = size(inst.need.bytes);
        drop(st);
        let fields = json!({"instance": id, "reason": err.to_string(), "retry": format!("starting again with {charge} charged")});
        self.lifecycle.publish("error", &model, fields);
        self.touch();
        true
    }
}

/// The answer to a start that ran out of memory again after its charge was raised.
pub(super) fn insufficient(id: &str, charged: u64, err: &StartError) -> String {
    format!(
        "insufficient_memory: {id} ran out of device memory with {} charged; {err}",
        crate::memory::format_bytes(charged)
    )
}
