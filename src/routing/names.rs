//! From the name a client sent to where the request goes: profile pins first, then selectors, then
//! local models, aliases and pools, then peers (COMPAT.md §1.6-1.8).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use crate::config::catalog::Route;
use crate::config::catalog::{self, Catalog};
use crate::config::Config;
use crate::fleet::{Fleet, PhaseName};
use crate::proxy::error::Error;

/// The active profile: none at start and after every reload. Event streams watch it, so each
/// change is told as a `profileChanged`.
pub struct Profiles {
    active: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Profiles {
    fn default() -> Self {
        Profiles {
            active: tokio::sync::watch::Sender::new(None),
        }
    }
}

impl Profiles {
    /// Profiles with `active` active (`hooks.on_startup.profile`).
    pub fn starting_with(active: Option<String>) -> Profiles {
        Profiles {
            active: tokio::sync::watch::Sender::new(active),
        }
    }

    pub fn active(&self) -> Option<String> {
        self.active.borrow().clone()
    }

    pub fn set(&self, name: Option<String>) {
        self.active.send_replace(name);
    }

    /// Told of each change from now on.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.active.subscribe()
    }
}

/// Per-selector, per-target requests in flight, for `spillover`.
#[derive(Default)]
pub struct Spillover {
    counts: Mutex<BTreeMap<(String, String), Arc<AtomicUsize>>>,
    rr: AtomicUsize,
}

/// Holds one in-flight count on a spillover target until the request ends.
pub struct SpillGuard(Arc<AtomicUsize>);

impl Drop for SpillGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Spillover {
    fn counter(&self, selector: &str, target: &str) -> Arc<AtomicUsize> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((selector.into(), target.into()))
            .or_default()
            .clone()
    }
}

/// The name after the active profile's pins: `Ok(None)` when the profile disables it.
pub fn apply_profile<'a>(
    config: &Config,
    profiles: &Profiles,
    name: &'a str,
) -> Option<std::borrow::Cow<'a, str>> {
    let Some(active) = profiles.active() else {
        return Some(name.into());
    };
    match config.profiles.get(&active).and_then(|p| p.pins.get(name)) {
        None => Some(name.into()),
        Some(target) => target.clone().map(Into::into),
    }
}

/// The longest name a request could use (model, alias, replica, pool, selector, a profile's pin,
/// `peer/model`), in bytes: no longer text can name anything.
pub fn longest_name(config: &Config, catalog: &Catalog) -> usize {
    let pins = config.profiles.values().flat_map(|p| p.pins.keys());
    let peers = config
        .peers
        .iter()
        .flat_map(|(id, p)| p.models.iter().map(move |m| id.len() + 1 + m.len()));
    (pins.map(String::len))
        .chain(config.selectors.keys().map(String::len))
        .chain(peers)
        .chain(std::iter::once(catalog.longest_name()))
        .max()
        .unwrap_or(0)
}

/// Resolves a requested name. Selectors choose one of their targets; `hold` keeps a spillover count.
pub fn resolve(
    config: &Config,
    catalog: &Catalog,
    fleet: &Fleet,
    spill: &Spillover,
    name: &str,
) -> Result<(Route, Option<SpillGuard>), Error> {
    if let Some(sel) = config.selectors.get(name) {
        let chosen = choose(config, fleet, spill, name, sel)?;
        let guard = (sel.strategy == "spillover").then(|| {
            let c = spill.counter(name, &chosen);
            c.fetch_add(1, Ordering::SeqCst);
            SpillGuard(c)
        });
        return Ok((resolve_plain(config, catalog, &chosen)?, guard));
    }
    Ok((resolve_plain(config, catalog, name)?, None))
}

/// A name that is not a selector, as [`catalog::route`] routes it; unknown names are refused.
pub fn resolve_plain(config: &Config, catalog: &Catalog, name: &str) -> Result<Route, Error> {
    catalog::route(config, catalog, name).ok_or(Error::UnknownModel)
}

