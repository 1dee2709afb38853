//! Requests in flight: listed in the events stream, and cancellable by id.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use foldhash::HashMap;
use serde_json::{json, Value};

use crate::observe::announce::Announcer;
use crate::observe::cancel::Cancel;

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
        json!({"id": id, "timestamp": crate::clock::rfc3339::format(self.started), "model": self.model,
            "req_path": self.path, "method": self.method.as_str(), "remote_ip": self.remote.to_string()})
    }
}

pub struct Inflight {
    next: AtomicU64,
    /// A hash map, not a tree: its room is kept as requests come and go, where a tree allocates
    /// and frees a node now and then, often on another serving thread than the one that made it.
    entries: Mutex<HashMap<u64, Entry>>,
    /// `inflight` event payloads: upserts and removals.
    pub events: Announcer<Value>,
}

impl Default for Inflight {
    fn default() -> Self {
        Inflight {
            next: AtomicU64::new(1),
            entries: Mutex::default(),
            events: Announcer::new(1024),
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
        if self.registry.events.is_heard() {
            self.registry
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
        // listed before it is announced: a listener that came in between finds it in its snapshot
        // (the JSON is built only when someone listens)
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if self.events.is_heard() {
            self.events
                .send(json!({"operation": "upsert", "request": entry.record(id)}));
        }
        entries.insert(id, entry);
        drop(entries);
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
        let mut ids: Vec<u64> = entries.keys().copied().collect();
        ids.sort_unstable();
        let requests: Vec<Value> = ids.iter().map(|id| entries[id].record(*id)).collect();
        json!({"operation": "snapshot", "requests": requests})
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

    /// The snapshot lists requests in the order they came, however they are stored.
    #[test]
    fn the_snapshot_lists_requests_oldest_first() {
        let reg = Arc::new(Inflight::default());
        let guards: Vec<Guard> = (0..20)
            .map(|_| {
                reg.register(
                    "m".into(),
                    "/v1/chat/completions".into(),
                    &http::Method::POST,
                    std::net::Ipv4Addr::LOCALHOST.into(),
                    Cancel::new(),
                )
            })
            .collect();
        let snapshot = reg.snapshot();
        let ids: Vec<u64> = snapshot["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, (1..=20).collect::<Vec<_>>());
        drop(guards);
    }
}
