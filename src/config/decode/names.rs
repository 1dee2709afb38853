//! The names that profiles, selectors and peers use must route, and no name may mean two things
//! (COMPAT.md §1.6-1.8). llama-swap refuses such a config at load; left in, a typo would only show
//! as a 404 on the first request that uses it, or one name would silently hide another.
//!
//! Checked on the decoded config with the resolution requests use ([`catalog::route`] over the
//! [`Catalog`]), so a name is accepted exactly when a request naming it would be routed.

use crate::config::catalog::{self, Catalog, Route, Target};
use crate::config::read::MapReader;
use crate::config::yaml::Value;
use crate::config::{Config, ConfigError, Selector};

/// Checks the profiles, then the selectors, then the peers.
pub(super) fn check_names(top: &MapReader<'_>, config: &Config) -> Result<(), ConfigError> {
    let names = Names {
        config,
        catalog: Catalog::new(config),
    };
    check_profiles(top, &names)?;
    check_selectors(top, &names)?;
    check_peers(top, &names)
}

/// The config with its catalog, which together say where a name routes.
struct Names<'a> {
    config: &'a Config,
    catalog: Catalog,
}

impl Names<'_> {
    /// Where a request for `name` (not a selector) goes, as the request path resolves it.
    fn route(&self, name: &str) -> Option<Route> {
        catalog::route(self.config, &self.catalog, name)
    }

    /// What a name given to a model means locally, for a selector or peer model that would take it:
    /// a model id, an alias (`setParamsByID` keys included) or a replica id.
    fn local(&self, name: &str) -> Option<String> {
        for m in self.config.models.values() {
            if *m.id == *name {
                return Some(format!("model {name:?}"));
            }
            if m.aliases.iter().any(|a| a == name) {
                return Some(format!("an alias of model {:?}", &*m.id));
            }
            if m.instances.len() > 1 && m.instances.iter().any(|i| i.id == name) {
                return Some(format!("a replica of model {:?}", &*m.id));
            }
        }
        None
    }
}

// === profiles ===

fn check_profiles(top: &MapReader<'_>, names: &Names<'_>) -> Result<(), ConfigError> {
    let r = top.child("profiles", &[], &mut Vec::new())?;
    for (name, node) in r.entries() {
        let Some(pins_node) = node.get("pins") else {
            continue;
        };
        let pins = MapReader::new(
            pins_node,
            &r.key(&format!("{name}.pins")),
            &[],
            &mut Vec::new(),
        )?;
        let targets = &names.config.profiles[name].pins;
        for (pin, _) in pins.entries() {
            check_pin(&pins, names, pin, targets[pin].as_deref())?;
        }
    }
    Ok(())
}

/// A pin needs a name to match, and a target a request could be sent on to: a local name, a peer
/// model or a selector. No target (`~` or `""`) disables the name instead.
fn check_pin(
    pins: &MapReader<'_>,
    names: &Names<'_>,
    pin: &str,
    target: Option<&str>,
) -> Result<(), ConfigError> {
    if pin.is_empty() {
        return Err(pins.err(pin, "pin names must not be empty"));
    }
    let Some(target) = target else {
        return Ok(());
    };
    if names.config.selectors.contains_key(target) || names.route(target).is_some() {
        return Ok(());
    }
    Err(pins.err(
        pin,
        format!(
            "target {target:?} is not a model, alias, replica, peer model or selector; \
             name one of those, or give ~ to disable {pin:?}"
        ),
    ))
}

// === selectors ===

fn check_selectors(top: &MapReader<'_>, names: &Names<'_>) -> Result<(), ConfigError> {
    let r = top.child("selectors", &[], &mut Vec::new())?;
    for (id, node) in r.entries() {
        // an implicit pool (`<role>` over models `<role>-<n>`) gives way to explicit names, as
        // it does to models and aliases, so a selector may take its name
        if let Some(what) = names.local(id) {
            return Err(r.err(
                id,
                format!("selector {id:?} has the same name as {what}; rename the selector"),
            ));
        }
        let s = MapReader::new(node, &r.key(id), &[], &mut Vec::new())?;
        let sel = &names.config.selectors[id];
        let routes = selector_routes(&s, names, sel)?;
        if sel.strategy == "spillover" {
            check_spillover(&s, names, &sel.targets, &routes)?;
        }
    }
    Ok(())
}

/// Where each target routes. A target is never a selector (they do not chain), must route, and
/// must be local for `warm`, which chooses by what is loaded here.
fn selector_routes(
    s: &MapReader<'_>,
    names: &Names<'_>,
    sel: &Selector,
) -> Result<Vec<Route>, ConfigError> {
    let mut routes = Vec::new();
    for (i, target) in sel.targets.iter().enumerate() {
        let err = |msg: String| item_err(s, "targets", i, msg);
        if names.config.selectors.contains_key(target) {
            return Err(err(format!(
                "{target:?} is a selector; a selector's targets must be models or peer models"
            )));
        }
        let Some(route) = names.route(target) else {
            return Err(err(format!(
                "{target:?} is not a model, alias, replica or peer model"
            )));
        };
        if sel.strategy == "warm" && !matches!(route, Route::Local { .. }) {
            return Err(err(format!(
                "{target:?} is a peer model; warm chooses by what is loaded here, so its targets must be local"
            )));
        }
        routes.push(route);
    }
    Ok(routes)
}

