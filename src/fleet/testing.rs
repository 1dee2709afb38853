//! What the fleet's own tests build on: a fleet from a config's text, and an instance made ready
//! by hand over a real process, so a test can set up a state without an engine to load.

use std::sync::Arc;

use super::phase::{Phase, Spawned};
use super::Fleet;

/// A config parsed from `yaml`.
pub(super) fn config(yaml: &str) -> Arc<crate::config::Config> {
    let loaded = crate::config::load_str("t.yaml", yaml, &|_| None).unwrap();
    Arc::new(loaded.config)
}

/// A fleet for the config `yaml`, nothing started.
pub(super) fn fleet(yaml: &str) -> Fleet {
    fleet_of(config(yaml))
}

/// A fleet for `config`, nothing started.
pub(super) fn fleet_of(config: Arc<crate::config::Config>) -> Fleet {
    let spawner = crate::supervisor::Spawner::start(tokio::runtime::Handle::current()).unwrap();
    Fleet::new(
        config,
        spawner,
        Arc::new(crate::logs::Logs::default()),
        crate::metrics::Metrics::new().fleet.clone(),
        crate::supervisor::sweep::StateFile::new(None, "t"),
        crate::sources::Fetcher::from_env(&|_| None),
    )
}

/// A process standing in for an engine, killed however the test ends, and the end of its stop
/// channel that its supervising task would hold (an order is only taken while someone listens).
pub(super) struct Engine {
    process: std::process::Child,
    _orders: tokio::sync::watch::Receiver<Option<super::instance::StopOrder>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Marks `id` ready over a `sleep` process, as if it had loaded; the process lives as long as
/// the returned `Engine`.
pub(super) fn make_ready(fleet: &Fleet, id: &str) -> Engine {
    let child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let (stop, orders) = tokio::sync::watch::channel(None);
    fleet.inner.lock().instances.get_mut(id).unwrap().phase = Phase::Ready {
        stop,
        process: Spawned {
            pid: child.id(),
            argv: vec!["sleep".into()],
        },
        since: std::time::SystemTime::now(),
    };
    Engine {
        process: child,
        _orders: orders,
    }
}
