//! One model's expansion: its macros, its `${PORT}`, and one entry per replica.

use std::collections::BTreeMap;

use super::macros::{apply_macros, read_macros, substitute, Growth, Macros};
use crate::config::top_keys::REPLICAS_KEY;
use crate::config::yaml::{Loc, Node, Value};
use crate::config::ConfigError;

/// Resolves one `models.<id>` entry; ports are handed out from `next_port` in id order.
pub(super) fn resolve_model(
    id: &str,
    model: &mut Node,
    globals: &Macros,
    next_port: &mut i64,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let scope = format!("models.{id}");
    ensure_mapping(model, &scope)?;
    let macros = model_macros(id, model, globals, &scope)?;
    prepare(model);
    apply_macros(model, &macros, growth)?;
    substitute_by_id_keys(model, &macros, growth)?;

    let uses_port = cmd_uses_port(model);
    let replicas = replica_count(model, &scope)?;
    if !uses_port {
        refuse_replicas_without_port(model, &scope, replicas)?;
        return refuse_port_in_proxy(id, model, &scope);
    }
    assign_ports(model, &scope, replicas, next_port, growth)
}

/// Replicas each listen on a port of their own, so a command without `${PORT}` runs one.
fn refuse_replicas_without_port(
    model: &Node,
    scope: &str,
    replicas: i64,
) -> Result<(), ConfigError> {
    if replicas <= 1 {
        return Ok(());
    }
    Err(ConfigError::at(
        model.loc.clone(),
        Some(format!("{scope}.replicas")),
        "replicas need ${PORT} in cmd: each replica listens on its own port".into(),
    ))
}

/// Whether the model's command listens on `${PORT}`: a `cmd` that names it, or one corral
/// builds from the model's engine, which listens on a port of its own.
fn cmd_uses_port(model: &Node) -> bool {
    matches!(model.get("cmd"), Some(Node { value: Value::Str(s), .. }) if s.contains("${PORT}"))
        || crate::config::engine::builds_command(model)
}

/// A model entry is a mapping; an empty one reads as an empty mapping.
fn ensure_mapping(model: &mut Node, scope: &str) -> Result<(), ConfigError> {
    if matches!(model.value, Value::Map(_)) {
        return Ok(());
    }
    if !model.is_null() {
        return Err(ConfigError::at(
            model.loc.clone(),
            Some(scope.into()),
            format!("a model must be a mapping, not {}", model.kind()),
        ));
    }
    model.value = Value::Map(Vec::new());
    Ok(())
}

/// `MODEL_ID`, then the global macros, each replaced by the model's own macro of that name;
/// the model's other macros follow.
fn model_macros(
    id: &str,
    model: &Node,
    globals: &Macros,
    scope: &str,
) -> Result<Macros, ConfigError> {
    let own = read_macros(model.get("macros"), &format!("{scope}.macros"))?;
    let mut list: Macros = vec![(
        "MODEL_ID".into(),
        Node::new(Value::Str(id.into()), model.loc.clone()),
    )];
    list.extend(globals.iter().cloned());
    for (name, value) in own {
        match list.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => list.push((name, value)),
        }
    }
    Ok(list)
}

/// Before substitution: comment lines leave `cmd` and `cmdStop`, `proxy` defaults to
/// `http://localhost:${PORT}`, and the model's `macros` leave the tree.
fn prepare(model: &mut Node) {
    for key in ["cmd", "cmdStop"] {
        if let Some(Node {
            value: Value::Str(s),
            ..
        }) = model.get_mut(key)
        {
            *s = strip_comment_lines(s);
        }
    }
    default_proxy(model);
    if let Value::Map(entries) = &mut model.value {
        entries.retain(|(k, _)| k != "macros");
    }
}

/// `proxy` is `http://localhost:${PORT}` when absent, or null (`proxy: ~`, or the key left
/// empty), as llama-swap fills it in.
fn default_proxy(model: &mut Node) {
    let default = Value::Str("http://localhost:${PORT}".into());
    match model.get_mut("proxy") {
        Some(proxy) if proxy.is_null() => proxy.value = default,
        Some(_) => {}
        None => {
            let loc = model.loc.clone();
            if let Value::Map(e) = &mut model.value {
                e.push(("proxy".into(), Node::new(default, loc)));
            }
        }
    }
}

/// `replicas`: 1 unless given, at most 64.
fn replica_count(model: &Node, scope: &str) -> Result<i64, ConfigError> {
    match model.get("replicas").map(|n| &n.value) {
        None | Some(Value::Null) => Ok(1),
        Some(Value::Int(n)) if (1..=64).contains(n) => Ok(*n),
        Some(_) => {
            let loc = model
                .get("replicas")
                .map_or(model.loc.clone(), |n| n.loc.clone());
            Err(ConfigError::at(
                loc,
                Some(format!("{scope}.replicas")),
                "must be an integer from 1 to 64".into(),
            ))
        }
    }
}

