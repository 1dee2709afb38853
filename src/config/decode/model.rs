//! One `models.<id>` entry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::filters::{decode_filters, decode_timeouts};
use super::instances::{decode_instances, decode_pool};
use super::keys::{MODALITIES, MODEL_FILTER_KEYS, MODEL_KEYS, TIMEOUT_KEYS};
use super::launch::decode_launch;
use super::parse::secs;
use crate::config::engine::{decode_model_engine, EngineSettings};
use crate::config::read::MapReader;
use crate::config::yaml::Node;
use crate::config::{Capabilities, ConfigError, Device, MemorySpec, ModelConfig};

/// What a model takes from the top level when it does not say otherwise.
pub(super) struct ModelDefaults {
    pub engines: BTreeMap<&'static str, EngineSettings>,
    pub global_ttl: i64,
    pub unload: i64,
    pub send_loading_state: bool,
    pub devices: Vec<Device>,
}

/// ComfyUI's automatic model serves many clients at once and keeps its websockets, whatever
/// its entry says, as llama-swap treats it.
const COMFYUI_AUTO: &str = "comfyui_auto";

pub(super) fn decode_model(
    id: &str,
    node: &Node,
    d: &ModelDefaults,
    warnings: &mut Vec<String>,
) -> Result<ModelConfig, ConfigError> {
    let m = model_reader(id, node, warnings)?;
    let mut engine = decode_model_engine(id, &m, &d.engines, warnings)?;
    let sleep = super::sleep::decode_sleep(&m, engine.as_mut(), warnings)?;
    let launch = decode_launch(&m, engine.as_ref())?;
    super::sleep::warn_cmd(&m, engine.is_none(), sleep.as_ref(), &launch, warnings);
    let lifetime = decode_lifetime(id, &m, d)?;
    let about = decode_about(&m, warnings)?;
    let compat = m.child("compat", &["ignoreWebsockets"], warnings)?;
    let instances = decode_instances(id, &m, &launch, engine.as_ref())?;
    let pool = decode_pool(&m)?;
    let memory = decode_memory(&m, &d.devices, warnings)?;
    let load_timeout = crate::config::memory::seconds(&m, "loadTimeout")?;
    let ollama_name = engine.as_ref().and_then(|e| e.ollama_name());
    Ok(ModelConfig {
        engine: engine.map(Arc::new),
        memory,
        load_timeout,
        instances,
        pool,
        id: id.into(),
        argv: launch.argv,
        cmd_stop: launch.cmd_stop,
        proxy: launch.proxy,
        port: launch.port,
        aliases: m.strings("aliases")?,
        env: launch.env,
        check_endpoint: launch.check_endpoint,
        ttl: lifetime.ttl,
        unload_timeout: lifetime.unload_timeout,
        unlisted: m.boolean("unlisted")?.unwrap_or(false),
        use_model_name: m
            .string("useModelName")?
            .filter(|s| !s.is_empty())
            .or(ollama_name),
        name: about.name,
        description: about.description,
        concurrency_limit: lifetime.concurrency_limit,
        filters: decode_filters(&m, MODEL_FILTER_KEYS, warnings)?,
        metadata: about.metadata,
        send_loading_state: m
            .boolean("sendLoadingState")?
            .unwrap_or(d.send_loading_state),
        timeouts: decode_timeouts(&m.child("timeouts", TIMEOUT_KEYS, warnings)?, None)?,
        disable_keep_alives: m.boolean("disableKeepAlives")?.unwrap_or(false),
        ignore_websockets: compat.boolean("ignoreWebsockets")?.unwrap_or(false)
            || id == COMFYUI_AUTO,
        capabilities: about.capabilities,
        sleep: sleep.map(Arc::new),
    })
}

/// The entry's reader, once its id is known to be usable in URLs and logs.
fn model_reader<'n>(
    id: &str,
    node: &'n Node,
    warnings: &mut Vec<String>,
) -> Result<MapReader<'n>, ConfigError> {
    let m = MapReader::new(node, &format!("models.{id}"), MODEL_KEYS, warnings)?;
    if id.is_empty() || id.contains(char::is_whitespace) {
        return Err(ConfigError::at(
            node.loc.clone(),
            Some(m.path.clone()),
            "model ids must be non-empty and contain no spaces".into(),
        ));
    }
    Ok(m)
}

/// How long a model stays loaded and stopping, and how many requests it takes at once.
struct Lifetime {
    /// `None` never unloads.
    ttl: Option<Duration>,
    unload_timeout: Duration,
    concurrency_limit: usize,
}

/// `ttl` (-1 falls back to `globalTTL`), `unloadTimeout` (0 falls back to the top level) and
/// `concurrencyLimit` (0 means 10).
fn decode_lifetime(
    id: &str,
    m: &MapReader<'_>,
    d: &ModelDefaults,
) -> Result<Lifetime, ConfigError> {
    let ttl = ttl_seconds(m, d)?;
    let unload = unload_seconds(m, d)?;
    let limit = concurrency_limit(id, m)?;
    Ok(Lifetime {
        ttl: (ttl > 0).then(|| secs(ttl)),
        unload_timeout: secs(unload),
        concurrency_limit: if limit == 0 { 10 } else { limit as usize },
    })
}

