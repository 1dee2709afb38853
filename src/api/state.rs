//! `GET /api/state`: what the dashboard's models page draws, in one answer.
//!
//! `/running` lists only running instances and has no queue, memory or load progress; `/metrics`
//! has those but as Prometheus text. The page needs all of it per model, so this route joins the
//! config, the catalog and a fleet snapshot. It sits behind the admin scope like `/running`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::api::App;
use crate::config::Device;
use crate::fleet::{PhaseName, Snapshot};

/// The whole state: models, their instances, pools with their queues, and device and host memory.
pub fn state(app: &App) -> Value {
    let snapshot = app.fleet.snapshot();
    json!({
        "models": models(app, &snapshot),
        "instances": snapshot.iter().map(|s| instance(app, s)).collect::<Vec<_>>(),
        "pools": pools(app),
        "devices": app.config.devices.iter().map(|d| device(d, &snapshot)).collect::<Vec<_>>(),
        "host": host(app, &snapshot),
    })
}

fn models(app: &App, snapshot: &[Snapshot]) -> Vec<Value> {
    let statuses = app.fleet.statuses();
    app.config
        .models
        .values()
        .map(|m| {
            let status = statuses.get(&*m.id);
            json!({
                "status": status.map(|s| s.status.as_str()),
                "reason": status.and_then(|s| s.reason.clone()),
                "id": m.id, "name": m.name.clone().unwrap_or_default(),
                "description": m.description.clone().unwrap_or_default(),
                "aliases": m.aliases, "unlisted": m.unlisted,
                "ttl": m.ttl.map_or(0, |t| t.as_secs()),
                "instances": m.instances.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
                "metadata": crate::api::models::shown_metadata(m, snapshot),
            })
        })
        .collect()
}

/// One instance, with its command line as `/running` shows it (secrets as `***`).
fn instance(app: &App, s: &Snapshot) -> Value {
    let cmd = crate::api::shown_command(app, s);
    let loading_for = (s.state == PhaseName::Starting)
        .then_some(s.pid)
        .flatten()
        .and_then(process_age);
    json!({
        "id": s.instance, "model": s.model, "pool": s.pool, "state": s.state.as_str(),
        "download": s.download, "loading": s.loading,
        "inFlight": s.in_flight, "slots": s.slots, "free": s.free,
        "failures": s.failures, "circuitOpen": s.circuit_open,
        "memory": s.memory, "measured": s.measured, "devices": s.devices, "host": s.host,
        "loadDeadline": s.load_deadline.as_secs_f64(),
        "loadElapsed": loading_for.map(|d| d.as_secs_f64()),
        "cmd": cmd,
    })
}

fn pools(app: &App) -> Vec<Value> {
    let queues = app.fleet.queue_depths();
    app.fleet
        .catalog()
        .pools
        .values()
        .map(|p| {
            json!({"id": p.id, "model": p.model, "members": p.members,
                "queue": queues.get(&p.id).copied().unwrap_or(0)})
        })
        .collect()
}

/// A device's ledger, summed as `/metrics` sums it.
fn device(d: &Device, snapshot: &[Snapshot]) -> Value {
    let (charged, measured) = crate::fleet::device_totals(snapshot, &d.name);
    json!({"name": d.name, "capacity": d.capacity, "reserve": d.reserve,
        "usable": d.usable(), "charged": charged, "measured": measured})
}

/// Host memory: what the instances are charged there against `hostMemory` (`null` when unset)
/// and what the host reports.
fn host(app: &App, snapshot: &[Snapshot]) -> Value {
    let charged: u64 = snapshot.iter().map(|s| s.host).sum();
    let reading = crate::memory::host::read();
    json!({"limit": app.config.host_memory, "charged": charged,
        "available": reading.available, "total": reading.total})
}

/// How long ago a process started, from `/proc`: a load's elapsed time, measured from the spawn
/// itself, so it is right however late the page first looks.
fn process_age(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    age_from(&stat, &uptime)
}

/// `/proc` counts start times in USER_HZ ticks, which Linux fixes at 100 for user space.
const TICKS_PER_SECOND: f64 = 100.0;

fn age_from(stat: &str, uptime: &str) -> Option<Duration> {
    // the command name may hold spaces and parentheses: fields are counted after the last ')'
    let after_name = stat.rsplit_once(')')?.1;
    // `starttime` is field 22; the text after the name starts at field 3
    let start_ticks: f64 = after_name.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (up - start_ticks / TICKS_PER_SECOND).max(0.0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_counts_fields_after_the_last_parenthesis() {
        let stat = "42 (fake (engine) x) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let age = age_from(stat, "200.00 100.00").unwrap();
        assert_eq!(age, Duration::from_secs_f64(200.0 - 123.45));
    }

    #[test]
    fn age_of_this_process_is_small_and_positive() {
        let age = process_age(std::process::id()).unwrap();
        assert!(age < Duration::from_secs(3600), "{age:?}");
    }
}
