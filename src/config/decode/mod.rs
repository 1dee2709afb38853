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
use super::yaml::Node;
use super::{Config, ConfigError, Device, ModelConfig};
use model::{decode_model, ModelDefaults};
use parse::secs;
use settings::Settings;

pub use cors::CorsConfig;
pub(super) use keys::TOP_KEYS;
pub use parse::parse_go_duration;
pub use parse::split_command;

pub fn decode(root: &Node, warnings: &mut Vec<String>) -> Result<Config, ConfigError> {
    let top = MapReader::new(root, "", keys::TOP_KEYS, warnings)?;
    let s = settings::decode_settings(&top, warnings)?;
    let (models, devices) = decode_models(&top, &s, warnings)?;
    let ignore_paths = settings::ignore_paths(&top, warnings)?;
    let routing = routing::decode_routing(&top, &models, !devices.is_empty(), warnings)?;
    let profiles = profiles::decode_profiles(&top, warnings)?;
    let (preload, startup_profile) = settings::on_startup(&top, &profiles, warnings)?;
    let selectors = profiles::decode_selectors(&top, warnings)?;
    let peers = peers::decode_peers(&top, &models, warnings)?;
    let load_bandwidth = super::memory::load_bandwidth(&top)?;
    let device_refresh = super::memory::device_refresh(&top)?;
    let load_stall =
        super::memory::seconds(&top, "loadStallTimeout")?.unwrap_or(Duration::from_secs(30));
    let server = super::server::decode(&top, warnings)?;
    let cors = cors::decode_security(&top, warnings)?;
    let late = settings::decode_late_settings(&top, &s)?;
    let global_concurrency_limit = settings::global_concurrency_limit(&top)?;
    let config = Config {
        server,
        router: routing.router,
        devices,
        load_bandwidth,
        host_memory: super::memory::host_memory(&top)?,
        device_refresh,
        load_stall,
        health_check_timeout: secs(s.health),
        log_level: s.log_level,
        log_time_format: late.log_time_format,
        log_to_stdout: s.log_to_stdout,
        metrics_max_in_memory: late.metrics_max_in_memory,
        vllm_metric_names: late.vllm_metric_names,
        capture_buffer_mb: late.capture_buffer_mb,
        store_path: late.store_path,
        ui_session_headers: s.session_headers,
        performance_disabled: late.performance_disabled,
        performance_every: s.performance_every,
        start_port: late.start_port,
        send_loading_state: s.send_loading_state,
        include_aliases_in_list: late.include_aliases_in_list,
        global_ttl: secs(s.global_ttl),
        unload_timeout: secs(s.unload),
        api_keys: s.api_keys,
        open_metrics: s.open_metrics,
        ollama_api: s.ollama_api,
        allowed_hosts: s.allowed_hosts,
        cors,
        redactor: Default::default(),
        models,
        groups: routing.groups,
        profiles,
        selectors,
        peers,
        ignore_paths,
        preload,
        startup_profile,
        global_concurrency_limit,
        fifo_priority: routing.fifo_priority,
    };
    names::check_names(&top, &config)?;
    Ok(config)
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
        for alias in &model.aliases {
            let err = |msg: String| reader.err(&model.id, msg);
            if alias.is_empty() {
                return Err(err("aliases must not be empty".into()));
            }
            if ids.contains(alias) {
                return Err(err(format!("alias {alias:?} is also a model id")));
            }
            if let Some(other) = owner.insert(alias.clone(), model.id.to_string()) {
                if *other != *model.id {
                    return Err(err(format!(
                        "alias {alias:?} is also used by model {other:?}"
                    )));
                }
            }
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
    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    for m in models.values() {
        names.insert(&m.id, format!("model {:?}", &*m.id));
        for alias in &m.aliases {
            names.insert(alias, format!("an alias of model {:?}", &*m.id));
        }
    }
    for m in models.values() {
        for inst in m.instances.iter().filter(|i| *i.id != *m.id) {
            let Some(other) = names.get(inst.id.as_str()) else {
                continue;
            };
            let node = reader.node.get(&m.id);
            let at = node.and_then(|n| n.get("replicas")).or(node);
            return Err(ConfigError::at(
                at.map_or_else(|| reader.node.loc.clone(), |n| n.loc.clone()),
                Some(format!("{}.{}.replicas", reader.path, m.id)),
                format!(
                    "replica {:?} of model {:?} has the same name as {other}",
                    inst.id, &*m.id
                ),
            ));
        }
    }
    Ok(())
}
