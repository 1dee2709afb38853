//! Starting an instance: its devices pinned and its model split as the ledger placed it, and its
//! life handed to a supervising task. Kept apart because it is where scheduling meets processes.

use tokio::sync::watch;

use super::instance::Instance;
use super::{ledger, pinning, run, Fleet, Phase, State};
use crate::supervisor::{ProcessSpec, Sinks};

impl Fleet {
    /// Marks the instance starting and hands its life to a task. Returns the new generation.
    pub(super) fn start(&self, st: &mut State, id: &str) -> u64 {
        let beside = Self::held_beside(st, id);
        let inst = st.instances.get_mut(id).expect("known instance");
        inst.generation += 1;
        let (stop, rx) = watch::channel(None);
        inst.phase = Phase::Starting {
            stop,
            download: None,
            process: None,
            loading: None,
        };
        let sinks = Sinks {
            model: inst.logs.clone(),
            logs: self.inner.logs.clone(),
            upstream_to_stdout: st.config.log_to_stdout.upstream(),
            redactor: st.config.redactor.clone(),
        };
        let poll = inst.pool.as_ref().and(inst.model.pool.slots_poll);
        let shown = st.config.redactor.command_line(&inst.spec.argv);
        tracing::info!(instance = id, "starting: {shown}");
        let spec = placed_spec(&st.config, id, inst, &beside);
        // supervision runs on the control runtime, whichever thread's request started it
        self.inner.runtime.spawn(run::run(
            self.inner.clone(),
            spec,
            sinks,
            inst.generation,
            rx,
            poll,
        ));
        self.inner.touch();
        inst.generation
    }
}

/// The instance's command as the ledger placed it: pinned to its devices, its model split over
/// them, and told its share of each when the user sized it.
fn placed_spec(
    config: &crate::config::Config,
    id: &str,
    inst: &Instance,
    beside: &[u64],
) -> ProcessSpec {
    let mut spec = inst.spec.clone();
    // a model that chooses its own devices runs on those, not on the ledger's: told a split
    // or a share of those, it would be told of devices it cannot see
    let own_choice = pinning::user_selects(&spec.env, &spec.argv);
    let pins = pinning::visible_devices(
        &config.devices,
        &ledger::devices_of(&inst.placed),
        &spec.env,
        &spec.argv,
    );
    if !pins.is_empty() {
        tracing::info!(instance = id, "pinned to its devices: {pins:?}");
    }
    spec.env.extend(pins);
    let split = match own_choice {
        true => Vec::new(),
        false => pinning::split_args(&spec.argv, &inst.placed),
    };
    if !split.is_empty() {
        tracing::info!(instance = id, "split over its devices: {}", split.join(" "));
    }
    spec.argv.extend(split);
    // a share the user sized (`memory:`); a size from the weights alone leaves no room for
    // the KV cache, and the engine is better left to take what it takes
    if inst.model.memory.bytes.is_some() && !own_choice {
        let share = pinning::memory_share_args(&spec.argv, &inst.placed, &config.devices, beside);
        spec.argv.extend(share);
    }
    spec
}
