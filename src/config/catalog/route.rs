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
    if let Some((peer, model)) = name.split_once('/') {
        if config
            .peers
            .get(peer)
            .is_some_and(|p| p.models.iter().any(|m| m == model))
        {
            return Some(Route::Peer {
                peer: peer.into(),
                model: model.into(),
            });
        }
    }
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
