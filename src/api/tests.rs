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
