//! The activity log: one row per model request, kept in memory (`metricsMaxInMemory` rows), served
//! as llama-swap serves it (`/api/metrics/activity`, `/api/metrics/stats`, `activity` events).
//! With `store.path` every row is also written to SQLite (`store`) and the newest rows are
//! read back at start; with `captureBuffer` the bodies of recent requests are kept beside it.
//!
//! A row's text comes partly from clients (a passthrough path) and upstreams (a content type, an
//! error): each field is cut to a bound ([`cut`]), so no request makes a large row in memory
//! or on disk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use foldhash::HashSet;
use serde_json::{json, Value};

use crate::observe::counts::Tokens;
use query::Query;

mod query;
pub mod source;
mod store;
pub(crate) mod tally;

pub use store::OpenError as StoreError;

/// One finished request.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: u64,
    pub time: SystemTime,
    pub model: Arc<str>,
    pub req_path: Arc<str>,
    pub status: u16,
    pub content_type: std::borrow::Cow<'static, str>,
    pub tokens: Option<Tokens>,
    pub duration_ms: u64,
    /// Time to the first byte of the response, when one came.
    pub ttft_ms: Option<u64>,
    pub error: Option<String>,
    /// Its request and response are in the captures.
    pub has_capture: bool,
    /// The label of the API key it presented (a key's name or fingerprint, never the key).
    pub key: Option<Arc<str>>,
    /// The address it came from (see [`source`]); `None` in rows kept from before.
    pub src: Option<std::net::SocketAddr>,
}

/// A response's content type, shared when it is one of the usual ones.
pub fn content_type(value: &str) -> std::borrow::Cow<'static, str> {
    const USUAL: &[&str] = &[
        "application/json",
        "application/json; charset=utf-8",
        "text/event-stream",
        "text/event-stream; charset=utf-8",
        "text/plain; charset=utf-8",
    ];
    match USUAL.iter().find(|u| **u == value) {
        Some(usual) => std::borrow::Cow::Borrowed(usual),
        None => std::borrow::Cow::Owned(value.to_string()),
    }
}

/// The most bytes a row keeps of its path, model, content type and error: each longer one is cut
/// and ends in [`CUT`]. A row is then at most about 7 KiB.
const PATH_MAX: usize = 2048;
const MODEL_MAX: usize = 512;
const CONTENT_TYPE_MAX: usize = 256;
const ERROR_MAX: usize = 4096;
/// What ends a cut text.
const CUT: &str = "…[truncated]";

/// `text` cut to `max` bytes when it is longer: its start (cut on a character's edge) and
/// [`CUT`], `max` bytes or fewer in all; `None` when it fits.
fn cut(text: &str, max: usize) -> Option<String> {
    if text.len() <= max {
        return None;
    }
    let mut end = max.saturating_sub(CUT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(format!("{}{CUT}", &text[..end]))
}

/// What a finished request leaves in the log (the id and time are added).
pub struct Entry {
    pub model: Arc<str>,
    pub req_path: std::borrow::Cow<'static, str>,
    pub status: u16,
    pub content_type: std::borrow::Cow<'static, str>,
    pub tokens: Option<Tokens>,
    pub duration_ms: u64,
    pub ttft_ms: Option<u64>,
    pub error: Option<String>,
    /// The request and response to keep, when captures are on.
    pub capture: Option<crate::observe::captures::Capture>,
    /// The label of the API key it presented.
    pub key: Option<Arc<str>>,
    /// The address it came from.
    pub src: Option<std::net::SocketAddr>,
}

impl Entry {
    /// Cuts each text to its bound.
    fn cut_to_bounds(&mut self) {
        if let Some(c) = cut(&self.model, MODEL_MAX) {
            self.model = c.into();
        }
        if let Some(c) = cut(&self.req_path, PATH_MAX) {
            self.req_path = c.into();
        }
        if let Some(c) = cut(&self.content_type, CONTENT_TYPE_MAX) {
            self.content_type = c.into();
        }
        if let Some(c) = self.error.as_deref().and_then(|e| cut(e, ERROR_MAX)) {
            self.error = Some(c);
        }
    }
}

pub struct Activity {
    rows: Mutex<Rows>,
    next: AtomicU64,
    max: usize,
    /// Ids of new rows, for the events stream.
    pub events: crate::observe::announce::Announcer<u64>,
    /// The copy on disk (`store.path`).
    store: Option<store::Store>,
    /// Bodies of recent requests (`captureBuffer`).
    pub captures: Option<crate::observe::captures::Captures>,
    /// Per-model counts since the last performance sample.
    pub tally: Arc<tally::Tally>,
}

/// The rows, and the model names and paths they share. Rows are written when requests end,
/// often in bursts when many clients leave at once; rows that held allocations of their own
/// would be scattered over the memory those connections freed and keep it from going back to
/// the system.
struct Rows {
    rows: VecDeque<Row>,
    names: HashSet<Arc<str>>,
}

/// Distinct model names and paths kept for sharing; beyond it, rows get their own copies.
const SHARED_NAMES: usize = 512;

impl Rows {
    /// A name that is already shared (a model id, shared with the config) is kept as it is, with
    /// no lookup; one that nothing else holds (made for this row alone) is swapped for the log's
    /// shared copy, so that rows do not each keep their own.
    fn shared_arc(&mut self, name: Arc<str>) -> Arc<str> {
        if Arc::strong_count(&name) > 1 {
            return name;
        }
        self.shared(&name)
    }

    fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(name);
        if self.names.len() < SHARED_NAMES {
            self.names.insert(shared.clone());
        }
        shared
    }
}