/// `spillover` spreads requests over its targets: two names for one target would count its load
/// twice, and local targets that evict each other would undo each spill.
fn check_spillover(
    s: &MapReader<'_>,
    names: &Names<'_>,
    targets: &[String],
    routes: &[Route],
) -> Result<(), ConfigError> {
    let reached: Vec<String> = routes.iter().map(reach).collect();
    for (i, r) in reached.iter().enumerate() {
        if let Some(first) = reached[..i].iter().position(|x| x == r) {
            return Err(item_err(
                s,
                "targets",
                i,
                format!(
                    "{:?} reaches {r}, as {:?} does; list each target once",
                    targets[i], targets[first]
                ),
            ));
        }
    }
    check_coexist(s, names, routes)
}

/// What a route reaches, in words: two targets that reach the same are one.
fn reach(route: &Route) -> String {
    match route {
        Route::Local {
            target: Target::Instance(id) | Target::Pool(id),
            ..
        } => format!("{:?}", &**id),
        Route::Peer { peer, model } => format!("{model:?} on peer {peer:?}"),
        Route::Peers { owners, model } => format!("{model:?} on peers {owners:?}"),
    }
}

/// Local spillover targets must run together: starting any of them may stop none of the others
/// under the swap rules the fleet applies ([`crate::config::catalog::swap::conflicts`]: groups, or the
/// matrix). With devices configured, memory may still make room by stopping one; that depends on
/// what else runs, so it is left to the fleet.
fn check_coexist(
    s: &MapReader<'_>,
    names: &Names<'_>,
    routes: &[Route],
) -> Result<(), ConfigError> {
    let instances = local_instances(names, routes);
    let all = || instances.iter().map(String::as_str);
    for inst in &instances {
        let stopped =
            crate::config::catalog::swap::conflicts(names.config, &names.catalog, inst, all());
        if let Some(other) = stopped.first() {
            let fix = if names.config.router.is_some() {
                "list them together in one matrix set"
            } else {
                "put them in one group with swap: false"
            };
            return Err(s.err(
                "targets",
                format!(
                    "spillover targets must be able to run together, but starting {inst:?} stops {other:?}; {fix}"
                ),
            ));
        }
    }
    Ok(())
}

/// The instances the local targets run on: a pool's every member.
fn local_instances(names: &Names<'_>, routes: &[Route]) -> Vec<String> {
    let mut out = Vec::new();
    for route in routes {
        match route {
            Route::Local {
                target: Target::Instance(id),
                ..
            } => out.push(id.to_string()),
            Route::Local {
                target: Target::Pool(id),
                ..
            } => out.extend(names.catalog.pools[&**id].members.iter().cloned()),
            _ => {}
        }
    }
    out
}

// === peers ===

/// A peer model's `<peer>/<model>` must be its own name: a local name would win over it, and a
/// selector or a pin would take the request before it is looked up as a peer model.
fn check_peers(top: &MapReader<'_>, names: &Names<'_>) -> Result<(), ConfigError> {
    let r = top.child("peers", &[], &mut Vec::new())?;
    for (id, node) in r.entries() {
        let p = MapReader::new(node, &r.key(id), &[], &mut Vec::new())?;
        for (i, model) in names.config.peers[id].models.iter().enumerate() {
            let fqn = format!("{id}/{model}");
            if let Some(what) = fqn_taken_by(names, &fqn) {
                return Err(item_err(
                    &p,
                    "models",
                    i,
                    format!("{fqn:?} is also the name of {what}; rename one of them"),
                ));
            }
        }
    }
    Ok(())
}

/// What else is called `fqn`, if anything.
fn fqn_taken_by(names: &Names<'_>, fqn: &str) -> Option<String> {
    if let Some(what) = names.local(fqn) {
        return Some(what);
    }
    if names.catalog.resolve(fqn).is_some() {
        return Some(format!("the pool of models named \"{fqn}-<n>\""));
    }
    if names.config.selectors.contains_key(fqn) {
        return Some(format!("selector {fqn:?}"));
    }
    (names.config.profiles.iter())
        .find(|(_, p)| p.pins.contains_key(fqn))
        .map(|(name, _)| format!("a pin of profile {name:?}"))
}

/// An error at item `i` of the list `key`, or at the list when the item is not found.
fn item_err(r: &MapReader<'_>, key: &str, i: usize, msg: String) -> ConfigError {
    let item = match r.get(key).map(|n| &n.value) {
        Some(Value::Seq(items)) => items.get(i),
        _ => None,
    };
    match item {
        Some(n) => ConfigError::at(n.loc.clone(), Some(format!("{}[{i}]", r.key(key))), msg),
        None => r.err(key, msg),
    }
}
