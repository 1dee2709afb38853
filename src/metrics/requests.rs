//! What each model request records: its count by status class, duration, time to first byte and
//! tokens. A request resolves its series once, from a cache: a label lookup hashes every label
//! value and takes the family's lock, and a request used to make five of them. Each thread keeps
//! the series it has used, so that the serving threads do not take turns on the shared cache's
//! lock for every request.

use foldhash::HashMap;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, Registry};

use super::{counter, histogram, registered, LATENCY_BUCKETS};

pub struct RequestMetrics {
    requests: IntCounterVec,
    pub unknown_model: IntCounter,
    duration: HistogramVec,
    time_to_first_byte: HistogramVec,
    prompt_tokens: IntCounterVec,
    completion_tokens: IntCounterVec,
    pub retries: IntCounterVec,
    /// The same counts by API key, written only for requests that presented one.
    key_requests: IntCounterVec,
    key_prompt_tokens: IntCounterVec,
    key_completion_tokens: IntCounterVec,
    /// Model, then route, then status class: bounded by the config's models, the routes corral
    /// serves and five classes.
    series: Mutex<SeriesCache>,
    /// Tells these metrics' series apart in the threads' own caches.
    id: u64,
}

type SeriesCache = HashMap<String, HashMap<String, ByClass>>;

thread_local! {
    /// The series this thread has used, by the id of the metrics they belong to.
    static USED: RefCell<HashMap<u64, SeriesCache>> = RefCell::default();
}

fn cached(
    cache: &SeriesCache,
    model: &str,
    route: &str,
    class: usize,
) -> Option<Arc<RequestSeries>> {
    cache.get(model)?.get(route)?[class].clone()
}

fn keep(cache: &mut SeriesCache, model: &str, route: &str, class: usize, s: &Arc<RequestSeries>) {
    let classes = cache
        .entry(model.to_string())
        .or_default()
        .entry(route.to_string())
        .or_default();
    classes[class] = Some(s.clone());
}

/// A route's series, one per status class once used.
type ByClass = [Option<Arc<RequestSeries>>; 5];

/// The series one model, route and status class write.
pub struct RequestSeries {
    pub answered: IntCounter,
    pub duration: Histogram,
    pub time_to_first_byte: Histogram,
    pub prompt_tokens: IntCounter,
    pub completion_tokens: IntCounter,
}

/// The series one key, model and status class write.
pub struct KeySeries {
    pub answered: IntCounter,
    pub prompt_tokens: IntCounter,
    pub completion_tokens: IntCounter,
}

/// The status classes, as labelled.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The status class label of a status.
pub fn status_class(status: http::StatusCode) -> &'static str {
    CLASSES[class_index(status)]
}

