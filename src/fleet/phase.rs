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
    /// Its engine freed the device and keeps its process (or is on its way there); a request
    /// wakes it.
    Sleeping,
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
            PhaseName::Sleeping => "sleeping",
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
    /// Put to sleep instead of stopped: falling asleep, asleep (its device memory freed) or
    /// waking. Still takes stop orders.
    Sleeping {
        stop: StopSender,
        process: Spawned,
        step: Rest,
    },
    /// Told to stop and on its way out: another order would change nothing.
    Stopping { process: Spawned },
}

/// Where a sleeping instance is between ready and ready again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rest {
    /// Its sleep calls are on their way: it serves nothing and still holds its memory.
    Falling,
    /// Asleep: its device memory is free but for a residue.
    Asleep,
    /// Its wake calls are on their way, under the wake deadline: requests wait, as for a load.
    Waking,
}

impl Phase {
    /// A ready instance told to stop is stopping from the order on, before its task has taken
    /// it: a request sent there then would be cut off by the stop.
    #[inline]
    pub fn name(&self) -> PhaseName {
        match self {
            Phase::Stopped => PhaseName::Stopped,
            Phase::Starting { .. } => PhaseName::Starting,
            Phase::Ready { stop, .. } if stop.borrow().is_some() => PhaseName::Stopping,
            Phase::Ready { .. } => PhaseName::Ready,
            Phase::Sleeping { stop, .. } if stop.borrow().is_some() => PhaseName::Stopping,
            Phase::Sleeping {
                step: Rest::Waking, ..
            } => PhaseName::Starting,
            Phase::Sleeping { .. } => PhaseName::Sleeping,
            Phase::Stopping { .. } => PhaseName::Stopping,
        }
    }

    /// Where a sleeping instance is, not told to stop; `None` for any other.
    pub fn rest(&self) -> Option<Rest> {
        match self {
            Phase::Sleeping { step, stop, .. } if stop.borrow().is_none() => Some(*step),
            _ => None,
        }
    }

    /// Asleep, its device memory free: it holds no place in a swap, and a request wakes it.
    pub fn is_asleep(&self) -> bool {
        self.rest() == Some(Rest::Asleep)
    }

    /// A ready instance is put to sleep: it serves nothing from now on.
    pub fn fall_asleep(&mut self) {
        *self = match std::mem::take(self) {
            Phase::Ready { stop, process, .. } => Phase::Sleeping {
                stop,
                process,
                step: Rest::Falling,
            },
            other => other,
        };
    }

    /// A sleeping instance moves on to `next` (asleep once its calls are done, waking when a
    /// request wants it).
    pub fn rest_step(&mut self, next: Rest) {
        if let Phase::Sleeping { step, .. } = self {
            *step = next;
        }
    }

    /// A woken instance serves again, ready from `since`.
    pub fn awake(&mut self, since: SystemTime) {
        *self = match std::mem::take(self) {
            Phase::Sleeping { stop, process, .. } => Phase::Ready {
                stop,
                process,
                since,
            },
            other => other,
        };
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
            Phase::Ready { process, .. }
            | Phase::Sleeping { process, .. }
            | Phase::Stopping { process } => Some(process),
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

    /// A ready (or sleeping) instance took its stop order: stopping, with its process until it
    /// exits.
    pub fn stopping(&mut self) {
        *self = match std::mem::take(self) {
            Phase::Ready { process, .. } | Phase::Sleeping { process, .. } => {
                Phase::Stopping { process }
            }
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
            Phase::Starting { stop, .. }
            | Phase::Ready { stop, .. }
            | Phase::Sleeping { stop, .. } => Some(stop),
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

    #[test]
    fn a_ready_instance_sleeps_wakes_and_takes_stop_orders_while_asleep() {
        let (stop, _orders) = watch::channel(None);
        let mut phase = Phase::Ready {
            stop,
            process: spawned(7),
            since: SystemTime::UNIX_EPOCH,
        };
        phase.fall_asleep();
        assert_eq!(
            (phase.name(), phase.rest()),
            (PhaseName::Sleeping, Some(Rest::Falling))
        );
        assert!(!phase.is_ready() && !phase.is_asleep());
        phase.rest_step(Rest::Asleep);
        assert!(phase.is_asleep());
        assert_eq!(phase.process().map(|p| p.pid), Some(7), "the process stays");
        phase.rest_step(Rest::Waking);
        assert_eq!(
            phase.name(),
            PhaseName::Starting,
            "a wake is waited for as a load"
        );
        let since = SystemTime::now();
        phase.awake(since);
        assert_eq!(
            (phase.name(), phase.ready_since()),
            (PhaseName::Ready, Some(since))
        );
        phase.fall_asleep();
        phase.rest_step(Rest::Asleep);
        phase.order_stop(StopOrder {
            grace: Duration::ZERO,
            reason: StopReason::Ttl,
        });
        assert_eq!((phase.name(), phase.rest()), (PhaseName::Stopping, None));
        phase.stopping();
        assert!(matches!(phase, Phase::Stopping { .. }));
    }
}
