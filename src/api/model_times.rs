//! The fields of a model's `/api/events` status that follow its life, as llama-swap fills them
//! (its `apiModel`): `readySince` (RFC 3339) and `uptimeMs` while it is ready, `loadingProgress`
//! and `loadingMessage` while it starts and its engine reports them. Each is left out otherwise.

use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::fleet::{PhaseName, Snapshot};

/// The life fields of one instance's status at `now`.
pub fn fields(s: &Snapshot, now: SystemTime) -> Map<String, Value> {
    let mut out = Map::new();
    match (s.state, s.ready_since, &s.loading) {
        (PhaseName::Ready, Some(since), _) => {
            out.insert(
                "readySince".into(),
                json!(crate::clock::rfc3339::format(since)),
            );
            // at least 1, so that a model ready this very moment still shows an uptime
            let up = now.duration_since(since).unwrap_or_default().as_millis();
            out.insert("uptimeMs".into(), json!(up.max(1) as u64));
        }
        (PhaseName::Starting, _, Some(report)) => {
            if let Some(progress) = report.progress {
                out.insert("loadingProgress".into(), json!(progress));
            }
            if !report.message.is_empty() {
                out.insert("loadingMessage".into(), json!(report.message));
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::supervisor::LoadingProgress;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_ready_model_shows_since_when_and_for_how_long() {
        let s = Snapshot {
            state: PhaseName::Ready,
            ready_since: Some(at(1_800_000_000)),
            ..Default::default()
        };
        let f = fields(&s, at(1_800_000_090));
        assert_eq!(f["readySince"], "2027-01-15T08:00:00Z");
        assert_eq!(f["uptimeMs"], 90_000);
        assert_eq!(fields(&s, at(1_800_000_000))["uptimeMs"], 1, "never 0");
        assert!(!f.contains_key("loadingProgress"));
    }

    #[test]
    fn a_starting_model_shows_what_its_engine_reported() {
        let mut s = Snapshot {
            state: PhaseName::Starting,
            loading: Some(LoadingProgress {
                progress: Some(0.0),
                message: "loading tensors".into(),
            }),
            ..Default::default()
        };
        let f = fields(&s, at(0));
        assert_eq!(f["loadingProgress"], 0.0, "a progress of 0 is shown");
        assert_eq!(f["loadingMessage"], "loading tensors");
        assert!(!f.contains_key("readySince"));
        s.loading = Some(LoadingProgress {
            progress: None,
            message: "warming up".into(),
        });
        let f = fields(&s, at(0));
        assert_eq!(f.len(), 1, "{f:?}");
        s.loading = None;
        assert!(fields(&s, at(0)).is_empty());
    }

    #[test]
    fn stopping_and_stopped_models_show_none() {
        for state in [PhaseName::Stopping, PhaseName::Stopped] {
            let s = Snapshot {
                state,
                ready_since: Some(at(5)),
                ..Default::default()
            };
            assert!(fields(&s, at(9)).is_empty(), "{state:?}");
        }
    }
}
