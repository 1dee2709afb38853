//! From the expanded tree to the typed [`Config`], with llama-swap's defaults and validation (§1.2-1.4).
//!
//! Values are read in a fixed order, so that a config with several errors always reports the
//! same one first; each submodule reads one part of the file.

mod api_keys;
mod cors;
mod filters;
mod groups;
mod instances;
mod keys;
mod launch;
mod model;
mod names;
mod parse;
mod peers;
mod profiles;
mod routing;
mod settings;
mod sleep;

#[cfg(test)]
mod names_tests;
#[cfg(test)]
mod order_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::read::MapReader;
use super::top_keys::TOP_KEYS;
use super::yaml::Node;
use super::{Config, ConfigError, Device, ModelConfig, Peer, Profile, Selector, ServerSettings};
use model::{decode_model, ModelDefaults};
use parse::secs;
use settings::Settings;

pub use cors::CorsConfig;
pub use parse::parse_go_duration;

pub fn decode(root: &Node, warnings: &mut Vec<String>) -> Result<Config, ConfigError> {
    let top = MapReader::new(root, "", TOP_KEYS, warnings)?;
    let s = settings::decode_settings(&top, warnings)?;
    let serving = decode_serving(&top, &s, warnings)?;
    let process = decode_process(&top, &s, warnings)?;
    let config = assemble(s, serving, process);
    names::check_names(&top, &config)?;
    Ok(config)
}

/// The models and the sections that name them, read after the settings.
struct Serving {
    models: BTreeMap<String, ModelConfig>,
    devices: Vec<Device>,
    ignore_paths: Vec<regex::Regex>,
    routing: routing::Routing,
    profiles: BTreeMap<String, Profile>,
    preload: Vec<String>,
    startup_profile: Option<String>,
    selectors: BTreeMap<String, Selector>,
    peers: BTreeMap<String, Peer>,
}

/// The sections about corral's process as a whole, read last.
struct Process {
    load_bandwidth: u64,
    host_memory: Option<u64>,
    device_refresh: Option<Duration>,
    load_stall: Duration,
    server: ServerSettings,
    cors: Option<CorsConfig>,
    late: settings::LateSettings,
    global_concurrency_limit: usize,
}

fn decode_serving(
    top: &MapReader<'_>,
    s: &Settings<'_>,
    warnings: &mut Vec<String>,
) -> Result<Serving, ConfigError> {
    let (models, devices) = decode_models(top, s, warnings)?;
    let ignore_paths = settings::ignore_paths(top, warnings)?;
    let routing = routing::decode_routing(top, &models, !devices.is_empty(), warnings)?;
    let profiles = profiles::decode_profiles(top, warnings)?;
    let (preload, startup_profile) = settings::on_startup(top, &profiles, warnings)?;
    let selectors = profiles::decode_selectors(top, warnings)?;
    let peers = peers::decode_peers(top, &models, warnings)?;
    Ok(Serving {
        models,
        devices,
        ignore_paths,
        routing,
        profiles,
        preload,
        startup_profile,
        selectors,
        peers,
    })
}

/// Read field by field in the order written, which is the order errors are reported in.
fn decode_process(
    top: &MapReader<'_>,
    s: &Settings<'_>,
    warnings: &mut Vec<String>,
) -> Result<Process, ConfigError> {
    Ok(Process {
        load_bandwidth: super::memory::load_bandwidth(top)?,
        host_memory: super::memory::host_memory(top)?,
        device_refresh: super::memory::device_refresh(top)?,
        load_stall: super::memory::seconds(top, "loadStallTimeout")?
            .unwrap_or(Duration::from_secs(30)),
        server: super::server::decode(top, warnings)?,
        cors: cors::decode_security(top, warnings)?,
        late: settings::decode_late_settings(top, s)?,
        global_concurrency_limit: settings::global_concurrency_limit(top)?,
    })
}

/// The [`Config`] from its decoded parts (the names in it not yet checked against each other).
fn assemble(s: Settings<'_>, v: Serving, p: Process) -> Config {
    Config {
        server: p.server,
        router: v.routing.router,
        devices: v.devices,
        load_bandwidth: p.load_bandwidth,
        host_memory: p.host_memory,
        device_refresh: p.device_refresh,
        load_stall: p.load_stall,
        health_check_timeout: secs(s.health),
        log_level: s.log_level,
        log_time_format: p.late.log_time_format,
        log_to_stdout: s.log_to_stdout,
        metrics_max_in_memory: p.late.metrics_max_in_memory,
        vllm_metric_names: p.late.vllm_metric_names,
        capture_buffer_mb: p.late.capture_buffer_mb,
        store_path: p.late.store_path,
        ui_session_headers: s.session_headers,
        performance_disabled: p.late.performance_disabled,
        performance_every: s.performance_every,
        start_port: p.late.start_port,
        send_loading_state: s.send_loading_state,
        include_aliases_in_list: p.late.include_aliases_in_list,
        global_ttl: secs(s.global_ttl),
        unload_timeout: secs(s.unload),
        api_keys: s.api_keys,
        open_metrics: s.open_metrics,
        ollama_api: s.ollama_api,
        allowed_hosts: s.allowed_hosts,
        cors: p.cors,
        redactor: Default::default(),
        models: v.models,
        groups: v.routing.groups,
        profiles: v.profiles,
        selectors: v.selectors,
        peers: v.peers,
        ignore_paths: v.ignore_paths,
        preload: v.preload,
        startup_profile: v.startup_profile,
        global_concurrency_limit: p.global_concurrency_limit,
        fifo_priority: v.routing.fifo_priority,
    }
}

