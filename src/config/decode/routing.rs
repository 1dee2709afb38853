//! `routing`: which router picks what runs together (swap groups or the matrix) and the
//! scheduler's priorities; the older top-level `groups`/`matrix` are read here too.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::groups::{decode_groups, decode_matrix};
use crate::config::read::MapReader;
use crate::config::{ConfigError, Group, ModelConfig};

/// What `routing` (or the top-level `groups`/`matrix`) decides.
pub(super) struct Routing {
    pub groups: Vec<Group>,
    /// The compiled matrix router, when the matrix is in use.
    pub router: Option<Arc<crate::config::matrix::Matrix>>,
    pub fifo_priority: BTreeMap<String, i64>,
}

const MATRIX_KEYS: &[&str] = &["vars", "evict_costs", "sets"];

pub(super) fn decode_routing(
    top: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    placed_by_memory: bool,
    warnings: &mut Vec<String>,
) -> Result<Routing, ConfigError> {
    let routing = top.child("routing", &["router", "scheduler"], warnings)?;
    let router = routing.child("router", &["use", "settings"], warnings)?;
    let router_use = router_use(&router)?;
    let settings = router.child("settings", &["groups", "matrix"], warnings)?;
    let fifo_priority = fifo_priority(&routing, models, warnings)?;
    let legacy_matrix = top.get("matrix").is_some();
    let (groups_reader, matrix_reader) = group_readers(top, &router, &settings, warnings)?;
    let groups = decode_groups(&groups_reader, models, placed_by_memory, warnings)?;
    let router = if router_use == "matrix" || legacy_matrix {
        Some(compile_matrix(&matrix_reader, models)?)
    } else {
        None
    };
    Ok(Routing {
        groups,
        router,
        fifo_priority,
    })
}

/// `routing.router.use`: `group` (the default) or `matrix`.
fn router_use(router: &MapReader<'_>) -> Result<String, ConfigError> {
    let router_use = router.string("use")?.unwrap_or_else(|| "group".into());
    if router_use != "group" && router_use != "matrix" {
        return Err(router.err(
            "use",
            format!("must be group or matrix, not {router_use:?}"),
        ));
    }
    Ok(router_use)
}

/// `routing.scheduler`: only `fifo`, with a priority per model id or alias.
fn fifo_priority(
    routing: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, i64>, ConfigError> {
    let scheduler = routing.child("scheduler", &["use", "settings"], warnings)?;
    if let Some(s) = scheduler.string("use")? {
        if s != "fifo" {
            return Err(scheduler.err("use", format!("only fifo is supported, not {s:?}")));
        }
    }
    let fifo =
        scheduler
            .child("settings", &["fifo"], warnings)?
            .child("fifo", &["priority"], warnings)?;
    let priority = fifo.child("priority", &[], &mut Vec::new())?;
    let mut fifo_priority = BTreeMap::new();
    for (name, _) in priority.entries() {
        let value = priority.int(name)?.unwrap_or(0);
        let known = models.contains_key(name) || models.values().any(|m| m.aliases.contains(name));
        if !known {
            return Err(priority.err(name, "is not a model id or alias"));
        }
        fifo_priority.insert(name.clone(), value);
    }
    Ok(fifo_priority)
}

/// Where the groups and the matrix are read from: the top level (llama-swap's older layout) or
/// `routing.router.settings`, never both.
fn group_readers<'n>(
    top: &MapReader<'n>,
    router: &MapReader<'n>,
    settings: &MapReader<'n>,
    warnings: &mut Vec<String>,
) -> Result<(MapReader<'n>, MapReader<'n>), ConfigError> {
    let legacy_groups = top.get("groups").is_some();
    let legacy_matrix = top.get("matrix").is_some();
    if (legacy_groups || legacy_matrix) && router.get("use").or(router.get("settings")).is_some() {
        let key = if legacy_groups { "groups" } else { "matrix" };
        return Err(top.err(
            key,
            "top-level groups/matrix cannot be combined with routing.router settings",
        ));
    }
    if legacy_groups && legacy_matrix {
        return Err(top.err("matrix", "use either groups or matrix, not both"));
    }
    let from = if legacy_groups || legacy_matrix {
        top
    } else {
        settings
    };
    Ok((
        from.child("groups", &[], &mut Vec::new())?,
        from.child("matrix", MATRIX_KEYS, warnings)?,
    ))
}

/// The matrix, validated against the models and compiled into the router.
fn compile_matrix(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<Arc<crate::config::matrix::Matrix>, ConfigError> {
    let m = decode_matrix(r, models)?;
    let ids = models.keys().cloned().collect();
    let compiled = crate::config::matrix::Matrix::compile(&m.vars, &m.evict_costs, &m.sets, &ids)
        .map_err(|e| r.err("sets", e))?;
    Ok(Arc::new(compiled))
}
