//! `filters` (request body rewrites) and `timeouts` (upstream connection limits), shared by
//! models and peers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::parse::secs;
use crate::config::read::MapReader;
use crate::config::yaml::Node;
use crate::config::{ConfigError, Filters, SetParam, Timeouts};

/// `filters`, reading only `keys` (peers take no `setParamsByID`); `model` is never stripped
/// nor set, since routing depends on it.
pub(super) fn decode_filters(
    m: &MapReader<'_>,
    keys: &[&str],
    warnings: &mut Vec<String>,
) -> Result<Filters, ConfigError> {
    let f = m.child("filters", keys, warnings)?;
    let strip_params = strip_params(&f)?;
    let set_params = as_params(&f, "setParams", f.get("setParams"))?;
    let mut set_params_by_id = BTreeMap::new();
    if let Some(by_id) = f.get("setParamsByID") {
        for (id, params) in by_id.entries() {
            set_params_by_id.insert(id.clone(), as_params(&f, "setParamsByID", Some(params))?);
        }
    }
    Ok(Filters {
        strip_params,
        set_params,
        set_params_by_id,
    })
}

/// `stripParams` (or `strip_params`): a comma-separated list, sorted, without `model`.
fn strip_params(f: &MapReader<'_>) -> Result<Vec<String>, ConfigError> {
    let strip = f
        .string("stripParams")?
        .or(f.string("strip_params")?)
        .unwrap_or_default();
    let mut strip_params: Vec<String> = strip
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "model")
        .map(String::from)
        .collect();
    strip_params.sort();
    strip_params.dedup();
    Ok(strip_params)
}

/// One `setParams` mapping (none or null sets nothing) found at `key` of `f`.
fn as_params(
    f: &MapReader<'_>,
    key: &str,
    node: Option<&Node>,
) -> Result<Vec<SetParam>, ConfigError> {
    match node.map(Node::to_json) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Object(o)) => Ok(set_params(o)),
        Some(_) => Err(f.err(key, "must be a mapping")),
    }
}

/// The entries of one `setParams` mapping, sorted by path, as llama-swap reads them: a key ending
/// in `?` is set-if-undefined and yields to the same key spelled without it; `model` (with or
/// without `?`) is never set, since routing depends on it.
fn set_params(raw: serde_json::Map<String, serde_json::Value>) -> Vec<SetParam> {
    let mut params: BTreeMap<String, SetParam> = BTreeMap::new();
    for (key, value) in raw {
        let (path, if_undefined) = match key.strip_suffix('?') {
            Some(path) => (path.to_string(), true),
            None => (key, false),
        };
        if path.is_empty() || path == "model" {
            continue;
        }
        let hard_already = params.get(&path).is_some_and(|p| !p.if_undefined);
        if if_undefined && hard_already {
            continue;
        }
        let param = SetParam {
            path: path.clone(),
            value,
            if_undefined,
        };
        params.insert(path, param);
    }
    params.into_values().collect()
}

/// `timeouts`; a response-header limit of 0 means none, as does a stream-idle limit of 0.
pub(super) fn decode_timeouts(
    t: &MapReader<'_>,
    response_header_default: Option<i64>,
) -> Result<Timeouts, ConfigError> {
    let get = |key: &str, default: i64| -> Result<Duration, ConfigError> {
        match t.int(key)? {
            Some(v) if v < 0 => Err(t.err(key, "must be 0 or more")),
            v => Ok(secs(v.unwrap_or(default))),
        }
    };
    let rh = get("responseHeader", response_header_default.unwrap_or(0))?;
    Ok(Timeouts {
        connect: get("connect", 30)?,
        keepalive: get("keepalive", 30)?,
        response_header: (!rh.is_zero()).then_some(rh),
        tls_handshake: get("tlsHandshake", 10)?,
        expect_continue: get("expectContinue", 1)?,
        idle_conn: get("idleConn", 90)?,
        stream_idle: Some(get("streamIdle", 600)?).filter(|d| !d.is_zero()),
    })
}