fn phase_of(fleet: &Fleet, config: &Config, target: &str) -> Option<PhaseName> {
    let model = fleet
        .catalog()
        .resolve(target)
        .map(|(_, m)| m.to_string())?;
    let ids: Vec<String> = config
        .models
        .get(&model)?
        .instances
        .iter()
        .map(|i| i.id.clone())
        .collect();
    let snapshot = fleet.snapshot();
    let phases: Vec<PhaseName> = snapshot
        .iter()
        .filter(|s| ids.contains(&s.instance))
        .map(|s| s.state)
        .collect();
    [PhaseName::Ready, PhaseName::Starting, PhaseName::Stopping]
        .into_iter()
        .find(|p| phases.contains(p))
        .or(Some(PhaseName::Stopped))
}

fn choose(
    config: &Config,
    fleet: &Fleet,
    spill: &Spillover,
    id: &str,
    sel: &crate::config::Selector,
) -> Result<String, Error> {
    match sel.strategy.as_str() {
        "pin" => Ok(sel.targets[0].clone()),
        "warm" => Ok(warm(config, fleet, sel)),
        _ => spillover(config, fleet, spill, id, sel),
    }
}

/// `warm`: the first target that is ready, else the first that is starting, else the first.
fn warm(config: &Config, fleet: &Fleet, sel: &crate::config::Selector) -> String {
    for want in [PhaseName::Ready, PhaseName::Starting] {
        if let Some(t) = sel
            .targets
            .iter()
            .find(|t| phase_of(fleet, config, t) == Some(want))
        {
            return t.clone();
        }
    }
    sel.targets[0].clone()
}

/// `spillover`: the least-loaded active target while under the threshold, else the next cold
/// one; targets that are stopping are never chosen.
fn spillover(
    config: &Config,
    fleet: &Fleet,
    spill: &Spillover,
    id: &str,
    sel: &crate::config::Selector,
) -> Result<String, Error> {
    let load = |t: &str| spill.counter(id, t).load(Ordering::SeqCst);
    let is_peer = |t: &str| fleet.catalog().resolve(t).is_none();
    let active: Vec<&String> = sel
        .targets
        .iter()
        .filter(|t| match phase_of(fleet, config, t) {
            Some(PhaseName::Ready | PhaseName::Starting) => true,
            _ => load(t) > 0 || (is_peer(t) && load(t) > 0),
        })
        .collect();
    let usable: Vec<&String> = sel
        .targets
        .iter()
        .filter(|t| !matches!(phase_of(fleet, config, t), Some(PhaseName::Stopping)))
        .collect();
    if usable.is_empty() {
        return Err(Error::Busy {
            status: 503,
            message: format!("selector \"{id}\" has no available spillover targets"),
            retry_after: 1,
        });
    }
    if active.is_empty() {
        return Ok(usable[0].clone());
    }
    let best = least_loaded(spill, &active, load).expect("active is not empty");
    if (load(&best) as u64) < sel.spillover {
        return Ok(best);
    }
    if let Some(cold) = usable.iter().find(|t| !active.contains(t)) {
        return Ok((*cold).clone());
    }
    Ok(best)
}

/// The target of `set` with the least `load`; ties take turns. Each load is read once: other
/// requests move them meanwhile, and a second read could find no target at the least.
fn least_loaded(
    spill: &Spillover,
    set: &[&String],
    load: impl Fn(&str) -> usize,
) -> Option<String> {
    let loads: Vec<(&String, usize)> = set.iter().map(|t| (*t, load(t))).collect();
    let min = loads.iter().map(|(_, l)| *l).min()?;
    let ties: Vec<&String> = (loads.iter())
        .filter(|(_, l)| *l == min)
        .map(|(t, _)| *t)
        .collect();
    let i = spill.rr.fetch_add(1, Ordering::Relaxed) % ties.len();
    Some(ties[i].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Other requests move the loads while one picks: a target is still chosen, where reading
    /// them twice could find none at the least and divide by zero.
    #[test]
    fn loads_that_move_meanwhile_still_give_a_target() {
        let spill = Spillover::default();
        let (a, b) = ("a".to_string(), "b".to_string());
        let reads = std::cell::Cell::new(0);
        let moving = |_: &str| {
            reads.set(reads.get() + 1);
            reads.get()
        };
        assert_eq!(
            least_loaded(&spill, &[&a, &b], moving).as_deref(),
            Some("a")
        );
        assert_eq!(reads.get(), 2, "each load read once");
    }
}
