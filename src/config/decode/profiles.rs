//! `profiles` (pins of requested ids to targets) and `selectors` (ids that pick among targets).

use std::collections::BTreeMap;

use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::{ConfigError, Profile, Selector};

/// `profiles.<name>`: pins that map requested ids to targets while the profile is active.
pub(super) fn decode_profiles(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Profile>, ConfigError> {
    let r = top.child("profiles", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (name, node) in r.entries() {
        let p = MapReader::new(node, &r.key(name), &["description", "pins"], warnings)?;
        let pins = decode_pins(&p)?;
        out.insert(
            name.clone(),
            Profile {
                description: p.string("description")?.unwrap_or_default(),
                pins,
            },
        );
    }
    Ok(out)
}

/// A profile's `pins`: a mapping of at least one requested id to its target (empty: none).
fn decode_pins(p: &MapReader<'_>) -> Result<BTreeMap<String, Option<String>>, ConfigError> {
    let Some(pins_node) = p.get("pins") else {
        return Err(p.err(
            "pins",
            "a profile needs pins (a mapping of requested id to target)",
        ));
    };
    if !matches!(pins_node.value, Value::Map(_)) {
        return Err(p.err("pins", "must be a mapping of requested id to target"));
    }
    // a profile that pins nothing changes nothing when made active (llama-swap refuses it)
    if pins_node.entries().is_empty() {
        return Err(p.err("pins", "a profile needs at least one pin"));
    }
    Ok(pins_node
        .entries()
        .iter()
        .map(|(k, v)| (k.clone(), v.scalar_text().filter(|s| !s.is_empty())))
        .collect())
}

/// `selectors.<id>`: a requested id that picks one of its targets by `strategy`.
pub(super) fn decode_selectors(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Selector>, ConfigError> {
    let r = top.child("selectors", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (id, node) in r.entries() {
        let s = MapReader::new(node, &r.key(id), SELECTOR_KEYS, warnings)?;
        out.insert(id.clone(), decode_selector(&s, warnings)?);
    }
    Ok(out)
}

const SELECTOR_KEYS: &[&str] = &[
    "strategy",
    "targets",
    "settings",
    "name",
    "description",
    "unlisted",
    "metadata",
];

fn decode_selector(s: &MapReader<'_>, warnings: &mut Vec<String>) -> Result<Selector, ConfigError> {
    let strategy = s.string("strategy")?.unwrap_or_default();
    if !["warm", "pin", "spillover"].contains(&strategy.as_str()) {
        return Err(s.err(
            "strategy",
            format!("must be warm, pin or spillover, not {strategy:?}"),
        ));
    }
    let targets = s.strings("targets")?;
    if targets.is_empty() {
        return Err(s.err("targets", "a selector needs at least one target"));
    }
    let spillover = spillover(s, warnings)?;
    let metadata = match s.get("metadata").map(Node::to_json) {
        Some(serde_json::Value::Object(o)) => o,
        _ => Default::default(),
    };
    Ok(Selector {
        strategy,
        targets,
        spillover,
        name: s.string("name")?,
        description: s.string("description")?,
        unlisted: s.boolean("unlisted")?.unwrap_or(false),
        metadata,
    })
}

/// `settings.spillover`: at least 1, and 1 unless given.
fn spillover(s: &MapReader<'_>, warnings: &mut Vec<String>) -> Result<u64, ConfigError> {
    let settings = s.child("settings", &["spillover"], warnings)?;
    let spillover = settings.int("spillover")?.unwrap_or(1);
    if spillover < 1 {
        return Err(settings.err("spillover", "must be 1 or more"));
    }
    Ok(spillover as u64)
}