fn class_index(status: http::StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

impl RequestMetrics {
    #[rustfmt::skip]
    pub(super) fn new(r: &Registry) -> RequestMetrics {
        let unknown = IntCounter::new("corral_unknown_model_requests_total", "Requests naming no configured model (answered 404).").expect("valid");
        RequestMetrics {
            requests: counter(r, "corral_requests_total", "Requests answered, by model, route and status class.", &["model", "route", "status"]),
            unknown_model: registered(r, unknown),
            duration: histogram(r, "corral_request_duration_seconds", "Time from request to the last byte of the response.", &["model", "route"], LATENCY_BUCKETS),
            time_to_first_byte: histogram(r, "corral_time_to_first_byte_seconds", "Time from request to the first byte of the response body, waiting and loading included.", &["model", "route"], LATENCY_BUCKETS),
            prompt_tokens: counter(r, "corral_prompt_tokens_total", "Prompt tokens, from the responses' usage or timings.", &["model"]),
            completion_tokens: counter(r, "corral_completion_tokens_total", "Completion tokens, from the responses' usage or timings.", &["model"]),
            retries: counter(r, "corral_retries_total", "Requests retried on another replica after one could not be reached or answered 503.", &["model"]),
            key_requests: counter(r, "corral_key_requests_total", "Requests answered, by API key (its name or fingerprint), model and status class.", &["key", "model", "status"]),
            key_prompt_tokens: counter(r, "corral_key_prompt_tokens_total", "Prompt tokens, by API key and model.", &["key", "model"]),
            key_completion_tokens: counter(r, "corral_key_completion_tokens_total", "Completion tokens, by API key and model.", &["key", "model"]),
            series: Mutex::default(),
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
        }
    }

    /// The series of a request to `model` on `route` answered with a status of `class` ("2xx").
    pub fn series(&self, model: &str, route: &str, class: &str) -> Arc<RequestSeries> {
        let class = CLASSES.iter().position(|c| *c == class).unwrap_or(4);
        USED.with_borrow_mut(|used| {
            let used = used.entry(self.id).or_default();
            if let Some(s) = cached(used, model, route, class) {
                return s;
            }
            let s = self.shared_series(model, route, class);
            keep(used, model, route, class, &s);
            s
        })
    }

    /// The series from the cache all threads share, made on first use.
    fn shared_series(&self, model: &str, route: &str, class: usize) -> Arc<RequestSeries> {
        let mut cache = self.series.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cached(&cache, model, route, class) {
            return s;
        }
        let made = Arc::new(self.make(model, route, CLASSES[class]));
        keep(&mut cache, model, route, class, &made);
        made
    }

    /// The series of a request that presented the key labelled `key`. Not cached: only keyed
    /// requests pay for the lookup, and a key's label set is bounded by the configured keys.
    pub fn key_series(&self, key: &str, model: &str, class: &str) -> KeySeries {
        KeySeries {
            answered: self.key_requests.with_label_values(&[key, model, class]),
            prompt_tokens: self.key_prompt_tokens.with_label_values(&[key, model]),
            completion_tokens: self.key_completion_tokens.with_label_values(&[key, model]),
        }
    }

    fn make(&self, model: &str, route: &str, class: &str) -> RequestSeries {
        RequestSeries {
            answered: self.requests.with_label_values(&[model, route, class]),
            duration: self.duration.with_label_values(&[model, route]),
            time_to_first_byte: self.time_to_first_byte.with_label_values(&[model, route]),
            prompt_tokens: self.prompt_tokens.with_label_values(&[model]),
            completion_tokens: self.completion_tokens.with_label_values(&[model]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_series_writes_the_labelled_one() {
        let r = Registry::new();
        let m = RequestMetrics::new(&r);
        let ok = m.series("m", "/v1/chat/completions", "2xx");
        ok.answered.inc();
        m.series(
            "m",
            "/v1/chat/completions",
            status_class(http::StatusCode::CREATED),
        )
        .answered
        .inc();
        m.series(
            "m",
            "/v1/chat/completions",
            status_class(http::StatusCode::BAD_GATEWAY),
        )
        .answered
        .inc();
        assert!(Arc::ptr_eq(
            &ok,
            &m.series("m", "/v1/chat/completions", "2xx")
        ));
        let count = |class: &str| {
            m.requests
                .with_label_values(&["m", "/v1/chat/completions", class])
                .get()
        };
        assert_eq!((count("2xx"), count("5xx"), count("4xx")), (2, 1, 0));
    }

    /// Each thread keeps its own lookup of the one series: counts from every thread land in it,
    /// and other metrics' series (another registry) are not mistaken for these.
    #[test]
    fn threads_share_each_series_and_registries_stay_apart() {
        let (first, second) = (Registry::new(), Registry::new());
        let (a, b) = (RequestMetrics::new(&first), RequestMetrics::new(&second));
        let here = a.series("m", "/r", "2xx");
        let there = std::thread::scope(|s| s.spawn(|| a.series("m", "/r", "2xx")).join().unwrap());
        assert!(Arc::ptr_eq(&here, &there));
        assert!(!Arc::ptr_eq(&here, &b.series("m", "/r", "2xx")));
    }

    #[test]
    fn status_classes() {
        use http::StatusCode as S;
        let classes: Vec<_> = [
            S::CONTINUE,
            S::OK,
            S::FOUND,
            S::NOT_FOUND,
            S::SERVICE_UNAVAILABLE,
        ]
        .into_iter()
        .map(status_class)
        .collect();
        assert_eq!(classes, CLASSES);
        assert_eq!(status_class(S::from_u16(599).unwrap()), "5xx");
    }
}
