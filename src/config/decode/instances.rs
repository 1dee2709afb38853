//! The processes a model runs (itself, or one per replica), and how requests queue for them.

use std::time::Duration;

use super::launch::{decode_check_endpoint, launch_argv, stop_command, Launch};
use super::parse::{parse_proxy, secs, slots_from_argv};
use crate::config::engine::EngineModel;
use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::{Balance, ConfigError, InstanceSpec, PoolSettings};

/// The instances a model runs: one, or `replicas` of them with their own ports.
pub(super) fn decode_instances(
    id: &str,
    m: &MapReader<'_>,
    launch: &Launch,
    engine: Option<&EngineModel>,
) -> Result<Vec<InstanceSpec>, ConfigError> {
    let Some(replicas) = m.get(crate::config::top_keys::REPLICAS_KEY) else {
        return Ok(vec![single_instance(id, launch, engine)]);
    };
    let Value::Seq(items) = &replicas.value else {
        return Err(m.err("replicas", "internal: bad replica expansion"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| replica_instance(&format!("{id}-{i}"), item, m, launch, engine))
        .collect()
}

/// A model without replicas runs as itself.
fn single_instance(id: &str, launch: &Launch, engine: Option<&EngineModel>) -> InstanceSpec {
    let port = launch.port.unwrap_or(0);
    InstanceSpec {
        id: id.to_string(),
        argv: launch.argv.clone(),
        cmd_stop: launch.cmd_stop.clone(),
        proxy: launch.proxy.to_string(),
        port: launch.port,
        check_endpoint: launch.check_endpoint.clone(),
        slots: engine
            .and_then(|e| e.slots)
            .or_else(|| slots_from_argv(&launch.argv)),
        env: engine.map(|e| e.engine_env(port)).unwrap_or_default(),
    }
}

/// One replica, from the entry the expansion wrote with its own port substituted: an engine
/// builds its command for that port, a `cmd` is split again.
fn replica_instance(
    id: &str,
    item: &Node,
    m: &MapReader<'_>,
    launch: &Launch,
    engine: Option<&EngineModel>,
) -> Result<InstanceSpec, ConfigError> {
    let text = |key: &str| item.get(key).and_then(Node::scalar_text);
    let proxy = text("proxy").unwrap_or_default();
    let port = parse_proxy(&proxy).map_err(|e| m.err("proxy", e))?;
    let argv = launch_argv(m, engine, port, || Ok(text("cmd")))?;
    let cmd_stop = stop_command(text("cmdStop"), m)?;
    let check_endpoint = replica_check_endpoint(item, launch, engine);
    Ok(InstanceSpec {
        id: id.to_string(),
        env: engine
            .map(|e| e.engine_env(port.unwrap_or(0)))
            .unwrap_or_default(),
        slots: engine
            .and_then(|e| e.slots)
            .or_else(|| slots_from_argv(&argv)),
        argv,
        cmd_stop,
        proxy,
        port,
        check_endpoint,
    })
}

/// A replica's own `checkEndpoint`; an engine's model without one checks the engine's path.
fn replica_check_endpoint(
    item: &Node,
    launch: &Launch,
    engine: Option<&EngineModel>,
) -> Option<String> {
    match (engine, item.get("checkEndpoint")) {
        (Some(_), None) => launch.check_endpoint.clone(),
        (_, given) => decode_check_endpoint(given),
    }
}

/// `startReplicas`, `queueDepth`, `queueTimeout`, `slotsPollInterval`, `balance` and `prefixWait`.
pub(super) fn decode_pool(m: &MapReader<'_>) -> Result<PoolSettings, ConfigError> {
    let defaults = PoolSettings::default();
    Ok(PoolSettings {
        start_all: start_all(m)?,
        queue_depth: queue_depth(m, &defaults)?,
        queue_timeout: queue_timeout(m, &defaults)?,
        slots_poll: slots_poll(m, &defaults)?,
        balance: balance(m, &defaults)?,
        prefix_wait: decode_prefix_wait(m)?,
    })
}

/// `startReplicas`: whether every replica starts with the first request.
fn start_all(m: &MapReader<'_>) -> Result<bool, ConfigError> {
    match m.string("startReplicas")?.as_deref() {
        None | Some("on-demand") => Ok(false),
        Some("all") => Ok(true),
        Some(other) => Err(m.err(
            "startReplicas",
            format!("must be on-demand or all, not {other:?}"),
        )),
    }
}

/// `queueDepth`: how many requests may wait for a replica.
fn queue_depth(m: &MapReader<'_>, defaults: &PoolSettings) -> Result<usize, ConfigError> {
    match m.int("queueDepth")? {
        None => Ok(defaults.queue_depth),
        Some(d) if d >= 0 => Ok(d as usize),
        Some(_) => Err(m.err("queueDepth", "must be 0 or more")),
    }
}

/// `queueTimeout`: how long a request may wait for a replica.
fn queue_timeout(m: &MapReader<'_>, defaults: &PoolSettings) -> Result<Duration, ConfigError> {
    match m.int("queueTimeout")? {
        None => Ok(defaults.queue_timeout),
        Some(t) if t > 0 => Ok(secs(t)),
        Some(_) => Err(m.err("queueTimeout", "must be a number of seconds above 0")),
    }
}

/// `slotsPollInterval`: how often the replicas' free slots are read; 0 never.
fn slots_poll(m: &MapReader<'_>, defaults: &PoolSettings) -> Result<Option<Duration>, ConfigError> {
    match m.int("slotsPollInterval")? {
        None => Ok(defaults.slots_poll),
        Some(0) => Ok(None),
        Some(t) if t > 0 => Ok(Some(secs(t))),
        Some(_) => Err(m.err(
            "slotsPollInterval",
            "must be 0 (off) or a number of seconds",
        )),
    }
}

/// `balance`: how a request picks its replica.
fn balance(m: &MapReader<'_>, defaults: &PoolSettings) -> Result<Balance, ConfigError> {
    match m.string("balance")?.as_deref() {
        None => Ok(defaults.balance),
        Some("prefix") => Ok(Balance::Prefix),
        Some("slots") => Ok(Balance::Slots),
        Some("round-robin") => Ok(Balance::RoundRobin),
        Some(other) => Err(m.err(
            "balance",
            format!("must be prefix, slots or round-robin, not {other:?}"),
        )),
    }
}

/// `prefixWait`: milliseconds a request may wait for the replica holding its prefix.
fn decode_prefix_wait(m: &MapReader<'_>) -> Result<Duration, ConfigError> {
    match m.int("prefixWait")? {
        None => Ok(PoolSettings::default().prefix_wait),
        Some(ms) if (0..=60_000).contains(&ms) => Ok(Duration::from_millis(ms as u64)),
        Some(_) => Err(m.err(
            "prefixWait",
            "must be milliseconds from 0 (never wait) to 60000",
        )),
    }
}
