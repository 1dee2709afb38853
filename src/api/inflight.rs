//! Requests in flight: listed in the events stream, and cancellable by id.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

struct Entry {
    model: String,
    path: String,
    method: http::Method,
    remote: std::net::IpAddr,
    started: SystemTime,
    token: CancellationToken,
}

impl Entry {
    fn record(&self, id: u64) -> Value {
        json!({"id": id, "timestamp": humantime_rfc3339(self.started), "model": self.model,
            "req_path": self.path, "method": self.method.as_str(), "remote_ip": self.remote.to_string()})
    }
}

pub struct Inflight {
    next: AtomicU64,
    entries: Mutex<BTreeMap<u64, Entry>>,
    /// `inflight` event payloads: upserts and removals.
    pub events: broadcast::Sender<Value>,
}

impl Default for Inflight {
    fn default() -> Self {
        Inflight {
            next: AtomicU64::new(1),
            entries: Mutex::new(BTreeMap::new()),
            events: broadcast::channel(1024).0,
        }
    }
}

/// Removes the entry when the request is over.
pub struct Guard {
    registry: Arc<Inflight>,
    id: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.registry
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        if self.registry.events.receiver_count() > 0 {
            let _ = self
                .registry
                .events
                .send(json!({"operation": "remove", "id": self.id}));
        }
    }
}

impl Inflight {
    pub fn register(
        self: &Arc<Self>,
        model: &str,
        path: &str,
        method: &http::Method,
        remote: std::net::IpAddr,
        token: CancellationToken,
    ) -> Guard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            model: model.into(),
            path: path.into(),
            method: method.clone(),
            remote,
            started: SystemTime::now(),
            token,
        };
        // the JSON is built only when someone listens
        if self.events.receiver_count() > 0 {
            let _ = self
                .events
                .send(json!({"operation": "upsert", "request": entry.record(id)}));
        }
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, entry);
        Guard {
            registry: self.clone(),
            id,
        }
    }

    /// Cancels a request; false when there is no such request.
    pub fn cancel(&self, id: u64) -> bool {
        match self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            Some(e) => {
                e.token.cancel();
                true
            }
            None => false,
        }
    }

    pub fn snapshot(&self) -> Value {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        json!({"operation": "snapshot", "requests": entries.iter().map(|(id, e)| e.record(*id)).collect::<Vec<_>>()})
    }
}

/// RFC 3339 in UTC, without pulling in a date crate.
pub fn humantime_rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil-from-days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_016_000);
        assert_eq!(humantime_rfc3339(t), "2026-11-30T05:20:00Z");
        assert_eq!(
            humantime_rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn register_cancel_and_remove() {
        let reg = Arc::new(Inflight::default());
        let token = CancellationToken::new();
        let guard = reg.register(
            "m",
            "/v1/chat/completions",
            &http::Method::POST,
            std::net::Ipv4Addr::LOCALHOST.into(),
            token.clone(),
        );
        assert_eq!(reg.snapshot()["requests"].as_array().unwrap().len(), 1);
        assert!(reg.cancel(1));
        assert!(token.is_cancelled());
        drop(guard);
        assert!(!reg.cancel(1));
    }
}
