//! The group swap rules (llama-swap §1.4) as a pure function over instances.

use super::{Catalog, InstanceRef};
use crate::config::{Config, Group};

/// Which running instances must stop before `target` may run.
///
/// Replicas of one model, and members of one pool, never conflict. Otherwise a member of the
/// target's own group is evicted when that group swaps, and a member of another group is evicted
/// when the target's group is exclusive and the other group is not persistent.
pub fn conflicts<'a>(
    config: &Config,
    catalog: &Catalog,
    target: &str,
    running: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    if let Some(matrix) = &config.router {
        return matrix_conflicts(matrix, catalog, target, running);
    }
    let (Some(tm), Some(tref)) = (catalog.model_of(target), catalog.instances.get(target)) else {
        return Vec::new();
    };
    let g = config.group_of(tm);
    running
        .into_iter()
        .filter(|other| *other != target)
        .filter(|other| {
            catalog
                .instances
                .get(*other)
                .is_some_and(|oref| evicts(config, g, tref, oref))
        })
        .map(str::to_string)
        .collect()
}

/// Whether running `tref`, of group `g`, stops the running instance `oref`.
fn evicts(config: &Config, g: &Group, tref: &InstanceRef, oref: &InstanceRef) -> bool {
    if oref.model == tref.model || (oref.pool.is_some() && oref.pool == tref.pool) {
        return false;
    }
    let h = config.group_of(&oref.model);
    if h.id == g.id {
        g.swap
    } else {
        g.exclusive && !h.persistent
    }
}

/// With the matrix router, the solver picks the cheapest set that holds the target's model.
fn matrix_conflicts<'a>(
    matrix: &crate::config::matrix::Matrix,
    catalog: &Catalog,
    target: &str,
    running: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let Some(model) = catalog.model_of(target) else {
        return Vec::new();
    };
    let running: Vec<&str> = running.into_iter().filter(|r| *r != target).collect();
    let decision = matrix.solve(model, &other_models(catalog, &running, model));
    if let Some(log) = &decision.log {
        tracing::debug!("{log}");
    }
    running
        .into_iter()
        .filter(|r| {
            catalog
                .model_of(r)
                .is_some_and(|m| decision.evict.iter().any(|e| e == m))
        })
        .map(String::from)
        .collect()
}

/// The models of the `running` instances other than `model`.
fn other_models(
    catalog: &Catalog,
    running: &[&str],
    model: &str,
) -> std::collections::BTreeSet<String> {
    running
        .iter()
        .filter_map(|r| catalog.model_of(r))
        .filter(|m| *m != model)
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(yaml: &str) -> (Config, Catalog) {
        let c = crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config;
        let cat = Catalog::new(&c);
        (c, cat)
    }

    const MODELS: &str = "models:\n  a: {cmd: x, proxy: 'http://h:1'}\n  b: {cmd: x, proxy: 'http://h:1'}\n  c: {cmd: x, proxy: 'http://h:1'}\n  d: {cmd: x, proxy: 'http://h:1'}\n";

    #[test]
    fn default_group_runs_one_model_at_a_time() {
        let (c, cat) = setup(MODELS);
        assert_eq!(conflicts(&c, &cat, "a", ["b", "c"]), vec!["b", "c"]);
        assert!(conflicts(&c, &cat, "a", ["a"]).is_empty());
    }

    #[test]
    fn non_swapping_group_keeps_its_members_together() {
        let (c, cat) = setup(&format!(
            "{MODELS}groups:\n  g: {{swap: false, members: [a, b]}}\n"
        ));
        assert!(conflicts(&c, &cat, "a", ["b"]).is_empty());
        assert_eq!(conflicts(&c, &cat, "a", ["b", "c"]), vec!["c"]);
    }

    #[test]
    fn persistent_groups_survive_other_groups() {
        let (c, cat) = setup(&format!(
            "{MODELS}groups:\n  p: {{persistent: true, members: [a]}}\n  x: {{members: [b, c]}}\n"
        ));
        assert!(conflicts(&c, &cat, "b", ["a"]).is_empty());
        assert_eq!(conflicts(&c, &cat, "b", ["a", "c"]), vec!["c"]);
        assert_eq!(conflicts(&c, &cat, "d", ["a", "b"]), vec!["b"]);
    }

    #[test]
    fn non_exclusive_group_never_evicts_outside() {
        let (c, cat) = setup(&format!(
            "{MODELS}groups:\n  n: {{exclusive: false, members: [a]}}\n"
        ));
        assert!(conflicts(&c, &cat, "a", ["b"]).is_empty());
        assert_eq!(conflicts(&c, &cat, "b", ["a"]), vec!["a"]);
    }

    #[test]
    fn the_matrix_router_evicts_by_set_cost() {
        let yaml = format!("{MODELS}routing:\n  router:\n    use: matrix\n    settings:\n      matrix:\n        evict_costs: {{a: 5}}\n        sets:\n          pair: 'a & b'\n          other: 'c & d'\n");
        let (c, cat) = setup(&yaml);
        assert!(
            conflicts(&c, &cat, "b", ["a"]).is_empty(),
            "a and b share a set"
        );
        assert_eq!(conflicts(&c, &cat, "c", ["a", "b"]), vec!["a", "b"]);
        assert_eq!(conflicts(&c, &cat, "d", ["c"]), Vec::<String>::new());
    }

    #[test]
    fn replicas_and_pool_members_never_evict_each_other() {
        let (c, cat) = setup("models:\n  r: {cmd: 'x --port ${PORT}', replicas: 2}\n  e-0: {cmd: 'x --port ${PORT}'}\n  e-1: {cmd: 'x --port ${PORT}'}\n");
        assert!(conflicts(&c, &cat, "r-0", ["r-1"]).is_empty());
        assert!(conflicts(&c, &cat, "e-0", ["e-1"]).is_empty());
        assert_eq!(
            conflicts(&c, &cat, "e-0", ["r-0", "r-1", "e-1"]),
            vec!["r-0", "r-1"],
            "a swap evicts a whole pool"
        );
    }
}
