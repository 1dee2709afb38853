//! Building the fleet's instances and pools from a config, and deciding on reload which running
//! instances keep their process. Split out of `mod.rs` because it is pure construction from a
//! config, apart from the locking and scheduling there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::instance::{Instance, Retire};
use super::ledger::{self, Need};
use super::prefix::PrefixMemory;
use super::{Phase, PoolState};
use crate::config::catalog::Catalog;
use crate::config::{Config, InstanceSpec, ModelConfig};
use crate::logs::LogRing;
use crate::sources::Fetcher;
use crate::supervisor::ProcessSpec;

/// Every instance a config describes, stopped.
pub(super) fn build_instances(
    config: &Config,
    catalog: &Catalog,
    fetcher: &Fetcher,
) -> BTreeMap<String, Instance> {
    let mut instances = BTreeMap::new();
    for m in config.models.values() {
        let model = Arc::new(m.clone());
        for spec in &m.instances {
            let pool = catalog.instances.get(&spec.id).and_then(|r| r.pool.clone());
            let need = ledger::need_of(m, &sized_spec(m, spec, fetcher));
            let process = process_spec(config, m, spec, &need);
            let instance = stopped_instance(model.clone(), pool, spec, process, need);
            instances.insert(spec.id.clone(), instance);
        }
    }
    instances
}

/// The process an instance runs: its command with the model's environment, and a load deadline
/// that grows with the weights it must read.
fn process_spec(config: &Config, m: &ModelConfig, spec: &InstanceSpec, need: &Need) -> ProcessSpec {
    let mut env = spec.env.clone();
    env.extend(m.env.iter().cloned());
    if !config.devices.is_empty() && wants_buffer_report(&spec.argv, &env) {
        // llama-server prints its allocations at verbosity 4; the ledger reads them
        env.push(("LLAMA_ARG_LOG_VERBOSITY".into(), "4".into()));
    }
    let load_timeout = crate::memory::load_deadline(
        config.health_check_timeout,
        need.weights,
        config.load_bandwidth,
        m.load_timeout,
    );
    ProcessSpec {
        id: spec.id.clone(),
        argv: spec.argv.clone(),
        base: spec.proxy.clone(),
        env,
        withheld: withheld_from_engines(config),
        cmd_stop: spec.cmd_stop.clone(),
        health_url: spec.check_endpoint.as_ref().and_then(|p| {
            format!("{}{}", spec.proxy.trim_end_matches('/'), p)
                .parse()
                .ok()
        }),
        load_timeout,
        stall: config.load_stall,
        extend_on_progress: m.load_timeout.is_some() || load_timeout > config.health_check_timeout,
    }
}

/// The variables of corral's environment that hold one of its API keys or peer keys: an engine
/// does not inherit them.
fn withheld_from_engines(config: &Config) -> Vec<std::ffi::OsString> {
    let keys = config.api_keys.iter().map(|k| k.key.as_str());
    let peer_keys = config.peers.values().filter_map(|p| p.api_key.as_deref());
    let secrets: Vec<&str> = keys.chain(peer_keys).collect();
    if secrets.is_empty() {
        return Vec::new();
    }
    crate::supervisor::holding_secrets(std::env::vars_os(), &secrets)
}

/// An instance as it is before its first start: stopped, idle, never failed.
fn stopped_instance(
    model: Arc<ModelConfig>,
    pool: Option<String>,
    spec: &InstanceSpec,
    process: ProcessSpec,
    need: Need,
) -> Instance {
    let slots = spec.slots.unwrap_or(model.concurrency_limit);
    Instance {
        id: spec.id.as_str().into(),
        model,
        pool,
        spec: process,
        proxy: spec.proxy.as_str().into(),
        logs: Arc::new(LogRing::default()),
        phase: Phase::Stopped,
        reserved: 0,
        in_flight: 0,
        external_busy: 0,
        recent_ends: Default::default(),
        slots,
        last_used: Instant::now(),
        last_picked: 0,
        generation: 0,
        last_error: None,
        failures: 0,
        retry_at: None,
        server_errors: 0,
        need,
        placed: Vec::new(),
        measured: None,
        asleep_use: None,
        oom_retried: false,
        retire: Retire::No,
        keep_alive: None,
        rest: tokio::sync::watch::channel(false).0,
        engine_sleeping: false,
    }
}

/// The pools a catalog names; a pool that existed before keeps its queue, and its prefix memory
/// when its members are the same (the memory names members by their place in the list).
pub(super) fn build_pools(
    config: &Config,
    catalog: &Catalog,
    old: &mut BTreeMap<String, PoolState>,
) -> BTreeMap<String, PoolState> {
    catalog
        .pools
        .values()
        .map(|p| {
            let settings = config.models[&p.model].pool.clone();
            let (queue, prefixes) = match old.remove(&p.id) {
                Some(o) if o.members == p.members => (o.queue, o.prefixes),
                Some(o) => (o.queue, PrefixMemory::default()),
                None => Default::default(),
            };
            (
                p.id.clone(),
                PoolState {
                    members: p.members.clone(),
                    settings,
                    queue,
                    prefixes,
                },
            )
        })
        .collect()
}

/// Two specs run the same process: same command, environment, address and stop command.
pub(super) fn same_process(a: &ProcessSpec, b: &ProcessSpec) -> bool {
    a.argv == b.argv
        && a.env == b.env
        && a.base == b.base
        && a.cmd_stop == b.cmd_stop
        && a.health_url == b.health_url
}

/// The spec to size an instance by: for a model named by source whose weights are in the caches
/// already, its command over the cached files, so the estimate reads their headers.
fn sized_spec(m: &ModelConfig, spec: &InstanceSpec, fetcher: &Fetcher) -> InstanceSpec {
    let Some(engine) = m.engine.as_ref().filter(|e| e.needs_fetch()) else {
        return spec.clone();
    };
    let Some(cached) = fetcher.cached_for_sizing(&engine.source, &engine.want()) else {
        return spec.clone();
    };
    let model = cached.model.display().to_string();
    let mut sized = spec.clone();
    let weights = crate::config::engine::Weights {
        model: &model,
        mmproj: None,
    };
    sized.argv = engine.argv(spec.port.unwrap_or(0), Some(weights));
    sized
}

/// A llama-server whose verbosity the user did not set.
fn wants_buffer_report(argv: &[String], env: &[(String, String)]) -> bool {
    let is_llama = argv.first().is_some_and(|a| {
        a.rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("llama-server"))
    });
    let set_in_argv = argv.iter().any(|a| {
        matches!(
            a.as_str(),
            "-lv" | "--verbosity" | "--log-verbosity" | "-v" | "--verbose"
        )
    });
    let set_in_env = env.iter().any(|(k, _)| k == "LLAMA_ARG_LOG_VERBOSITY")
        || std::env::var_os("LLAMA_ARG_LOG_VERBOSITY").is_some();
    is_llama && !set_in_argv && !set_in_env
}
