use std::collections::BTreeMap;

use serde_json::json;

use super::sse::{changes, states, Told};
use super::*;
use crate::fleet::Download;

fn instance(model: &str, state: PhaseName) -> Snapshot {
    Snapshot {
        instance: model.into(),
        model: model.into(),
        state,
        ..Snapshot::default()
    }
}

fn downloading(model: &str, file: &str, bytes: u64) -> Snapshot {
    Snapshot {
        download: Some(Download {
            file: file.into(),
            bytes,
            total: Some(100),
            ..Download::default()
        }),
        ..instance(model, PhaseName::Starting)
    }
}

#[test]
fn each_phase_maps_to_a_router_state() {
    let of = |s: Snapshot| instance_state(&s).as_str();
    assert_eq!(of(instance("m", PhaseName::Stopped)), "unloaded");
    assert_eq!(of(instance("m", PhaseName::Starting)), "loading");
    assert_eq!(of(instance("m", PhaseName::Ready)), "loaded");
    assert_eq!(of(instance("m", PhaseName::Stopping)), "unloaded");
    assert_eq!(of(downloading("m", "w.gguf", 1)), "downloading");
    assert_eq!(of(instance("m", PhaseName::Sleeping)), "sleeping");
    let idle_asleep = Snapshot {
        engine_sleeping: true,
        ..instance("m", PhaseName::Ready)
    };
    assert_eq!(of(idle_asleep), "sleeping");
    assert!(RouterState::Sleeping.is_running());
}

#[test]
fn a_model_is_loaded_while_any_replica_serves() {
    let (a, b) = (
        instance("m", PhaseName::Starting),
        instance("m", PhaseName::Ready),
    );
    assert_eq!(model_state(&[&a, &b]), RouterState::Loaded);
    assert_eq!(model_state(&[&a]), RouterState::Loading);
    assert_eq!(model_state(&[]), RouterState::Unloaded);
}

#[test]
fn a_failed_start_shows_failed_and_its_exit_code() {
    let failed = Snapshot {
        failures: 1,
        last_error: Some("upstream command exited prematurely (exit status 3): boom".into()),
        ..instance("m", PhaseName::Stopped)
    };
    let status = status_of(&[&failed]);
    assert_eq!(
        status,
        json!({"value": "unloaded", "failed": true, "exit_code": 3})
    );
    assert_eq!(exit_code("health check timed out"), -1);
}

#[test]
fn a_loading_model_shows_its_command_and_a_download_its_files() {
    let loading = Snapshot {
        argv: Some(vec!["llama-server".into(), "-c".into(), "4096".into()]),
        ..instance("m", PhaseName::Starting)
    };
    assert_eq!(
        status_of(&[&loading]),
        json!({"value": "loading", "args": ["llama-server", "-c", "4096"]})
    );
    let fetching = downloading("m", "w.gguf", 40);
    assert_eq!(
        status_of(&[&fetching]),
        json!({"value": "downloading", "progress": {"w.gguf": {"done": 40, "total": 100}}})
    );
}

#[test]
fn events_tell_state_changes_and_download_progress() {
    let before = states(&["m", "n"], &[instance("m", PhaseName::Stopped)]);
    let now = states(&["m", "n"], &[downloading("m", "w.gguf", 10)]);
    assert_eq!(
        changes(&before, &now),
        [
            json!({"model": "m", "event": "model_status", "data": {"status": "downloading"}}),
            json!({"model": "m", "event": "download_progress",
                   "data": {"w.gguf": {"done": 10, "total": 100}}}),
        ]
    );
    assert!(changes(&now, &now).is_empty(), "nothing changed");
    let later = states(&["m", "n"], &[instance("m", PhaseName::Ready)]);
    assert_eq!(
        changes(&now, &later),
        [json!({"model": "m", "event": "model_status", "data": {"status": "loaded"}})]
    );
    let empty: BTreeMap<String, Told> = BTreeMap::new();
    assert_eq!(
        changes(&empty, &later).len(),
        2,
        "a model first seen is told"
    );
}

#[test]
fn default_architecture_is_text_only_where_none_is_given() {
    let mut plain = json!({"id": "m"});
    default_architecture(&mut plain);
    assert_eq!(
        plain["architecture"],
        json!({"input_modalities": ["text"], "output_modalities": ["text"]})
    );
    let mut given = json!({"architecture": {"input_modalities": ["text", "image"]}});
    default_architecture(&mut given);
    assert_eq!(
        given["architecture"]["input_modalities"],
        json!(["text", "image"])
    );
}
