//! What an instance needs in device and host memory, worked out from its config and its weights
//! on disk.

use std::path::Path;

use crate::config::{InstanceSpec, ModelConfig};
use crate::memory;

/// What an instance needs, worked out once from the config.
#[derive(Debug, Clone, Default)]
pub struct Need {
    /// Device memory to charge (an estimate until the engine reports its allocations).
    pub bytes: u64,
    /// Bytes of weights to read at load, for the load deadline.
    pub weights: u64,
    /// Host memory it holds while it runs, beside its device charge (`memory.host`, else what
    /// the GGUF estimate leaves on the CPU).
    pub host: u64,
    /// Where the figure comes from, for logs and `corral check`.
    pub source: String,
}

/// Works out an instance's need: `memory.bytes`, else parameters × quantization, else the GGUF
/// estimate of a llama-server command line; its host part from `memory.host`, else the estimate.
pub fn need_of(model: &ModelConfig, spec: &InstanceSpec) -> Need {
    let need = device_need(model, spec);
    match model.memory.host {
        Some(host) => Need { host, ..need },
        None => need,
    }
}

/// An instance's need on its devices, with the host part the GGUF estimate finds.
fn device_need(model: &ModelConfig, spec: &InstanceSpec) -> Need {
    let args = memory::parse_llama_args(&spec.argv);
    let weights = args.model.as_deref().map(weights_on_disk).unwrap_or(0)
        + args.mmproj.as_deref().map(weights_on_disk).unwrap_or(0);
    let from_params = || {
        let quant = model.memory.quant.clone().unwrap_or_else(|| "fp16".into());
        model
            .memory
            .params
            .and_then(|p| memory::estimate_params(p, &quant, model.memory.kv_bytes).ok())
    };
    let given = |bytes, weights, source: &str| Need {
        bytes,
        weights,
        host: 0,
        source: source.into(),
    };
    if let Some(bytes) = model.memory.bytes {
        let weights = weights.max(from_params().unwrap_or(0));
        return given(bytes, weights, "memory.bytes");
    }
    if let Some(bytes) = from_params() {
        return given(bytes, weights.max(bytes), "memory.params");
    }
    if args.model.is_none() {
        return given(0, weights, "unknown (no -m and no memory key)");
    }
    match memory::estimate_llama(&args) {
        Ok(e) => Need {
            bytes: e.total_bytes,
            weights: weights.max(e.file_weights_bytes),
            host: e.host_bytes,
            source: "GGUF estimate".into(),
        },
        Err(e) => given(0, weights, &format!("no estimate: {e}")),
    }
}

/// The size of a model file, with every part of a split GGUF.
fn weights_on_disk(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    match gguf::parse_split_name(path) {
        Some((prefix, _, count)) => (1..=count)
            .map(|n| size(&gguf::split_path(&prefix, n, count)))
            .sum(),
        None => size(path),
    }
}
