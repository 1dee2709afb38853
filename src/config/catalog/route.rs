//! Where a name that is not a selector routes: a local model, alias, replica or pool, else a
//! peer's model. Requests resolve names with it, and the config loader checks with it that every
//! name a profile, selector or peer uses would route, so the two never disagree.

use std::sync::Arc;

use super::{Catalog, Target};
use crate::config::Config;

/// Where a request goes.
#[derive(Debug, Clone)]
pub enum Route {
    Local {
        target: Target,
        model: Arc<str>,
    },
    Peer {
        peer: String,
        model: String,
    },
    /// A bare model id that several peers serve: the least loaded one gets it.
    Peers {
        owners: Vec<String>,
        model: String,
    },
}

/// A name that is not a selector: a local model, alias, replica or pool, else a peer's model
/// (`peer/model`, or bare when one peer has it).
pub fn route(config: &Config, catalog: &Catalog, name: &str) -> Option<Route> {
    if let Some((target, model)) = catalog.resolve(name) {
        return Some(Route::Local {
            target: target.clone(),
            model: model.clone(),
        });
    }
    named_peer_route(config, name).or_else(|| bare_peer_route(config, name))
}

/// `peer/model`, when that peer lists the model.
fn named_peer_route(config: &Config, name: &str) -> Option<Route> {
    let (peer, model) = name.split_once('/')?;
    config
        .peers
        .get(peer)
        .is_some_and(|p| p.models.iter().any(|m| m == model))
        .then(|| Route::Peer {
            peer: peer.into(),
            model: model.into(),
        })
}

/// A bare model id: the one peer that lists it, or all of them when several do.
fn bare_peer_route(config: &Config, name: &str) -> Option<Route> {
    let owners: Vec<&String> = config
        .peers
        .iter()
        .filter(|(_, p)| p.models.iter().any(|m| m == name))
        .map(|(id, _)| id)
        .collect();
    match owners.as_slice() {
        [] => None,
        [peer] => Some(Route::Peer {
            peer: (*peer).clone(),
            model: name.into(),
        }),
        _ => Some(Route::Peers {
            owners: owners.into_iter().cloned().collect(),
            model: name.into(),
        }),
    }
}