impl Activity {
    pub fn new(max_rows: u64) -> Activity {
        let max = if max_rows == 0 {
            1000
        } else {
            max_rows as usize
        };
        Activity {
            rows: Mutex::new(Rows {
                rows: VecDeque::with_capacity(max),
                names: HashSet::default(),
            }),
            next: AtomicU64::new(1),
            max,
            events: crate::observe::announce::Announcer::new(256),
            store: None,
            captures: None,
            tally: Default::default(),
        }
    }

    /// The log a config asks for: kept at `store.path` when set, with captures when
    /// `captureBuffer` is above 0. A store that cannot be used is an error that names it.
    pub fn for_config(config: &crate::config::Config) -> Result<Activity, StoreError> {
        let mut log = Activity::new(config.metrics_max_in_memory);
        log.captures = (config.capture_buffer_mb > 0)
            .then(|| crate::observe::captures::Captures::new(config.capture_buffer_mb << 20));
        if let Some(path) = &config.store_path {
            let retention = store::Retention::default();
            let opened = store::Store::open(path.as_ref(), log.max, retention)?;
            log.restore(opened.rows, opened.next_id);
            log.store = Some(opened.store);
        }
        Ok(log)
    }

    /// Takes back rows read from the store; new rows continue after `next_id`.
    fn restore(&self, saved: Vec<Row>, next_id: u64) {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for mut row in saved.into_iter().rev().take(self.max).rev() {
            row.model = rows.shared(&row.model);
            row.req_path = rows.shared(&row.req_path);
            rows.rows.push_back(row);
        }
        self.next.store(next_id.max(1), Ordering::Relaxed);
    }

    /// Logs a finished request; returns its id.
    pub fn record(&self, e: Entry) -> u64 {
        let id = self.next_id();
        self.record_as(id, SystemTime::now(), e);
        id
    }

    /// The id of the next request to finish: taken when its answer ends, and logged (with
    /// [`Self::record_as`]) once its bookkeeping is done, so that the log keeps the order in
    /// which the answers ended.
    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Logs a finished request under the id and time it ended at.
    pub fn record_as(&self, id: u64, time: SystemTime, mut e: Entry) {
        e.cut_to_bounds();
        let has_capture = match (e.capture, &self.captures) {
            (Some(capture), Some(captures)) => captures.put(id, capture),
            _ => false,
        };
        let saved = {
            let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
            let row = Row {
                id,
                time,
                model: rows.shared_arc(e.model),
                req_path: rows.shared(&e.req_path),
                status: e.status,
                content_type: e.content_type,
                tokens: e.tokens,
                duration_ms: e.duration_ms,
                ttft_ms: e.ttft_ms,
                error: e.error,
                has_capture,
                key: e.key,
                src: e.src,
            };
            self.tally.count(&row);
            if rows.rows.len() >= self.max {
                rows.rows.pop_front();
            }
            let saved = self.store.as_ref().map(|_| row.clone());
            rows.rows.push_back(row);
            saved
        };
        if let (Some(store), Some(row)) = (&self.store, saved) {
            store.save(row);
        }
        if self.events.is_heard() {
            self.events.send(id);
        }
    }

    fn rows(&self) -> Vec<Row> {
        self.rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rows
            .iter()
            .cloned()
            .collect()
    }

