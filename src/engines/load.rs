//! Where an engine's live load comes from, and the parsers for it.
//!
//! Most engines publish Prometheus gauges of requests running and waiting:
//! - llama.cpp (`--metrics`): `llamacpp:requests_processing`, `llamacpp:requests_deferred`; its
//!   `/slots` also lists every slot, which gives the capacity and, by `is_processing`, the load;
//! - vLLM: `vllm:num_requests_running`, `vllm:num_requests_waiting`;
//! - TGI: `tgi_batch_current_size` (running), `tgi_queue_size` (waiting);
//! - SGLang (`--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs`;
//! - TEI: `te_batch_current_size` (running), `te_queue_size` (waiting).
//!
//! A gauge published as several series (per engine, per data-parallel rank) is summed.
//!
//! Ollama publishes no request counts. Its `/api/ps` lists the models loaded in memory, and corral
//! reads each as one running request: a loaded model is one that is serving or was lately (Ollama
//! keeps it for its keep-alive), which is the best sign of use it gives. Waiting is always 0.
//! A custom engine publishes nothing corral can read.

use serde_json::Value;

use super::EngineKind;

/// Requests an engine is running and holding in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    pub running: u64,
    pub waiting: u64,
}

/// How a load body reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFormat {
    /// Prometheus text; the gauges named are summed over their series.
    Prometheus {
        running: &'static str,
        waiting: &'static str,
    },
    /// Ollama's `/api/ps` JSON: each loaded model counts as one running request.
    OllamaPs,
    /// Nothing to read.
    None,
}

/// Where an engine kind's load and capacity come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    /// The path read for the load (GET); `None` when the engine publishes none.
    pub path: Option<&'static str>,
    pub format: LoadFormat,
    /// A path listing the engine's slots (llama.cpp's `/slots`), which gives its capacity; the
    /// other engines' capacity is what they were started with (`slots`).
    pub capacity_path: Option<&'static str>,
}

pub(super) fn report_of(kind: EngineKind) -> LoadReport {
    let (path, format) = match (kind, prometheus_gauges(kind)) {
        (_, Some((running, waiting))) => (
            Some("/metrics"),
            LoadFormat::Prometheus { running, waiting },
        ),
        (EngineKind::Ollama, None) => (Some("/api/ps"), LoadFormat::OllamaPs),
        (_, None) => (None, LoadFormat::None),
    };
    let capacity_path = (kind == EngineKind::LlamaCpp).then_some("/slots");
    LoadReport {
        path,
        format,
        capacity_path,
    }
}

/// The gauges of running and waiting requests in the kind's `/metrics`; `None` for a kind that
/// publishes none there.
fn prometheus_gauges(kind: EngineKind) -> Option<(&'static str, &'static str)> {
    Some(match kind {
        EngineKind::LlamaCpp => ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
        EngineKind::Vllm => ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        EngineKind::Tgi => ("tgi_batch_current_size", "tgi_queue_size"),
        EngineKind::Sglang => ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        EngineKind::Tei => ("te_batch_current_size", "te_queue_size"),
        EngineKind::Ollama | EngineKind::Custom => return None,
    })
}

/// Reads the load from a body of the kind's load path. For llama.cpp, a `/slots` body (a JSON
/// array) is read too: its processing slots are running, nothing is waiting. `None` when the body
/// does not carry the running figure (metrics off, another server, an error page).
pub fn read_load(kind: EngineKind, body: &str) -> Option<Load> {
    if kind == EngineKind::LlamaCpp && body.trim_start().starts_with('[') {
        let (_, processing) = read_slots(body)?;
        return Some(Load {
            running: processing,
            waiting: 0,
        });
    }
    match kind.load_report().format {
        LoadFormat::Prometheus { running, waiting } => Some(Load {
            running: gauge_sum(body, running)?,
            waiting: gauge_sum(body, waiting).unwrap_or(0),
        }),
        LoadFormat::OllamaPs => {
            let v: Value = serde_json::from_str(body).ok()?;
            let models = v.get("models")?.as_array()?;
            Some(Load {
                running: models.len() as u64,
                waiting: 0,
            })
        }
        LoadFormat::None => None,
    }
}

/// How many sequences the engine serves at once, from its capacity path (llama.cpp's `/slots`).
pub fn read_capacity(kind: EngineKind, body: &str) -> Option<u64> {
    match kind {
        EngineKind::LlamaCpp => read_slots(body).map(|(total, _)| total),
        _ => None,
    }
}

/// `/slots`: (slots, slots processing).
fn read_slots(body: &str) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let slots = v.as_array()?;
    let busy = slots
        .iter()
        .filter(|s| s.get("is_processing").and_then(Value::as_bool) == Some(true))
        .count();
    Some((slots.len() as u64, busy as u64))
}

/// The sum of every series of gauge `name`, rounded; negative and NaN values count as 0. `None`
/// when no series has that exact name.
fn gauge_sum(body: &str, name: &str) -> Option<u64> {
    let mut found = false;
    let mut sum = 0.0f64;
    for v in body.lines().filter_map(|line| sample_of(line, name)) {
        found = true;
        if v.is_finite() && v > 0.0 {
            sum += v;
        }
    }
    found.then(|| sum.round() as u64)
}

/// The value of a line that is a sample of gauge `name` (with labels or without); `None` for any
/// other line.
fn sample_of(line: &str, name: &str) -> Option<f64> {
    let rest = line.trim_start().strip_prefix(name)?;
    let value_part = match rest.as_bytes().first() {
        Some(b'{') => &rest[rest.rfind('}')? + 1..],
        Some(b' ' | b'\t') => rest,
        _ => return None, // a longer name sharing the prefix, or no value
    };
    value_part.split_whitespace().next()?.parse::<f64>().ok()
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
