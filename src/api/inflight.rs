//! Requests in flight: listed in the events stream, and cancellable by id.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::cancel::Cancel;

struct Entry {
    model: Arc<str>,
    path: Cow<'static, str>,
    method: http::Method,
    remote: std::net::IpAddr,
    started: SystemTime,
    cancel: Arc<Cancel>,
}

impl Entry {
    fn record(&self, id: u64) -> Value {
        json!({"id": id, "timestamp": crate::rfc3339::format(self.started), "model": self.model,
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
        model: Arc<str>,
        path: Cow<'static, str>,
        method: &http::Method,
        remote: std::net::IpAddr,
        cancel: Arc<Cancel>,
    ) -> Guard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            model,
            path,
            method: method.clone(),
            remote,
            started: SystemTime::now(),
            cancel,
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
                e.cancel.cancel();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_cancel_and_remove() {
        let reg = Arc::new(Inflight::default());
        let cancel = Cancel::new();
        let guard = reg.register(
            "m".into(),
            "/v1/chat/completions".into(),
            &http::Method::POST,
            std::net::Ipv4Addr::LOCALHOST.into(),
            cancel.clone(),
        );
        assert_eq!(reg.snapshot()["requests"].as_array().unwrap().len(), 1);
        assert!(reg.cancel(1));
        assert!(cancel.is_cancelled());
        drop(guard);
        assert!(!reg.cancel(1));
    }
}
