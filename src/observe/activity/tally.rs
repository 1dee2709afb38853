//! Per-model counts of finished requests since the performance sampler last took them: the
//! activity log counts each row as it is recorded, and the sampler turns the counts into rates.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};

/// First-byte times kept per model between two samples (the median needs no more).
const TTFT_KEEP: usize = 4096;

/// Per-model counts since the last sample.
#[derive(Default)]
pub struct Tally {
    counts: Mutex<HashMap<Arc<str>, Counts>>,
}

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) requests: u64,
    pub(crate) output_tokens: u64,
    pub(crate) ttft_ms: Vec<u64>,
}

impl Tally {
    /// Adds a finished request.
    pub fn count(&self, row: &super::Row) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry(row.model.clone()).or_default();
        c.requests += 1;
        c.output_tokens += row.tokens.map_or(0, |t| t.completion);
        if let Some(ms) = row.ttft_ms.filter(|_| c.ttft_ms.len() < TTFT_KEEP) {
            c.ttft_ms.push(ms);
        }
    }

    pub(crate) fn take(&self) -> HashMap<Arc<str>, Counts> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
