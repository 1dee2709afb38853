//! Swap groups and the matrix: the two ways of saying which models may run together.

use std::collections::BTreeMap;

use crate::config::read::MapReader;
use crate::config::{ConfigError, Group, Matrix, ModelConfig, DEFAULT_GROUP};

/// With devices configured, models in no group are placed by memory alone: the implicit group
/// neither swaps nor evicts, and the memory ledger decides what must stop.
pub(super) fn decode_groups(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    placed_by_memory: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<Group>, ConfigError> {
    let mut groups = Vec::new();
    let mut placed: BTreeMap<String, String> = BTreeMap::new();
    for (gid, node) in r.entries() {
        let g = MapReader::new(
            node,
            &r.key(gid),
            &["swap", "exclusive", "persistent", "members"],
            warnings,
        )?;
        let members = g.strings("members")?;
        place_members(gid, &g, &members, models, &mut placed)?;
        groups.push(Group {
            id: gid.clone(),
            swap: g.boolean("swap")?.unwrap_or(true),
            exclusive: g.boolean("exclusive")?.unwrap_or(true),
            persistent: g.boolean("persistent")?.unwrap_or(false),
            members,
        });
    }
    groups.extend(default_group(models, &placed, placed_by_memory));
    Ok(groups)
}

/// Records the group of each member; a model belongs to one group, listed once.
fn place_members(
    gid: &str,
    g: &MapReader<'_>,
    members: &[String],
    models: &BTreeMap<String, ModelConfig>,
    placed: &mut BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    for member in members {
        if !models.contains_key(member) {
            return Err(g.err("members", format!("no model config for {member:?}")));
        }
        if let Some(prev) = placed.insert(member.clone(), gid.to_string()) {
            let msg = if prev == *gid {
                format!("{member:?} is listed twice")
            } else {
                format!("{member:?} is already in group {prev:?}")
            };
            return Err(g.err("members", msg));
        }
    }
    Ok(())
}

/// The implicit group of the models no group names, if any.
fn default_group(
    models: &BTreeMap<String, ModelConfig>,
    placed: &BTreeMap<String, String>,
    placed_by_memory: bool,
) -> Option<Group> {
    let rest: Vec<String> = models
        .keys()
        .filter(|m| !placed.contains_key(*m))
        .cloned()
        .collect();
    (!rest.is_empty()).then(|| Group {
        id: DEFAULT_GROUP.into(),
        swap: !placed_by_memory,
        exclusive: !placed_by_memory,
        persistent: false,
        members: rest,
    })
}

/// `matrix`: named variables for models, eviction costs, and the sets that may run together.
pub(super) fn decode_matrix(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<Matrix, ConfigError> {
    let vars = matrix_vars(r, models)?;
    let mut evict_costs = BTreeMap::new();
    let c = r.child("evict_costs", &[], &mut Vec::new())?;
    for (name, _) in c.entries() {
        match c.int(name)? {
            Some(cost) if cost > 0 => evict_costs.insert(name.clone(), cost),
            _ => return Err(c.err(name, "evict costs must be integers above 0")),
        };
    }
    let s = r.child("sets", &[], &mut Vec::new())?;
    let mut sets = Vec::new();
    for (name, _) in s.entries() {
        sets.push((name.clone(), s.string(name)?.unwrap_or_default()));
    }
    if sets.is_empty() {
        return Err(r.err("sets", "a matrix needs at least one set"));
    }
    Ok(Matrix {
        vars,
        evict_costs,
        sets,
    })
}

/// `matrix.vars`: short names the sets use, each naming a model.
fn matrix_vars(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut vars = BTreeMap::new();
    let v = r.child("vars", &[], &mut Vec::new())?;
    for (name, _) in v.entries() {
        let valid = (1..=32).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        if !valid {
            return Err(v.err(name, "matrix var names must match ^[a-zA-Z0-9.-]{1,32}$"));
        }
        let target = v.string(name)?.unwrap_or_default();
        if !models.contains_key(&target) {
            return Err(v.err(name, format!("{target:?} is not a model id")));
        }
        vars.insert(name.clone(), target);
    }
    Ok(vars)
}
