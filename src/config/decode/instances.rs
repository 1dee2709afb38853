//! The processes a model runs (itself, or one per replica), and how requests queue for them.

use std::time::Duration;

use super::launch::{decode_check_endpoint, Launch};
use super::parse::{parse_proxy, secs, slots_from_argv};
use crate::config::command::split_command;
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
    let argv = match engine {
        Some(e) => e.argv(port.unwrap_or(0), None),
        None => split_command(&text("cmd").unwrap_or_default()).map_err(|e| m.err("cmd", e))?,
    };
    let cmd_stop = match text("cmdStop") {
        Some(s) if !s.trim().is_empty() => {
            Some(split_command(&s).map_err(|e| m.err("cmdStop", e))?)
        }
        _ => None,
    };
    let check_endpoint = match (engine, item.get("checkEndpoint")) {
        (Some(_), None) => launch.check_endpoint.clone(),
        (_, given) => decode_check_endpoint(given),
    };
    let slots = engine
        .and_then(|e| e.slots)
        .or_else(|| slots_from_argv(&argv));
    Ok(InstanceSpec {
        id: id.to_string(),
        env: engine
            .map(|e| e.engine_env(port.unwrap_or(0)))
            .unwrap_or_default(),
        argv,
        cmd_stop,
        proxy,
        port,
        check_endpoint,
        slots,
    })
}

/// `startReplicas`, `queueDepth`, `queueTimeout`, `slotsPollInterval`, `balance` and `prefixWait`.
pub(super) fn decode_pool(m: &MapReader<'_>) -> Result<PoolSettings, ConfigError> {
    let defaults = PoolSettings::default();
    let start_all = match m.string("startReplicas")?.as_deref() {
        None | Some("on-demand") => false,
        Some("all") => true,
        Some(other) => {
            return Err(m.err(
                "startReplicas",
                format!("must be on-demand or all, not {other:?}"),
            ))
        }
    };
    let depth = match m.int("queueDepth")? {
        None => defaults.queue_depth,
        Some(d) if d >= 0 => d as usize,
        Some(_) => return Err(m.err("queueDepth", "must be 0 or more")),
    };
    let timeout = match m.int("queueTimeout")? {
        None => defaults.queue_timeout,
        Some(t) if t > 0 => secs(t),
        Some(_) => return Err(m.err("queueTimeout", "must be a number of seconds above 0")),
    };
    let poll = match m.int("slotsPollInterval")? {
        None => defaults.slots_poll,
        Some(0) => None,
        Some(t) if t > 0 => Some(secs(t)),
        Some(_) => {
            return Err(m.err(
                "slotsPollInterval",
                "must be 0 (off) or a number of seconds",
            ))
        }
    };
    let balance = match m.string("balance")?.as_deref() {
        None => defaults.balance,
        Some("prefix") => Balance::Prefix,
        Some("slots") => Balance::Slots,
        Some("round-robin") => Balance::RoundRobin,
        Some(other) => {
            return Err(m.err(
                "balance",
                format!("must be prefix, slots or round-robin, not {other:?}"),
            ))
        }
    };
    Ok(PoolSettings {
        balance,
        prefix_wait: decode_prefix_wait(m)?,
        start_all,
        queue_depth: depth,
        queue_timeout: timeout,
        slots_poll: poll,
    })
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