    /// `GET /api/metrics/activity`: filtered, sorted, paginated; `Err` names the bad parameter.
    pub fn query(&self, query: &str) -> Result<Value, String> {
        let q = Query::parse(query)?;
        let all = self.rows();
        let keys = key_labels(&all);
        let mut rows: Vec<Row> = all.into_iter().filter(|r| q.keeps(r)).collect();
        q.sort(&mut rows);
        let total = rows.len();
        let pages = total.div_ceil(q.limit).max(1);
        let data: Vec<Value> = rows
            .iter()
            .skip((q.page - 1) * q.limit)
            .take(q.limit)
            .map(row_json)
            .collect();
        let mut page = json!({"data": data, "page": q.page, "limit": q.limit, "total": total, "total_pages": pages});
        if !keys.is_empty() {
            page["keys"] = json!(keys);
        }
        Ok(page)
    }

    /// `GET /api/metrics/stats?model=`: totals and speed histograms.
    pub fn stats(&self, query: &str) -> Result<Value, String> {
        let mut model = None;
        for (k, v) in form_urlencoded::parse(query.as_bytes()).into_owned() {
            match k.as_str() {
                "model" => model = Some(v),
                other => return Err(format!("unknown parameter {other:?}")),
            }
        }
        let rows: Vec<Row> = self
            .rows()
            .into_iter()
            .filter(|r| model.as_ref().is_none_or(|m| *r.model == **m))
            .collect();
        let sum = |f: &dyn Fn(&Tokens) -> u64| -> u64 {
            rows.iter().filter_map(|r| r.tokens.as_ref()).map(f).sum()
        };
        let speeds = |f: &dyn Fn(&Tokens) -> Option<f64>| -> Vec<f64> {
            rows.iter()
                .filter_map(|r| r.tokens.as_ref().and_then(f))
                .filter(|v| v.is_finite() && *v >= 0.0)
                .collect()
        };
        Ok(json!({
            "total_requests": rows.len(),
            "total_input_tokens": sum(&|t| t.prompt),
            "total_output_tokens": sum(&|t| t.completion),
            "total_cache_tokens": sum(&|t| t.cache.unwrap_or(0)),
            "prompt_histogram": histogram(speeds(&|t| t.prompt_per_second)),
            "gen_histogram": histogram(speeds(&|t| t.tokens_per_second)),
        }))
    }
}

/// The labels of the keys the rows were made with, sorted, for the dashboard's key filter.
fn key_labels(rows: &[Row]) -> Vec<Arc<str>> {
    let labels: std::collections::BTreeSet<&Arc<str>> =
        rows.iter().filter_map(|r| r.key.as_ref()).collect();
    labels.into_iter().cloned().collect()
}

fn row_json(r: &Row) -> Value {
    let t = r.tokens.unwrap_or_default();
    let or_missing = |v: Option<u64>| v.map_or(-1, |v| v as i64);
    let rate = |v: Option<f64>| v.unwrap_or(-1.0);
    let mut v = json!({
        "id": r.id,
        "timestamp": crate::clock::rfc3339::format(r.time),
        "src": source::text(r.src),
        "model": &*r.model,
        "req_path": &*r.req_path,
        "resp_content_type": &*r.content_type,
        "resp_status_code": r.status,
        "tokens": {
            "input_tokens": t.prompt,
            "output_tokens": t.completion,
            "cache_tokens": or_missing(t.cache),
            "draft_tokens": or_missing(t.draft),
            "draft_acc_tokens": or_missing(t.draft_accepted),
            "prompt_per_second": rate(t.prompt_per_second),
            "tokens_per_second": rate(t.tokens_per_second),
        },
        "duration_ms": r.duration_ms,
        "has_capture": r.has_capture,
    });
    if let Some(e) = &r.error {
        v["error_msg"] = Value::String(e.clone());
    }
    // only where keys are configured: a keyless corral's rows stay as llama-swap's
    if let Some(key) = &r.key {
        v["key"] = Value::String(key.to_string());
    }
    v
}

/// Counts in 20 bins between the smallest and largest value, and the percentiles.
fn histogram(mut values: Vec<f64>) -> Value {
    const BINS: usize = 20;
    if values.is_empty() {
        return json!({"bins": [], "min": 0, "max": 0, "binSize": 0, "p50": 0, "p95": 0, "p99": 0});
    }
    values.sort_by(f64::total_cmp);
    let (min, max) = (values[0], values[values.len() - 1]);
    let size = ((max - min) / BINS as f64).max(f64::MIN_POSITIVE);
    let mut bins = vec![0u64; BINS];
    for v in &values {
        bins[(((v - min) / size) as usize).min(BINS - 1)] += 1;
    }
    let pct = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
    json!({"bins": bins, "min": min, "max": max, "binSize": size,
           "p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)})
}

#[cfg(test)]
mod tests;
