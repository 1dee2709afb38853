//! The service's state: the fleet, config, clients, logs and counters every request handler reads.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::auth;
use crate::api::global_limit;
use crate::config::{Config, Timeouts};
use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::observe::activity;
use crate::observe::inflight;
use crate::observe::performance;
use crate::proxy::upstream::{self, Upstream};
use crate::routing::budget;
use crate::routing::names;
use crate::routing::peer_load;

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

/// Everything a request handler needs.
pub struct App {
    pub fleet: Fleet,
    /// The fleet's catalog when this App was built: a reload builds a new App.
    pub catalog: Arc<crate::config::catalog::Catalog>,
    /// Cancelled when shutdown starts; shared by every App a reload builds.
    pub closing: tokio_util::sync::CancellationToken,
    /// Cancelled when a reload puts another App in this one's place, or at shutdown: endless
    /// streams (events, logs) end with it, so that none goes on under the keys, masks and config
    /// it began with (a client opens them again), and the drain can finish.
    pub replaced: tokio_util::sync::CancellationToken,
    pub profiles: names::Profiles,
    pub spillover: names::Spillover,
    pub(crate) peer_clients: BTreeMap<String, Arc<Upstream>>,
    /// `globalConcurrencyLimit`, over every model request.
    pub(crate) global_limit: global_limit::GlobalLimit,
    /// What the peers report of their load, where several serve one model.
    pub(crate) peer_loads: peer_load::PeerLoads,
    pub inflight: Arc<inflight::Inflight>,
    pub activity: Arc<activity::Activity>,
    /// The samples behind `/api/performance`.
    pub(crate) performance: Arc<performance::Performance>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub config: Arc<Config>,
    pub logs: Arc<Logs>,
    pub limits: Limits,
    /// Shared by every App a reload builds, like the requests in flight.
    pub budget: budget::BodyBudget,
    pub(crate) keys: auth::Keys,
    /// corral listens on a loopback address: requests must name a loopback host (see `hosts.rs`).
    pub(crate) loopback_listener: bool,
    pub(crate) clients: BTreeMap<String, Arc<Upstream>>,
}

impl App {
    /// The same service for a reloaded config: fleet, metrics, logs, requests in flight and the
    /// shutdown signal carry over; routes, clients and keys come from the new config, and the
    /// active profile is the new config's `hooks.on_startup.profile` (none without it), as
    /// llama-swap does.
    /// The activity log (and its store, which is not reopened) and the performance samples carry
    /// over too.
    pub fn reloaded(&self) -> App {
        let logged = (self.activity.clone(), self.performance.clone());
        let mut next = App::with_log(
            self.fleet.clone(),
            self.logs.clone(),
            self.metrics.clone(),
            self.limits,
            logged,
        );
        next.inflight = self.inflight.clone();
        next.global_limit = self
            .global_limit
            .with_limit(next.config.global_concurrency_limit);
        next.budget = self.budget.clone();
        next.replaced = self.closing.child_token();
        next.closing = self.closing.clone();
        next.listening_on_loopback(self.loopback_listener);
        next
    }

    /// The service for a fleet, in tests: its config's store must open.
    #[cfg(test)]
    pub(crate) fn new(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
    ) -> App {
        let activity = activity::Activity::for_config(&fleet.config()).expect("the store opens");
        App::with_activity(fleet, logs, metrics, limits, activity)
    }

    /// The service for a fleet, with the activity log its config asks for, opened before the
    /// fleet started (a store that cannot be used stops corral before anything starts).
    pub fn with_activity(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
        activity: activity::Activity,
    ) -> App {
        let activity = Arc::new(activity);
        let performance = performance::Performance::start(fleet.clone(), activity.tally.clone());
        App::with_log(fleet, logs, metrics, limits, (activity, performance))
    }

    fn with_log(
        fleet: Fleet,
        logs: Arc<Logs>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: Limits,
        (activity, performance): (Arc<activity::Activity>, Arc<performance::Performance>),
    ) -> App {
        let config = fleet.config().clone();
        let clients = config
            .models
            .values()
            .map(|m| {
                let client = client_for(&m.timeouts, !m.disable_keep_alives);
                (m.id.to_string(), client)
            })
            .collect();
        let peer_clients = config
            .peers
            .iter()
            .map(|(id, p)| (id.clone(), client_for(&p.timeouts, true)))
            .collect();
        let peer_loads = peer_load::PeerLoads::start(&config, &peer_clients);
        let closing = tokio_util::sync::CancellationToken::new();
        let global_limit = global_limit::GlobalLimit::default();
        App {
            global_limit: global_limit.with_limit(config.global_concurrency_limit),
            peer_loads,
            catalog: fleet.catalog(),
            replaced: closing.child_token(),
            closing,
            profiles: names::Profiles::starting_with(config.startup_profile.clone()),
            spillover: Default::default(),
            peer_clients,
            inflight: Default::default(),
            activity,
            performance,
            keys: auth::Keys::for_config(&config, false),
            loopback_listener: false,
            config,
            fleet,
            metrics,
            logs,
            limits,
            budget: budget::BodyBudget::new(limits.buffered_bytes),
            clients,
        }
    }
}

impl App {
    /// Tells the service that corral listens on a loopback address, so that it answers only
    /// requests that name a loopback host or an allowed one.
    pub fn listening_on_loopback(&mut self, loopback: bool) {
        self.loopback_listener = loopback;
        self.keys = auth::Keys::for_config(&self.config, loopback);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An App for `yaml`, on a fleet that never starts a model.
    fn app(yaml: &str) -> App {
        let config = crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config;
        let spawner = crate::supervisor::Spawner::start(tokio::runtime::Handle::current()).unwrap();
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let logs = Arc::new(Logs::default());
        let fleet = Fleet::new(
            Arc::new(config),
            spawner,
            logs.clone(),
            metrics.fleet.clone(),
            crate::supervisor::sweep::StateFile::new(None, "t"),
            crate::sources::Fetcher::from_env(&|_| None),
        );
        App::new(fleet, logs, metrics, Default::default())
    }

    /// `hooks.on_startup.profile` is active at start, and again after a reload, whatever was
    /// chosen meanwhile.
    #[tokio::test]
    async fn the_startup_profile_is_active_at_start_and_after_a_reload() {
        let app = app("models:\n  a: {cmd: srv, proxy: 'http://h:1'}\n  b: {cmd: srv, proxy: 'http://h:1'}\nprofiles:\n  fast: {pins: {a: b}}\nhooks: {on_startup: {profile: fast}}\n");
        assert_eq!(app.profiles.active().as_deref(), Some("fast"));
        app.profiles.set(None);
        let reloaded = app.reloaded();
        assert_eq!(reloaded.profiles.active().as_deref(), Some("fast"));
    }

    /// `disableKeepAlives` gives its model a client that opens a connection per request.
    #[tokio::test]
    async fn a_model_without_keep_alives_gets_a_client_without_reuse() {
        let app = app("models:\n  a: {cmd: srv, proxy: 'http://h:1', disableKeepAlives: true}\n  b: {cmd: srv, proxy: 'http://h:1'}\n");
        assert!(!app.clients["a"].reuses_connections());
        assert!(app.clients["b"].reuses_connections());
    }
}
