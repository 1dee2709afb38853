//! Getting a model request to where it is served: the body read within its limits and budget, the
//! model it names (`names.rs`: profiles, selectors, local models, pools, peers), the body
//! rewritten where asked (`filters.rs`), and the forwarding to a local instance (`forward.rs`),
//! the loading stream (`loading.rs`) or a peer (`peers.rs`, by load: `peer_load.rs`).
//! `seen.rs` is the request's record, handed to the observation room when the answer ends;
//! `grant.rs` what the key it presented may use.

pub(crate) mod budget;
pub(crate) mod extract;
pub(crate) mod filters;
pub(crate) mod forward;
pub(crate) mod grant;
pub(crate) mod inference;
pub(crate) mod loading;
pub(crate) mod names;
pub(crate) mod passthrough;
pub(crate) mod peer_load;
pub(crate) mod peers;
pub(crate) mod seen;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::catalog::Catalog;
use crate::config::{Config, Timeouts};
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::observe::activity::Activity;
use crate::observe::inflight::Inflight;
use crate::proxy::upstream::{self, Upstream};

/// Limits on what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body that is read to find the model (JSON with base64 images, audio uploads).
    pub body_bytes: u64,
    /// Request body bytes buffered at once across all requests (`maxBufferedBodies`).
    pub buffered_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 128 * 1024 * 1024,
            buffered_bytes: budget::BodyBudget::default_total(),
        }
    }
}

/// What a model request needs on its way to an engine: the fleet and the config's names, the
/// clients to models and peers, the body budget, and the observers its record reports to. Built
/// for each config; a reload builds another.
pub struct Gateway {
    pub fleet: Fleet,
    /// The fleet's catalog when this was built.
    pub catalog: Arc<Catalog>,
    pub config: Arc<Config>,
    pub profiles: names::Profiles,
    pub spillover: names::Spillover,
    pub(crate) clients: BTreeMap<String, Arc<Upstream>>,
    pub(crate) peer_clients: BTreeMap<String, Arc<Upstream>>,
    /// What the peers report of their load, where several serve one model.
    pub(crate) peer_loads: peer_load::PeerLoads,
    pub inflight: Arc<Inflight>,
    pub activity: Arc<Activity>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Shared by every gateway a reload builds, like the requests in flight.
    pub budget: budget::BodyBudget,
    /// Whether corral's key for a peer rides on a request for this path: the surface's rule of
    /// what a client's key reaches, handed down so that no client borrows corral's key.
    pub(crate) lends_peer_key: fn(&str) -> bool,
}

impl Gateway {
    /// The gateway for the fleet's config; `lends_peer_key` says on which paths corral's key
    /// for a peer is sent. `before`, the one a reload replaces, hands over the
    /// requests in flight and the body budget; the active profile is the config's
    /// `hooks.on_startup.profile` (none without it), as llama-swap does.
    pub fn new(
        fleet: Fleet,
        metrics: Arc<Metrics>,
        limits: Limits,
        activity: Arc<Activity>,
        lends_peer_key: fn(&str) -> bool,
        before: Option<&Gateway>,
    ) -> Gateway {
        let config = fleet.config().clone();
        let clients = config
            .models
            .values()
            .map(|m| {
                (
                    m.id.to_string(),
                    client_for(&m.timeouts, !m.disable_keep_alives),
                )
            })
            .collect();
        let peer_clients = config
            .peers
            .iter()
            .map(|(id, p)| (id.clone(), client_for(&p.timeouts, true)))
            .collect();
        Gateway {
            peer_loads: peer_load::PeerLoads::start(&config, &peer_clients),
            catalog: fleet.catalog(),
            profiles: names::Profiles::starting_with(config.startup_profile.clone()),
            spillover: Default::default(),
            clients,
            peer_clients,
            inflight: before.map(|b| b.inflight.clone()).unwrap_or_default(),
            budget: before.map_or_else(
                || budget::BodyBudget::new(limits.buffered_bytes),
                |b| b.budget.clone(),
            ),
            activity,
            config,
            fleet,
            metrics,
            limits,
            lends_peer_key,
        }
    }
}

/// A connection pool to one model's or peer's upstream, with its timeouts; `reuse` false opens a
/// connection per request (`disableKeepAlives`).
fn client_for(timeouts: &Timeouts, reuse: bool) -> Arc<Upstream> {
    Upstream::new(upstream::Settings {
        connect: timeouts.connect,
        tls_handshake: timeouts.tls_handshake,
        keepalive: timeouts.keepalive,
        idle: timeouts.idle_conn,
        reuse,
    })
}
