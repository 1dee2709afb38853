//! `GET /models/sse`: llama.cpp's router events, each `data: {"model", "event", "data"}`:
//! `model_status` when a model's state changes (`{"status": "loading"}`, then `"loaded"`, ...)
//! and, while it loads, each new loading progress its engine reports (`"progress"`),
//! and `download_progress` with each file's `{done, total}` while its weights download. They are
//! read from the fleet's change signal, the one `/api/events` follows.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{download_progress, loading_progress, model_state, RouterState};
use crate::api::App;
use crate::fleet::Snapshot;
use crate::proxy::body::Body;

/// What the stream last told of one model: its state and its download.
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub state: RouterState,
    pub download: Value,
    /// The loading progress, while it loads and its engine reports one.
    pub loading: Value,
}

/// Every configured model's state, by model id.
pub fn states(model_ids: &[&str], snapshot: &[Snapshot]) -> BTreeMap<String, Told> {
    model_ids
        .iter()
        .map(|id| {
            let members: Vec<&Snapshot> = snapshot.iter().filter(|s| s.model == *id).collect();
            let state = model_state(&members);
            let (download, loading) = match state {
                RouterState::Downloading => (download_progress(&members), Value::Null),
                RouterState::Loading => (Value::Null, loading_progress(&members)),
                _ => (Value::Null, Value::Null),
            };
            let told = Told {
                state,
                download,
                loading,
            };
            (id.to_string(), told)
        })
        .collect()
}

/// The events that tell a reader who saw `before` what changed in `now`.
pub fn changes(before: &BTreeMap<String, Told>, now: &BTreeMap<String, Told>) -> Vec<Value> {
    let mut events = Vec::new();
    for (model, told) in now {
        let last = before.get(model);
        let progressed = !told.loading.is_null() && last.map(|l| &l.loading) != Some(&told.loading);
        if last.map(|l| l.state) != Some(told.state) || progressed {
            let mut data = json!({"status": told.state.as_str()});
            if !told.loading.is_null() {
                data["progress"] = told.loading.clone();
            }
            events.push(json!({"model": model, "event": "model_status", "data": data}));
        }
        if !told.download.is_null() && last.map(|l| &l.download) != Some(&told.download) {
            events
                .push(json!({"model": model, "event": "download_progress", "data": told.download}));
        }
    }
    events
}

fn frame(event: &Value) -> Bytes {
    Bytes::from(format!("data: {event}\n\n"))
}

fn current(app: &App) -> BTreeMap<String, Told> {
    let ids: Vec<&str> = app.config.models.keys().map(String::as_str).collect();
    states(&ids, &app.fleet.snapshot())
}

/// The stream: nothing at first (`GET /models` tells the present), then every change.
pub fn stream(app: &Arc<App>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let app = app.clone();
    // subscribed before the response leaves, so every change after the head is told
    let mut changed = app.fleet.watch();
    let mut told = current(&app);
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                c = changed.changed() => if c.is_err() { return },
                _ = tx.closed() => return,
                _ = app.replaced.cancelled() => return,
            }
            let now = current(&app);
            for event in changes(&told, &now) {
                if tx.send(frame(&event)).await.is_err() {
                    return;
                }
            }
            told = now;
        }
    });
    crate::proxy::body::sse_from_task(rx, task)
}
