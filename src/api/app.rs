//! The service's state: the gateway model requests go through, and what the HTTP surface adds to
//! it: the keys, the global limit, the performance samples, the logs and the shutdown signals.

use std::ops::Deref;
use std::sync::Arc;

use crate::api::auth;
use crate::api::global_limit;
use crate::fleet::Fleet;
use crate::logs::Logs;
use crate::observe::activity;
use crate::observe::performance;
use crate::routing::{Gateway, Limits};

/// Everything a request handler needs: the gateway's fields, read through it, and the surface's.
pub struct App {
    /// Where model requests go, and what they report to.
    pub gateway: Arc<Gateway>,
    /// Cancelled when shutdown starts; shared by every App a reload builds.
    pub closing: tokio_util::sync::CancellationToken,
    /// Cancelled when a reload puts another App in this one's place, or at shutdown: endless
    /// streams (events, logs) end with it, so that none goes on under the keys, masks and config
    /// it began with (a client opens them again), and the drain can finish.
    pub replaced: tokio_util::sync::CancellationToken,
    /// `globalConcurrencyLimit`, over every model request.
    pub(crate) global_limit: global_limit::GlobalLimit,
    /// The samples behind `/api/performance`.
    pub(crate) performance: Arc<performance::Performance>,
    pub logs: Arc<Logs>,
    pub(crate) keys: auth::Keys,
    /// corral listens on a loopback address: requests must name a loopback host (see `hosts.rs`).
    pub(crate) loopback_listener: bool,
}

impl Deref for App {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

impl App {
    /// The same service for a reloaded config: fleet, metrics, logs, requests in flight and the
    /// shutdown signal carry over; routes, clients and keys come from the new config (see
    /// [`Gateway::new`]). The activity log (and its store, which is not reopened) and the
    /// performance samples carry over too.
    pub fn reloaded(&self) -> App {
        let gateway = Gateway::new(
            self.fleet.clone(),
            self.metrics.clone(),
            self.limits,
            self.activity.clone(),
            auth::peer_key_route,
            Some(&self.gateway),
        );
        let mut next = App::with_gateway(gateway, self.logs.clone(), self.performance.clone());
        next.global_limit = self
            .global_limit
            .with_limit(next.config.global_concurrency_limit);
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
        let gateway = Gateway::new(fleet, metrics, limits, activity, auth::peer_key_route, None);
        App::with_gateway(gateway, logs, performance)
    }

    fn with_gateway(
        gateway: Gateway,
        logs: Arc<Logs>,
        performance: Arc<performance::Performance>,
    ) -> App {
        let closing = tokio_util::sync::CancellationToken::new();
        let limit = gateway.config.global_concurrency_limit;
        App {
            global_limit: global_limit::GlobalLimit::default().with_limit(limit),
            keys: auth::Keys::for_config(&gateway.config, false),
            gateway: Arc::new(gateway),
            replaced: closing.child_token(),
            closing,
            performance,
            logs,
            loopback_listener: false,
        }
    }

    /// Tells the service that corral listens on a loopback address, so that it answers only
    /// requests that name a loopback host or an allowed one.
    pub fn listening_on_loopback(&mut self, loopback: bool) {
        self.loopback_listener = loopback;
        self.keys = auth::Keys::for_config(&self.config, loopback);
    }
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
