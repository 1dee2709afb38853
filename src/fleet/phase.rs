//! An instance's phase, with what it has only in that phase: the channel its stop orders go on,
//! its weights' download and its process. So a stopped instance cannot have a pid or take an
//! order, and a ready one cannot be downloading. Its name labels `/running`, events and the
//! metrics.

use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::watch;

use super::stopping::StopOrder;
use crate::supervisor::LoadingProgress;

/// How far the download of an instance's weights has come.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Download {
    /// The file being received (a path in the repository, a layer, an object key).
    pub file: String,
    pub bytes: u64,
    pub total: Option<u64>,
    pub bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
}

/// The name of a phase: what `/running` and events show, and the metrics' `state` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, strum::EnumIter)]
#[serde(rename_all = "lowercase")]
pub enum PhaseName {
    #[default]
    Stopped,
    Starting,
    Ready,
    Stopping,
}

#[cfg(test)]
impl PhaseName {
    /// Any phase, for property tests.
    pub(super) fn any() -> impl proptest::strategy::Strategy<Value = PhaseName> {
        use strum::IntoEnumIterator;
        proptest::sample::select(PhaseName::iter().collect::<Vec<_>>())
    }
}

impl PhaseName {
    /// The name clients see in `/running` and events, and the `state` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseName::Stopped => "stopped",
            PhaseName::Starting => "starting",
            PhaseName::Ready => "ready",
            PhaseName::Stopping => "stopping",
        }
    }
}

/// Where stop orders reach a started instance's task.
pub type StopSender = watch::Sender<Option<StopOrder>>;

/// A spawned engine process.
#[derive(Debug, Clone)]
pub struct Spawned {
    pub pid: u32,
    /// Its command line: the configured one, over fetched weights and with its devices' split.
    pub argv: Vec<String>,
}

/// Where an instance is in its life, with what it has only in that part of it: a stopped
/// instance has no process and takes no order, a starting one may be fetching its weights.
#[derive(Debug, Default)]
pub enum Phase {
    #[default]
    Stopped,
    /// Fetching its weights (`download`, while one runs), then loading once `process` is spawned,
    /// with the progress its engine last reported (`loading`).
    Starting {
        stop: StopSender,
        download: Option<Download>,
        process: Option<Spawned>,
        loading: Option<LoadingProgress>,
    },
    /// Serving, since the wall-clock time it became ready.
    Ready {
        stop: StopSender,
        process: Spawned,
        since: SystemTime,
    },
    /// Told to stop and on its way out: another order would change nothing.
    Stopping { process: Spawned },
}

