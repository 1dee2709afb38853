//! `GET /api/events`: llama-swap's SSE stream of model states, log lines and requests in flight.
//!
//! Frames are `event:message\ndata:{"type":T,"data":"<JSON as a string>"}\n\n`, with the payload
//! encoded twice, as llama-swap's UI expects. A slow reader loses events, never blocks a writer.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::api::App;
use crate::observe::announce::Listener;
use crate::proxy::body::Body;

fn frame(kind: &str, data: &Value) -> Bytes {
    let inner = json!({"type": kind, "data": data.to_string()});
    Bytes::from(format!("event:message\ndata:{inner}\n\n"))
}

/// The active profile, as llama-swap's `profileChanged` carries it.
fn profile_changed(app: &App) -> Bytes {
    frame("profileChanged", &json!({"active": app.profiles.active()}))
}

/// The state of every model and instance, as the UI lists them.
pub fn model_status(app: &App) -> Value {
    let snapshot = app.fleet.snapshot();
    let statuses = app.fleet.statuses();
    let now = std::time::SystemTime::now();
    let mut out: Vec<Value> = snapshot
        .iter()
        .filter_map(|s| {
            let m = app.config.models.get(&s.model)?;
            let status = statuses.get(&s.model).map(|st| st.status.as_str());
            let mut v = json!({"status": status, "download": s.download,"id": s.instance, "name": m.name.clone().unwrap_or_default(), "description": m.description.clone().unwrap_or_default(),
                "state": s.state.as_str(), "unlisted": m.unlisted, "peerID": "", "aliases": m.aliases, "pool": s.pool});
            v.as_object_mut()?.extend(crate::api::model_times::fields(s, now));
            Some(v)
        })
        .collect();
    for (peer, p) in &app.config.peers {
        for m in &p.models {
            out.push(json!({"id": format!("{peer}/{m}"), "name": format!("{peer}: {m}"), "state": "stopped", "unlisted": false, "peerID": peer}));
        }
    }
    Value::Array(out)
}

/// A `logData` payload, with the config's secrets masked.
fn log_data(app: &App, source: &str, data: &[u8]) -> Value {
    let text = String::from_utf8_lossy(data);
    json!({"source": source, "data": app.config.redactor.text(&text)})
}

pub fn stream(app: &Arc<App>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let app = app.clone();
    // subscribed before the response leaves, so a client that has the headers sees every later
    // event, however late the task below first runs
    let mut sources = Sources::subscribe(&app);
    let task = tokio::spawn(async move {
        for f in first_frames(&app) {
            if tx.send(f).await.is_err() {
                return;
            }
        }
        while let Some(next) = sources.next(&app, &tx).await {
            if tx.try_send(next).is_err() && tx.is_closed() {
                return;
            }
        }
    });
    crate::proxy::body::sse_from_task(rx, task)
}

/// What a stream follows: the fleet's changes and lifecycle events, the active profile, both
/// log streams, the activity log and the requests in flight.
struct Sources {
    models: watch::Receiver<u64>,
    profile: watch::Receiver<Option<String>>,
    proxy_logs: broadcast::Receiver<Bytes>,
    upstream_logs: broadcast::Receiver<Bytes>,
    lifecycle: broadcast::Receiver<Value>,
    activity: Listener<u64>,
    inflight: Listener<Value>,
}

impl Sources {
    fn subscribe(app: &App) -> Sources {
        Sources {
            models: app.fleet.watch(),
            profile: app.profiles.watch(),
            proxy_logs: app.logs.proxy.subscribe(),
            upstream_logs: app.logs.upstream.subscribe(),
            lifecycle: app.fleet.lifecycle_events(),
            activity: app.activity.events.subscribe(),
            inflight: app.inflight.events.subscribe(),
        }
    }

    /// The next frame; `None` once the stream ends: a source closed, the client went away, or a
    /// reload replaced the service. A lagging log or event source skips what it missed; lagging
    /// in-flight events send the whole list instead.
    async fn next(&mut self, app: &App, tx: &mpsc::Sender<Bytes>) -> Option<Bytes> {
        use broadcast::error::RecvError::Lagged;
        loop {
            return Some(tokio::select! {
                changed = self.models.changed() => match changed {
                    Ok(()) => frame("modelStatus", &model_status(app)),
                    Err(_) => return None,
                },
                changed = self.profile.changed() => match changed {
                    Ok(()) => profile_changed(app),
                    Err(_) => return None,
                },
                line = self.proxy_logs.recv() => match line {
                    Ok(data) => frame("logData", &log_data(app, "proxy", &data)),
                    Err(Lagged(_)) => continue,
                    Err(_) => return None,
                },
                line = self.upstream_logs.recv() => match line {
                    Ok(data) => frame("logData", &log_data(app, "upstream", &data)),
                    Err(Lagged(_)) => continue,
                    Err(_) => return None,
                },
                event = self.lifecycle.recv() => match event {
                    Ok(e) => frame(e["type"].as_str().unwrap_or("lifecycle"), &e),
                    Err(Lagged(_)) => continue,
                    Err(_) => return None,
                },
                row = self.activity.recv() => match row {
                    Ok(id) => frame("activity", &json!({"id": id})),
                    Err(Lagged(_)) => continue,
                    Err(_) => return None,
                },
                event = self.inflight.recv() => match event {
                    Ok(v) => frame("inflight", &v),
                    Err(Lagged(_)) => frame("inflight", &app.inflight.snapshot()),
                    Err(_) => return None,
                },
                _ = tx.closed() => return None,
                _ = app.replaced.cancelled() => return None,
            });
        }
    }
}

/// What a new subscriber gets first: the logs so far, every model's state, the UI's settings, the
/// active profile and the requests in flight; later frames are changes to these.
fn first_frames(app: &App) -> [Bytes; 6] {
    [
        frame(
            "logData",
            &log_data(app, "proxy", &app.logs.proxy.history()),
        ),
        frame(
            "logData",
            &log_data(app, "upstream", &app.logs.upstream.history()),
        ),
        frame("modelStatus", &model_status(app)),
        frame(
            "uiConfig",
            &json!({"activity": {"session_id": app.config.ui_session_headers}}),
        ),
        profile_changed(app),
        frame("inflight", &app.inflight.snapshot()),
    ]
}