/// Every `models` entry, with the engines and devices they may use.
fn decode_models(
    top: &MapReader<'_>,
    s: &Settings<'_>,
    warnings: &mut Vec<String>,
) -> Result<(BTreeMap<String, ModelConfig>, Vec<Device>), ConfigError> {
    let models_node = top.child("models", &[], &mut Vec::new())?;
    let engines = super::engine::decode_engines(top, warnings)?;
    let devices = super::memory::devices(top, warnings)?;
    let defaults = ModelDefaults {
        engines,
        global_ttl: s.global_ttl,
        unload: s.unload,
        send_loading_state: s.send_loading_state,
        devices,
    };
    let mut models = BTreeMap::new();
    for (id, node) in models_node.entries() {
        let model = decode_model(id, node, &defaults, warnings)?;
        models.insert(id.clone(), model);
    }
    register_aliases(&mut models, &models_node)?;
    check_replica_ids(&models, &models_node)?;
    Ok((models, defaults.devices))
}

/// Aliases (and `setParamsByID` keys, which act as aliases) must name one model only.
fn register_aliases(
    models: &mut BTreeMap<String, ModelConfig>,
    reader: &MapReader<'_>,
) -> Result<(), ConfigError> {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let ids: BTreeSet<String> = models.keys().cloned().collect();
    for model in models.values_mut() {
        gather_aliases(model);
        for alias in &model.aliases {
            claim_alias(alias, model, &ids, &mut owner, reader)?;
        }
    }
    Ok(())
}

/// The model's `setParamsByID` keys join its aliases, and its own id leaves them.
fn gather_aliases(model: &mut ModelConfig) {
    // the id already names the model: an alias repeating it (llama-swap accepts one) would
    // only list it twice
    let id = model.id.clone();
    model.aliases.retain(|a| **a != *id);
    let extra: Vec<String> = model
        .filters
        .set_params_by_id
        .keys()
        .filter(|k| **k != *model.id && !model.aliases.contains(k))
        .cloned()
        .collect();
    model.aliases.extend(extra);
}

/// Records `alias` as `model`'s in `owner`, refusing an empty one or one that names another
/// model or another model's alias.
fn claim_alias(
    alias: &str,
    model: &ModelConfig,
    ids: &BTreeSet<String>,
    owner: &mut BTreeMap<String, String>,
    reader: &MapReader<'_>,
) -> Result<(), ConfigError> {
    let err = |msg: String| reader.err(&model.id, msg);
    if alias.is_empty() {
        return Err(err("aliases must not be empty".into()));
    }
    if ids.contains(alias) {
        return Err(err(format!("alias {alias:?} is also a model id")));
    }
    if let Some(other) = owner.insert(alias.to_string(), model.id.to_string()) {
        if *other != *model.id {
            return Err(err(format!(
                "alias {alias:?} is also used by model {other:?}"
            )));
        }
    }
    Ok(())
}

/// A replica is reached by its id (`<model>-<n>`) as a model is, so the id must not also be
/// another model's id or alias: one of the two would silently shadow the other.
fn check_replica_ids(
    models: &BTreeMap<String, ModelConfig>,
    reader: &MapReader<'_>,
) -> Result<(), ConfigError> {
    let names = names_taken(models);
    for m in models.values() {
        for inst in m.instances.iter().filter(|i| *i.id != *m.id) {
            if let Some(other) = names.get(inst.id.as_str()) {
                return Err(replica_clash(reader, m, &inst.id, other));
            }
        }
    }
    Ok(())
}

/// Every model id and alias, with how an error names what holds it.
fn names_taken(models: &BTreeMap<String, ModelConfig>) -> BTreeMap<&str, String> {
    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    for m in models.values() {
        names.insert(&m.id, format!("model {:?}", &*m.id));
        for alias in &m.aliases {
            names.insert(alias, format!("an alias of model {:?}", &*m.id));
        }
    }
    names
}

/// The error for replica `replica` of `m` named as `other` is, at the model's `replicas`.
fn replica_clash(
    reader: &MapReader<'_>,
    m: &ModelConfig,
    replica: &str,
    other: &str,
) -> ConfigError {
    let node = reader.node.get(&m.id);
    let at = node.and_then(|n| n.get("replicas")).or(node);
    ConfigError::at(
        at.map_or_else(|| reader.node.loc.clone(), |n| n.loc.clone()),
        Some(format!("{}.{}.replicas", reader.path, m.id)),
        format!(
            "replica {:?} of model {:?} has the same name as {other}",
            replica, &*m.id
        ),
    )
}
