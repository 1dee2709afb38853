//! llama.cpp's router API (llama-server started without a model): the `status` and
//! `architecture` its `GET /models` entries carry, `POST /models/load` and `/models/unload`,
//! the `GET /models/sse` events, `?autoload=false`, and an engine's own `/metrics?model=`.
//! Clients written for the router (Open WebUI's llama.cpp connection, pi, Letta) read these;
//! llama-swap's fields stay beside them in the same entries.

mod control;
mod metrics;
mod sse;

use serde_json::{json, Map, Value};

use crate::fleet::{PhaseName, Snapshot};

pub use control::{load, unload};
pub use metrics::engine_metrics;
pub use sse::stream;

/// A model's state as the router names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterState {
    Unloaded,
    Loading,
    Loaded,
    /// An engine that freed its weights while idle and wakes on the next request.
    Sleeping,
    Downloading,
}

impl RouterState {
    pub fn as_str(self) -> &'static str {
        match self {
            RouterState::Unloaded => "unloaded",
            RouterState::Loading => "loading",
            RouterState::Loaded => "loaded",
            RouterState::Sleeping => "sleeping",
            RouterState::Downloading => "downloading",
        }
    }

    /// Whether an engine process is up or coming up: the router's "running".
    pub fn is_running(self) -> bool {
        !matches!(self, RouterState::Unloaded | RouterState::Downloading)
    }
}

/// One instance's state: a stopping engine no longer serves, so it reads as unloaded.
pub fn instance_state(s: &Snapshot) -> RouterState {
    match s.state {
        PhaseName::Starting if s.download.is_some() => RouterState::Downloading,
        PhaseName::Starting => RouterState::Loading,
        PhaseName::Ready if s.engine_sleeping => RouterState::Sleeping,
        PhaseName::Ready => RouterState::Loaded,
        PhaseName::Sleeping => RouterState::Sleeping,
        PhaseName::Stopped | PhaseName::Stopping => RouterState::Unloaded,
    }
}

/// A model's state from its instances: loaded while any serves, else the furthest along of the
/// others.
pub fn model_state(members: &[&Snapshot]) -> RouterState {
    let states: Vec<RouterState> = members.iter().map(|s| instance_state(s)).collect();
    [
        RouterState::Loaded,
        RouterState::Sleeping,
        RouterState::Loading,
        RouterState::Downloading,
    ]
    .into_iter()
    .find(|wanted| states.contains(wanted))
    .unwrap_or(RouterState::Unloaded)
}

/// The exit code in a failed start's reason (`... (exit status 1) ...`), or -1 where the engine
/// did not exit by itself (a signal, a health check that never passed).
pub fn exit_code(reason: &str) -> i64 {
    reason
        .split("exit status ")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            digits.parse().ok()
        })
        .unwrap_or(-1)
}

/// The router's `status` object for a model: its value, the command line while one runs, the
/// failure of its last start while nothing runs, and per-file progress while downloading.
pub fn status_of(members: &[&Snapshot]) -> Value {
    let state = model_state(members);
    let mut status = Map::new();
    status.insert("value".into(), json!(state.as_str()));
    if let Some(argv) = members.iter().find_map(|s| s.argv.as_ref()) {
        status.insert("args".into(), json!(argv));
    }
    let failure = members
        .iter()
        .filter(|s| s.state == PhaseName::Stopped && s.failures > 0)
        .find_map(|s| s.last_error.as_deref());
    if let (RouterState::Unloaded, Some(reason)) = (state, failure) {
        status.insert("failed".into(), json!(true));
        status.insert("exit_code".into(), json!(exit_code(reason)));
    }
    let progress = match state {
        RouterState::Downloading => download_progress(members),
        RouterState::Loading => loading_progress(members),
        _ => Value::Null,
    };
    if !progress.is_null() {
        status.insert("progress".into(), progress);
    }
    Value::Object(status)
}

/// How far a starting engine says its load has come, in the shape of llama.cpp's loading
/// progress (one stage: corral's engines report one value for their whole load), with the
/// engine's message; null until an engine reports a value (`checkEndpoint` progress).
pub fn loading_progress(members: &[&Snapshot]) -> Value {
    let Some(told) = members.iter().find_map(|s| s.loading.as_ref()) else {
        return Value::Null;
    };
    let Some(value) = told.progress else {
        return Value::Null;
    };
    json!({
        "stages": ["text_model"],
        "current": "text_model",
        "value": value,
        "message": told.message,
    })
}

/// Each file being fetched, as `{"<file>": {"done": bytes, "total": bytes}}`.
pub fn download_progress(members: &[&Snapshot]) -> Value {
    let files: Map<String, Value> = members
        .iter()
        .filter_map(|s| s.download.as_ref())
        .map(|d| {
            let total = d.total.unwrap_or(0);
            (d.file.clone(), json!({"done": d.bytes, "total": total}))
        })
        .collect();
    Value::Object(files)
}

/// Puts the router's status into a model's entry, keeping what llama-swap's `status` carries.
/// The command line (`args`) is shown with the config's secrets masked, and only where `redactor`
/// is given: to an admin, as `/running` shows it.
pub fn describe(
    record: &mut Value,
    members: &[&Snapshot],
    redactor: Option<&crate::config::Redactor>,
) {
    let Value::Object(mut router) = status_of(members) else {
        return;
    };
    if let (Some(Value::Array(args)), Some(r)) = (router.remove("args"), redactor) {
        let argv: Vec<String> = args
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        router.insert("args".into(), json!(r.argv(&argv)));
    }
    if !record["status"].is_object() {
        record["status"] = json!({});
    }
    for (k, v) in router {
        record["status"][k.as_str()] = v;
    }
}

/// `architecture` for an entry that has none: text in, text out.
pub fn default_architecture(record: &mut Value) {
    if record.get("architecture").is_none() {
        record["architecture"] =
            json!({"input_modalities": ["text"], "output_modalities": ["text"]});
    }
}

#[cfg(test)]
mod tests;
