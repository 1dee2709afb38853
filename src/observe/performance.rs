//! `GET /api/performance`: the last hour, sampled every `performance.every` (5 s by default), in
//! memory. llama-swap's `sys_stats` (CPU per core, RAM, swap, load) and `gpu_stats` (nvidia-smi),
//! plus corral's own per-model series: requests per second, time to first token (median), output
//! tokens per second and queue depth. `performance.disabled` answers 503 `{"enabled":false}`.
//!
//! Requests add to a tally as they are logged (one short lock); a sampler task turns the tally into
//! a sample per tick, so serving the route costs a copy of the rings and nothing else. The tick
//! reads the config in force, so a reload that changes `performance` applies at the next tick.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use foldhash::HashMap;

use crate::observe::activity::tally::{Counts, Tally};
use serde_json::{json, Value};

use crate::fleet::Fleet;
use crate::observe::hardware;

/// How far back the rings reach.
const WINDOW: Duration = Duration::from_secs(3600);

/// One model's sample.
#[derive(Clone)]
struct ModelSample {
    at: SystemTime,
    requests: u64,
    per_second: f64,
    ttft_p50_ms: Option<u64>,
    tokens_per_second: f64,
    queue: usize,
    running: usize,
}

impl ModelSample {
    fn idle(&self) -> bool {
        self.requests == 0 && self.queue == 0 && self.running == 0
    }

    fn json(&self) -> Value {
        json!({
            "timestamp": crate::clock::rfc3339::format(self.at),
            "requests": self.requests,
            "requests_per_second": self.per_second,
            "ttft_p50_ms": self.ttft_p50_ms,
            "tokens_per_second": self.tokens_per_second,
            "queue_depth": self.queue,
            "running": self.running,
        })
    }
}

/// The rings: system samples, GPU samples (one per device per tick), and each model's samples.
#[derive(Default)]
struct Series {
    system: VecDeque<(SystemTime, Value)>,
    gpus: VecDeque<(SystemTime, Value)>,
    models: BTreeMap<String, VecDeque<ModelSample>>,
}

impl Series {
    fn trim(&mut self, now: SystemTime) {
        let old = |t: &SystemTime| now.duration_since(*t).is_ok_and(|age| age > WINDOW);
        while self.system.front().is_some_and(|(t, _)| old(t)) {
            self.system.pop_front();
        }
        while self.gpus.front().is_some_and(|(t, _)| old(t)) {
            self.gpus.pop_front();
        }
        for ring in self.models.values_mut() {
            while ring.front().is_some_and(|s| old(&s.at)) {
                ring.pop_front();
            }
        }
        // a model idle for the whole window has nothing to show
        self.models
            .retain(|_, ring| !ring.iter().all(ModelSample::idle));
    }
}

/// The sampler's rings, shared with the task that fills them; the task ends when this goes.
pub struct Performance {
    series: Arc<Mutex<Series>>,
    _stop: tokio_util::sync::DropGuard,
}

impl Performance {
    /// Starts the sampler on the current runtime.
    pub fn start(fleet: Fleet, tally: Arc<Tally>) -> Arc<Performance> {
        let series = Arc::new(Mutex::new(Series::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(sample_loop(series.clone(), fleet, tally, stop.clone()));
        Arc::new(Performance {
            series,
            _stop: stop.drop_guard(),
        })
    }

    pub(crate) fn json(&self, after: Option<SystemTime>, every: Duration) -> Value {
        let keep = |t: &SystemTime| after.is_none_or(|a| *t > a);
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let pick = |ring: &VecDeque<(SystemTime, Value)>| -> Vec<Value> {
            ring.iter()
                .filter(|(t, _)| keep(t))
                .map(|(_, v)| v.clone())
                .collect()
        };
        let models: serde_json::Map<String, Value> = series
            .models
            .iter()
            .map(|(id, ring)| {
                let samples = ring.iter().filter(|s| keep(&s.at)).map(ModelSample::json);
                (id.clone(), Value::Array(samples.collect()))
            })
            .collect();
        json!({
            "enabled": true,
            "every_seconds": every.as_secs_f64(),
            "sys_stats": pick(&series.system),
            "gpu_stats": pick(&series.gpus),
            "models": models,
        })
    }
}

/// Takes a sample at once, then every `performance.every`, until stopped.
async fn sample_loop(
    series: Arc<Mutex<Series>>,
    fleet: Fleet,
    tally: Arc<Tally>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut cpu = hardware::CpuTimes::read();
    let mut gpus = hardware::GpuReader::default();
    let mut last = Instant::now();
    loop {
        let config = fleet.config();
        let elapsed = last.elapsed().max(Duration::from_millis(1));
        last = Instant::now();
        let counts = tally.take();
        if !config.performance_disabled {
            let now = SystemTime::now();
            let system = hardware::system_sample(&mut cpu, now);
            let gpu = gpus.sample(now).await;
            let (loads, _) =
                crate::metrics::model_server::loads(&fleet.snapshot(), &fleet.queue_depths());
            let mut series = series.lock().unwrap_or_else(|e| e.into_inner());
            series.system.push_back((now, system));
            series.gpus.extend(gpu.into_iter().map(|g| (now, g)));
            add_models(&mut series, now, elapsed, counts, &loads);
            series.trim(now);
        }
        tokio::select! {
            _ = tokio::time::sleep(config.performance_every) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Appends a sample to each model that has a ring or something to show now.
fn add_models(
    series: &mut Series,
    now: SystemTime,
    elapsed: Duration,
    mut counts: HashMap<Arc<str>, Counts>,
    loads: &BTreeMap<String, crate::metrics::model_server::Load>,
) {
    let mut ids: Vec<String> = series.models.keys().cloned().collect();
    ids.extend(counts.keys().map(|k| k.to_string()));
    ids.extend(
        loads
            .iter()
            .filter(|(_, l)| l.waiting + l.running > 0)
            .map(|(k, _)| k.clone()),
    );
    ids.sort();
    ids.dedup();
    let secs = elapsed.as_secs_f64();
    for id in ids {
        let c = counts.remove(id.as_str()).unwrap_or_default();
        let load = loads.get(&id).copied().unwrap_or_default();
        let sample = ModelSample {
            at: now,
            requests: c.requests,
            per_second: c.requests as f64 / secs,
            ttft_p50_ms: median(c.ttft_ms),
            tokens_per_second: c.output_tokens as f64 / secs,
            queue: load.waiting,
            running: load.running,
        };
        series.models.entry(id).or_default().push_back(sample);
    }
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    Some(*v.select_nth_unstable(mid).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_get_a_ring_when_busy_and_lose_it_after_an_idle_window() {
        let mut s = Series::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut counts = HashMap::default();
        counts.insert(
            Arc::from("m"),
            Counts {
                requests: 10,
                output_tokens: 50,
                ttft_ms: vec![30, 10, 20],
            },
        );
        add_models(&mut s, t0, Duration::from_secs(5), counts, &BTreeMap::new());
        let first = &s.models["m"][0];
        assert_eq!((first.per_second, first.tokens_per_second), (2.0, 10.0));
        assert_eq!(first.ttft_p50_ms, Some(20));
        let later = t0 + Duration::from_secs(10);
        add_models(
            &mut s,
            later,
            Duration::from_secs(5),
            HashMap::default(),
            &BTreeMap::new(),
        );
        assert_eq!(s.models["m"].len(), 2, "an idle sample follows a busy one");
        s.trim(later + WINDOW);
        assert!(s.models.is_empty(), "nothing but idle samples left");
    }
}