/// `ttl` in seconds, -1 (or none) taking `globalTTL`'s.
fn ttl_seconds(m: &MapReader<'_>, d: &ModelDefaults) -> Result<i64, ConfigError> {
    match m.int("ttl")?.unwrap_or(-1) {
        -1 => Ok(d.global_ttl),
        t if t < 0 => Err(m.err(
            "ttl",
            "must be -1 (use globalTTL), 0 (never) or a number of seconds",
        )),
        t => Ok(t),
    }
}

/// `unloadTimeout` in seconds, 0 (or none) taking the top level's.
fn unload_seconds(m: &MapReader<'_>, d: &ModelDefaults) -> Result<i64, ConfigError> {
    match m.int("unloadTimeout")?.unwrap_or(0) {
        0 => Ok(d.unload),
        t if t < 0 => Err(m.err("unloadTimeout", "must be 0 or more")),
        t => Ok(t),
    }
}

/// `concurrencyLimit` as written (0: the default), at least 50 for ComfyUI's automatic model.
fn concurrency_limit(id: &str, m: &MapReader<'_>) -> Result<i64, ConfigError> {
    let mut limit = m.int("concurrencyLimit")?.unwrap_or(0);
    if limit < 0 {
        return Err(m.err("concurrencyLimit", "must be 0 or more"));
    }
    if id == COMFYUI_AUTO {
        limit = limit.max(50);
    }
    Ok(limit)
}

/// What the model list shows about a model.
struct About {
    name: Option<String>,
    description: Option<String>,
    metadata: serde_json::Map<String, serde_json::Value>,
    capabilities: Capabilities,
}

/// `name` (at most 128 characters), `description` (at most 1024), `metadata` and
/// `capabilities`; empty texts read as absent.
fn decode_about(m: &MapReader<'_>, warnings: &mut Vec<String>) -> Result<About, ConfigError> {
    let name = m.string("name")?;
    if name.as_ref().is_some_and(|n| n.chars().count() > 128) {
        return Err(m.err("name", "must be at most 128 characters"));
    }
    let description = m.string("description")?;
    if description
        .as_ref()
        .is_some_and(|n| n.chars().count() > 1024)
    {
        return Err(m.err("description", "must be at most 1024 characters"));
    }
    let metadata = match m.get("metadata") {
        None => serde_json::Map::new(),
        Some(n) => match n.to_json() {
            serde_json::Value::Object(o) => o,
            _ => return Err(m.err("metadata", "must be a mapping")),
        },
    };
    Ok(About {
        name: name.filter(|s| !s.is_empty()),
        description: description.filter(|s| !s.is_empty()),
        metadata,
        capabilities: decode_capabilities(m, warnings)?,
    })
}

fn decode_capabilities(
    m: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Capabilities, ConfigError> {
    let caps = m.child(
        "capabilities",
        &["in", "out", "tools", "reranker", "context", "disableAuto"],
        warnings,
    )?;
    Ok(Capabilities {
        input: modalities(&caps, "in")?,
        output: modalities(&caps, "out")?,
        tools: caps.boolean("tools")?.unwrap_or(false),
        reranker: caps.boolean("reranker")?.unwrap_or(false),
        context: match caps.int("context")? {
            Some(c) if c < 0 => return Err(caps.err("context", "must be 0 or more")),
            c => c.unwrap_or(0) as u64,
        },
        disable_auto: caps.boolean("disableAuto")?.unwrap_or(false),
    })
}

fn modalities(caps: &MapReader<'_>, key: &str) -> Result<Vec<String>, ConfigError> {
    let list = caps.strings(key)?;
    if let Some(bad) = list.iter().find(|m| !MODALITIES.contains(&m.as_str())) {
        return Err(caps.err(
            key,
            format!("{bad:?} is not one of text, audio, image, video"),
        ));
    }
    Ok(list)
}

/// `memory` (or a size from `params`) and `placement`: how much the model needs on which
/// devices, and whether it spreads over them or packs onto as few as it can.
fn decode_memory(
    m: &MapReader<'_>,
    devices: &[Device],
    warnings: &mut Vec<String>,
) -> Result<MemorySpec, ConfigError> {
    let mut memory = crate::config::memory::memory_spec(m, devices, warnings)?;
    crate::config::memory::size_from_params(m, &mut memory)?;
    memory.pack = match m.string("placement")?.as_deref() {
        None | Some("spread") => false,
        Some("pack") => true,
        Some(other) => {
            return Err(m.err(
                "placement",
                format!("must be spread or pack, not {other:?}"),
            ))
        }
    };
    Ok(memory)
}
