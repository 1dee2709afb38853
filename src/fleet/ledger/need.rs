//! What an instance needs in device memory, worked out from its config and its weights on disk.

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
    /// Where the figure comes from, for logs and `corral check`.
    pub source: String,
}

/// Works out an instance's need: `memory.bytes`, else parameters × quantization, else the GGUF
/// estimate of a llama-server command line.
pub fn need_of(model: &ModelConfig, spec: &InstanceSpec) -> Need {
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
    if let Some(bytes) = model.memory.bytes {
        return Need {
            bytes,
            weights: weights.max(from_params().unwrap_or(0)),
            source: "memory.bytes".into(),
        };
    }
    if let Some(bytes) = from_params() {
        return Need {
            bytes,
            weights: weights.max(bytes),
            source: "memory.params".into(),
        };
    }
    if args.model.is_some() {
        match memory::estimate_llama(&args) {
            Ok(e) => {
                return Need {
                    bytes: e.total_bytes,
                    weights: weights.max(e.file_weights_bytes),
                    source: "GGUF estimate".into(),
                }
            }
            Err(e) => {
                return Need {
                    bytes: 0,
                    weights,
                    source: format!("no estimate: {e}"),
                }
            }
        }
    }
    Need {
        bytes: 0,
        weights,
        source: "unknown (no -m and no memory key)".into(),
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
