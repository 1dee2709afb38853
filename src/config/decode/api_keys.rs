//! `apiKeys`: who may reach which routes.

use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::{ApiKey, ConfigError, Scope};

/// `apiKeys`: plain strings (admin keys, as in llama-swap) or
/// `{key: K, scope: admin|inference|metrics, name: N, models: [...]}`.
pub(super) fn decode_api_keys(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<ApiKey>, ConfigError> {
    let items = match top.get("apiKeys").map(|n| &n.value) {
        None => return Ok(Vec::new()),
        Some(Value::Seq(items)) => items,
        Some(_) => return Err(top.err("apiKeys", "must be a list of keys")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| decode_api_key(item, &format!("apiKeys[{i}]"), warnings))
        .collect()
}

/// One key: a plain string (an admin key) or a mapping with its scope.
fn decode_api_key(
    item: &Node,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<ApiKey, ConfigError> {
    let at = |msg: &str| ConfigError::at(item.loc.clone(), Some(path.into()), msg.into());
    let key = match &item.value {
        Value::Map(_) => {
            let r = MapReader::new(item, path, &["key", "scope", "name", "models"], warnings)?;
            return scoped_key(&r);
        }
        Value::Seq(_) | Value::Null => {
            return Err(at("must be a key, or {key: ..., scope: ...}"));
        }
        _ => item.scalar_text().unwrap_or_default(),
    };
    checked_key(&key).ok_or_else(|| at(NOT_A_KEY))?;
    Ok(ApiKey {
        key,
        scope: Scope::Admin,
        name: None,
        models: Vec::new(),
    })
}

const NOT_A_KEY: &str = "keys must be non-empty and contain no spaces";

fn checked_key(key: &str) -> Option<&str> {
    (!key.is_empty() && !key.contains(char::is_whitespace)).then_some(key)
}

/// A key given as a mapping: its scope, the name its usage is recorded under, and the models it
/// may use.
fn scoped_key(r: &MapReader<'_>) -> Result<ApiKey, ConfigError> {
    let key = r
        .string("key")?
        .ok_or_else(|| r.err("key", "a scoped key needs `key`"))?;
    checked_key(&key).ok_or_else(|| r.err("key", NOT_A_KEY))?;
    Ok(ApiKey {
        key,
        scope: key_scope(r)?,
        name: key_name(r)?,
        models: key_models(r)?,
    })
}

/// `scope`: admin when left out.
fn key_scope(r: &MapReader<'_>) -> Result<Scope, ConfigError> {
    match r.string("scope")? {
        None => Ok(Scope::Admin),
        Some(name) => Scope::parse(&name).ok_or_else(|| {
            r.err(
                "scope",
                format!("must be admin, inference or metrics, not {name:?}"),
            )
        }),
    }
}

/// `name`, which labels the key's metrics.
fn key_name(r: &MapReader<'_>) -> Result<Option<String>, ConfigError> {
    let name = r.string("name")?;
    if name.as_deref().is_some_and(|n| !valid_name(n)) {
        return Err(r.err(
            "name",
            "must be 1 to 64 letters, digits, '-', '_' or '.' (it labels metrics)",
        ));
    }
    Ok(name)
}

/// `models`: the ids and patterns the key may use.
fn key_models(r: &MapReader<'_>) -> Result<Vec<String>, ConfigError> {
    let models = r.strings("models")?;
    if models.iter().any(|m| m.trim().is_empty()) {
        return Err(r.err("models", "model names and patterns must not be empty"));
    }
    Ok(models)
}

/// A key's name: short and plain, as it becomes a metric label and a dashboard filter.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `allowedHosts`: host names, beyond loopback ones, that a loopback listener answers to.
pub(super) fn decode_allowed_hosts(top: &MapReader<'_>) -> Result<Vec<String>, ConfigError> {
    let hosts = top.strings("allowedHosts")?;
    match hosts.iter().find(|h| !valid_host(h)) {
        Some(bad) => Err(top.err(
            "allowedHosts",
            format!("{bad:?} is not a host name (no scheme, port or path: e.g. corral.lan)"),
        )),
        None => Ok(hosts.iter().map(|h| h.to_ascii_lowercase()).collect()),
    }
}

fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}
