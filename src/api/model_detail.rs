//! `GET /api/models/<id>`: one model's lifecycle status, instances, download and recent events.

use serde_json::{json, Value};

use crate::api::App;
use crate::fleet::lifecycle::{status_of, Status};
use crate::fleet::Snapshot;
use crate::proxy::error::Error;

/// The model `name` means (an id or an alias), as one JSON document.
pub fn detail(app: &App, name: &str) -> Result<Value, Error> {
    let id = app
        .config
        .real_model_name(name)
        .ok_or_else(|| Error::NotFound(format!("model {name:?} not found")))?;
    let snapshot = app.fleet.snapshot();
    let members: Vec<&Snapshot> = snapshot.iter().filter(|s| s.model == id).collect();
    let queued = app.fleet.queue_depths().get(id).copied().unwrap_or(0);
    let Status { status, reason, .. } = status_of(&members, queued);
    let events: Vec<Value> = app
        .fleet
        .recent_lifecycle_events()
        .into_iter()
        .filter(|e| e["model"] == id)
        .collect();
    let download = members.iter().find_map(|s| s.download.clone());
    Ok(json!({
        "id": id,
        "status": status.as_str(),
        "reason": reason,
        "download": download,
        "queued": queued,
        "instances": members.iter().map(|s| instance(app, s)).collect::<Vec<_>>(),
        "events": events,
    }))
}

fn instance(app: &App, s: &Snapshot) -> Value {
    json!({
        "id": s.instance, "state": s.state.as_str(), "pid": s.pid, "inFlight": s.in_flight,
        "slots": s.slots, "free": s.free, "failures": s.failures, "lastError": s.last_error,
        "devices": s.devices, "cmd": shown_command(app, s),
    })
}

/// An instance's command line as `/running` shows it (secrets as `***`): the one its process runs,
/// else the configured one.
pub fn shown_command(app: &App, s: &Snapshot) -> Option<String> {
    let model = app.config.models.get(&s.model)?;
    let spec = model.instances.iter().find(|i| i.id == s.instance)?;
    let argv = s.argv.as_ref().unwrap_or(&spec.argv);
    Some(app.config.redactor.command_line(argv))
}
