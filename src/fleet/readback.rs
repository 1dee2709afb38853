//! An engine's own report of what it allocated on each device, in place of the estimate it was
//! charged. llama-server names the devices it was shown (`CUDA0`, `CUDA1`) in the order corral made
//! them visible, which is the instance's placement order. A device where it took more than its
//! charge (beyond the tolerance) is an overrun: logged, counted, corrected in the ledger, and if
//! that leaves the device holding more than it can, idle instances there are stopped.

use super::{gpu_use, ledger, Inner};

impl Inner {
    /// Replaces `id`'s charges by what its loaded engine reported in `log`, device by device.
    pub(super) fn read_back(&self, id: &str, log: &str) {
        let reported = ledger::measured_by_device(log);
        if reported.is_empty() {
            return;
        }
        let mut st = self.lock();
        let Some(inst) = st.instances.get_mut(id) else {
            return;
        };
        let (charges, overruns) = ledger::corrected(&inst.placed, &reported);
        inst.placed = charges;
        let names: Vec<String> = overruns
            .iter()
            .map(|o| {
                st.config
                    .devices
                    .get(o.device)
                    .map_or_else(|| o.device.to_string(), |d| d.name.clone())
            })
            .collect();
        for (o, name) in overruns.iter().zip(&names) {
            tracing::warn!(
                instance = id,
                "allocated {} on {name}, charged {}: the ledger now holds what it reported",
                crate::memory::format_bytes(o.reported),
                crate::memory::format_bytes(o.charged)
            );
            self.counters.overruns.with_label_values(&[name]).inc();
        }
        let stopped =
            !overruns.is_empty() && gpu_use::shed_overfull(&mut st, "an engine allocated more");
        drop(st);
        if stopped {
            self.touch();
        }
    }
}
