//! `apiKeys`: who may reach which routes.

use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::{ApiKey, ConfigError, Scope};

/// `apiKeys`: plain strings (admin keys, as in llama-swap) or `{key: K, scope: admin|inference|metrics}`.
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
    let (key, scope) = match &item.value {
        Value::Map(_) => {
            let r = MapReader::new(item, path, &["key", "scope"], warnings)?;
            let key = r
                .string("key")?
                .ok_or_else(|| r.err("key", "a scoped key needs `key`"))?;
            let scope = match r.string("scope")? {
                None => Scope::Admin,
                Some(name) => Scope::parse(&name).ok_or_else(|| {
                    r.err(
                        "scope",
                        format!("must be admin, inference or metrics, not {name:?}"),
                    )
                })?,
            };
            (key, scope)
        }
        Value::Seq(_) | Value::Null => {
            return Err(at("must be a key, or {key: ..., scope: ...}"));
        }
        _ => (item.scalar_text().unwrap_or_default(), Scope::Admin),
    };
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(at("keys must be non-empty and contain no spaces"));
    }
    Ok(ApiKey { key, scope })
}