/// Hands the model `replicas` consecutive ports: the first is its `${PORT}`, and each replica
/// gets an entry under [`REPLICAS_KEY`] with its own.
fn assign_ports(
    model: &mut Node,
    scope: &str,
    replicas: i64,
    next_port: &mut i64,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    if *next_port + replicas - 1 > 65535 {
        return Err(ConfigError::at(
            model.loc.clone(),
            Some(scope.into()),
            "ran out of ports above startPort".into(),
        ));
    }
    if replicas > 1 {
        add_replica_entries(model, *next_port, replicas, growth)?;
    }
    let port = Node::new(Value::Int(*next_port), model.loc.clone());
    *next_port += replicas;
    substitute(model, "PORT", &port, growth)?;
    substitute_by_id_keys(model, &[("PORT".into(), port)], growth)
}

/// The entry under [`REPLICAS_KEY`]: one per replica, with ports from `first_port` on.
fn add_replica_entries(
    model: &mut Node,
    first_port: i64,
    replicas: i64,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let instances = (0..replicas)
        .map(|i| replica_entry(model, first_port + i, growth))
        .collect::<Result<_, _>>()?;
    if let Value::Map(e) = &mut model.value {
        e.push((
            REPLICAS_KEY.into(),
            Node::new(Value::Seq(instances), model.loc.clone()),
        ));
    }
    Ok(())
}

/// One replica's `port`, and its `cmd`, `cmdStop`, `proxy` and `checkEndpoint` with that port.
fn replica_entry(model: &Node, port: i64, growth: &mut Growth) -> Result<Node, ConfigError> {
    let port = Node::new(Value::Int(port), model.loc.clone());
    let mut entries = vec![("port".to_string(), port.clone())];
    for key in ["cmd", "cmdStop", "proxy", "checkEndpoint"] {
        if let Some(n) = model.get(key) {
            let mut n = n.clone();
            substitute(&mut n, "PORT", &port, growth)?;
            entries.push((key.to_string(), n));
        }
    }
    Ok(Node::new(Value::Map(entries), model.loc.clone()))
}

/// Without a port in its command, a model has none to give its proxy.
fn refuse_port_in_proxy(id: &str, model: &Node, scope: &str) -> Result<(), ConfigError> {
    match model.get("proxy") {
        Some(proxy) if matches!(&proxy.value, Value::Str(s) if s.contains("${PORT}")) => {
            Err(ConfigError::at(
                proxy.loc.clone(),
                Some(format!("{scope}.proxy")),
                format!("model {id}: proxy uses ${{PORT}} but cmd does not - ${{PORT}} is only available when used in cmd"),
            ))
        }
        _ => Ok(()),
    }
}

/// `filters.setParamsByID` is the one map whose keys take macros.
fn substitute_by_id_keys(
    model: &mut Node,
    macros: &[(String, Node)],
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let Some(by_id) = model
        .get_mut("filters")
        .and_then(|f| f.get_mut("setParamsByID"))
    else {
        return Ok(());
    };
    let Value::Map(entries) = &mut by_id.value else {
        return Ok(());
    };
    let mut seen = BTreeMap::new();
    for (key, value) in entries.iter_mut() {
        match substituted_key(key, &value.loc, macros, growth) {
            Some(replaced) => *key = replaced,
            None => return growth.check(),
        }
        if let Some(prev) = seen.insert(key.clone(), value.loc.clone()) {
            return Err(two_keys_resolve(key, &value.loc, &prev));
        }
    }
    Ok(())
}

/// Two `setParamsByID` keys that name the same id once their macros are substituted.
fn two_keys_resolve(key: &str, loc: &Loc, prev: &Loc) -> ConfigError {
    ConfigError::at(
        loc.clone(),
        Some(format!("filters.setParamsByID.{key}")),
        format!("two keys resolve to {key:?} (the other at {prev})"),
    )
}

/// `key` with each macro substituted, the last declared first; `None` once the growth budget
/// is spent.
fn substituted_key(
    key: &str,
    loc: &Loc,
    macros: &[(String, Node)],
    growth: &mut Growth,
) -> Option<String> {
    let mut key = key.to_string();
    for (name, m) in macros.iter().rev() {
        let pattern = format!("${{{name}}}");
        let text = m.scalar_text().unwrap_or_default();
        key = growth.replace(&key, &pattern, &text, loc)?;
    }
    Some(key)
}

/// Drops the lines of a command that are YAML-style comments, as llama-swap does.
fn strip_comment_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}