impl Phase {
    /// A ready instance told to stop is stopping from the order on, before its task has taken
    /// it: a request sent there then would be cut off by the stop.
    pub fn name(&self) -> PhaseName {
        match self {
            Phase::Stopped => PhaseName::Stopped,
            Phase::Starting { .. } => PhaseName::Starting,
            Phase::Ready { stop, .. } if stop.borrow().is_some() => PhaseName::Stopping,
            Phase::Ready { .. } => PhaseName::Ready,
            Phase::Stopping { .. } => PhaseName::Stopping,
        }
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self, Phase::Stopped)
    }

    /// Ready to take requests: loaded, and not told to stop.
    pub fn is_ready(&self) -> bool {
        self.name() == PhaseName::Ready
    }

    /// The engine process, once spawned and until it has exited.
    pub fn process(&self) -> Option<&Spawned> {
        match self {
            Phase::Starting { process, .. } => process.as_ref(),
            Phase::Ready { process, .. } | Phase::Stopping { process } => Some(process),
            Phase::Stopped => None,
        }
    }

    /// The download of its weights, while one runs.
    pub fn download(&self) -> Option<&Download> {
        match self {
            Phase::Starting { download, .. } => download.as_ref(),
            _ => None,
        }
    }

    /// The download to update with progress, while one runs (a late update must not bring back
    /// one that has ended).
    pub fn download_mut(&mut self) -> Option<&mut Download> {
        match self {
            Phase::Starting { download, .. } => download.as_mut(),
            _ => None,
        }
    }

    /// Shows a download starting (`Some`) or ended (`None`), while the instance starts.
    pub fn set_download(&mut self, to: Option<Download>) {
        if let Phase::Starting { download, .. } = self {
            *download = to;
        }
    }

    /// The loading progress a starting instance's engine last reported.
    pub fn loading(&self) -> Option<&LoadingProgress> {
        match self {
            Phase::Starting { loading, .. } => loading.as_ref(),
            _ => None,
        }
    }

    /// Shows the progress a starting instance's engine reported (a late report after the start
    /// has ended changes nothing).
    pub fn set_loading(&mut self, report: LoadingProgress) {
        if let Phase::Starting { loading, .. } = self {
            *loading = Some(report);
        }
    }

    /// When a ready (or stopping-after-ready) instance became ready.
    pub fn ready_since(&self) -> Option<SystemTime> {
        match self {
            Phase::Ready { since, .. } => Some(*since),
            _ => None,
        }
    }

    /// Records the process a starting instance spawned.
    pub fn spawned(&mut self, spawned: Spawned) {
        if let Phase::Starting { process, .. } = self {
            *process = Some(spawned);
        }
    }

    /// A starting instance's engine has loaded: ready from `since`, still taking stop orders.
    pub fn ready(&mut self, process: Spawned, since: SystemTime) {
        *self = match std::mem::take(self) {
            Phase::Starting { stop, .. } => Phase::Ready {
                stop,
                process,
                since,
            },
            other => other,
        };
    }

    /// A ready instance took its stop order: stopping, with its process until it exits.
    pub fn stopping(&mut self) {
        *self = match std::mem::take(self) {
            Phase::Ready { process, .. } => Phase::Stopping { process },
            other => other,
        };
    }

    /// Stopping, or told to stop.
    pub fn is_stopping(&self) -> bool {
        match self.stop_sender() {
            Some(stop) => stop.borrow().is_some(),
            None => matches!(self, Phase::Stopping { .. }),
        }
    }

    /// Tells a starting or ready instance's task to stop it, unless it was told already (the
    /// first order's grace and reason stand).
    pub fn order_stop(&self, order: StopOrder) {
        if let Some(stop) = self.stop_sender() {
            if stop.borrow().is_none() {
                let _ = stop.send(Some(order));
            }
        }
    }

    /// The channel stop orders go on: only a starting or ready instance takes one.
    fn stop_sender(&self) -> Option<&StopSender> {
        match self {
            Phase::Starting { stop, .. } | Phase::Ready { stop, .. } => Some(stop),
            Phase::Stopped | Phase::Stopping { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fleet::StopReason;

    fn spawned(pid: u32) -> Spawned {
        Spawned {
            pid,
            argv: vec!["engine".into()],
        }
    }

    #[test]
    fn a_start_fetches_then_spawns_then_serves_then_stops_taking_no_more_orders() {
        let (stop, orders) = watch::channel(None);
        let mut phase = Phase::Starting {
            stop,
            download: None,
            process: None,
            loading: None,
        };
        phase.set_download(Some(Download::default()));
        phase.download_mut().expect("fetching").bytes = 7;
        assert_eq!(phase.download().map(|d| d.bytes), Some(7));
        phase.set_download(None);
        assert!(
            phase.download_mut().is_none(),
            "an ended download stays ended"
        );
        phase.spawned(spawned(41));
        assert_eq!(phase.name(), PhaseName::Starting);
        assert_eq!(phase.process().map(|p| p.pid), Some(41));
        let report = LoadingProgress {
            progress: Some(0.5),
            message: "loading tensors".into(),
        };
        phase.set_loading(report.clone());
        assert_eq!(phase.loading(), Some(&report));
        assert_eq!(phase.ready_since(), None);
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        phase.ready(spawned(41), since);
        assert_eq!(phase.name(), PhaseName::Ready);
        assert_eq!(phase.ready_since(), Some(since));
        assert_eq!(phase.loading(), None, "a ready instance is not loading");
        phase.set_loading(report);
        assert_eq!(phase.loading(), None, "a late report changes nothing");
        assert!(!phase.is_stopping());
        let order = |reason| StopOrder {
            grace: Duration::ZERO,
            reason,
        };
        phase.order_stop(order(StopReason::Ttl));
        phase.order_stop(order(StopReason::Swap));
        assert!(phase.is_stopping());
        assert_eq!(
            phase.name(),
            PhaseName::Stopping,
            "stopping from the order on"
        );
        assert!(!phase.is_ready(), "it takes no more requests");
        let sent = orders.borrow().expect("ordered");
        assert_eq!(sent.reason, StopReason::Ttl, "the first order stands");
        phase.stopping();
        assert_eq!(phase.name(), PhaseName::Stopping);
        assert_eq!(
            phase.process().map(|p| p.pid),
            Some(41),
            "killable until it exits"
        );
        assert!(phase.is_stopping());
        phase.order_stop(order(StopReason::Unload));
        assert_eq!(orders.borrow().expect("ordered").reason, StopReason::Ttl);
    }

    #[test]
    fn only_a_starting_instance_becomes_ready_and_only_a_ready_one_stopping() {
        let mut phase = Phase::Stopped;
        phase.ready(spawned(1), SystemTime::now());
        phase.stopping();
        phase.spawned(spawned(1));
        phase.set_download(Some(Download::default()));
        assert!(phase.is_stopped());
        assert!(phase.process().is_none() && phase.download().is_none());
        assert!(!phase.is_stopping(), "a stopped instance takes no order");
        let mut stopping = Phase::Stopping {
            process: spawned(2),
        };
        stopping.ready(spawned(3), SystemTime::now());
        assert_eq!(stopping.name(), PhaseName::Stopping);
        assert_eq!(stopping.process().map(|p| p.pid), Some(2));
    }
}
