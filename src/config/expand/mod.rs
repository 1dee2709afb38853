//! The llama-swap loading pipeline on the raw tree: `${env.X}`, merging several files, macros and
//! `${PORT}` allocation, in llama-swap's order (COMPAT.md §1.1).

mod env;
mod macros;
mod merge;
mod model;

use std::sync::Arc;

use super::yaml::{parse, Loc, Node, Value};
use super::ConfigError;
use env::substitute_env;
use macros::{apply_macros, check_leftovers, read_macros, Growth};
use merge::merge;
use model::resolve_model;

/// Reads, substitutes `${env.X}` and parses each source, then merges them in order.
pub fn load_sources(
    sources: &[(Arc<str>, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Node, ConfigError> {
    let mut merged: Option<Node> = None;
    for (file, text) in sources {
        let text = substitute_env(text, file, env)?;
        let node = parse(&text, file)?;
        if node.is_null() {
            continue;
        }
        if !matches!(node.value, Value::Map(_)) {
            return Err(ConfigError::at(
                node.loc.clone(),
                None,
                format!("the config must be a mapping, not {}", node.kind()),
            ));
        }
        merged = Some(match merged {
            None => node,
            Some(base) => merge(base, node, "")?,
        });
    }
    Ok(merged.unwrap_or_else(|| Node::new(Value::Map(Vec::new()), Loc::default())))
}

/// Resolves macros and `${PORT}` over the merged tree (§1.1 steps 3-5).
pub fn resolve(mut root: Node) -> Result<Node, ConfigError> {
    let globals = read_macros(root.get("macros"), "macros")?;
    let mut growth = Growth::default();
    if let Value::Map(entries) = &mut root.value {
        for (key, value) in entries.iter_mut() {
            if key != "models" && key != "macros" {
                apply_macros(value, &globals, &mut growth)?;
            }
        }
    }
    let mut next_port = start_port(&root)?;
    if let Some(models) = root.get_mut("models") {
        if let Value::Map(entries) = &mut models.value {
            let mut order: Vec<usize> = (0..entries.len()).collect();
            order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
            for i in order {
                let (id, model) = &mut entries[i];
                resolve_model(id, model, &globals, &mut next_port, &mut growth)?;
            }
        }
    }
    if let Value::Map(entries) = &mut root.value {
        entries.retain(|(k, _)| k != "macros");
    }
    check_leftovers(&root, super::top_keys::TOP_KEYS)?;
    Ok(root)
}

/// `startPort`: the first port handed out for `${PORT}`, 5800 unless given.
fn start_port(root: &Node) -> Result<i64, ConfigError> {
    match root.get("startPort") {
        None => Ok(5800),
        Some(n) => match n.value {
            Value::Int(p) if (1..=65535).contains(&p) => Ok(p),
            _ => Err(ConfigError::at(
                n.loc.clone(),
                Some("startPort".into()),
                "must be a port number from 1 to 65535".into(),
            )),
        },
    }
}
