//! GPU memory one llama-server needs, from its argv and the GGUF headers
//! (tensor data is never read), following llama.cpp build 11434:
//!
//! - Placement (`src/llama-model.cpp`, `load_tensors`): `-ngl N` puts the
//!   LAST N layers on the GPU, the output head counting as layer `n_layer`
//!   (so `-ngl 1` offloads only the head and `-ngl n_layer` leaves layer 0 on
//!   the CPU). Input embeddings always stay on the CPU; with tied embeddings
//!   (no `output.weight`) `token_embd` is copied to the GPU as the head.
//! - Context (`src/llama-context.cpp`, `tools/server/server.cpp`): `-c` is the
//!   TOTAL context of all `-np` slots, padded to 256. Without `--kv-unified`
//!   each slot has its own stream of `pad256(n_ctx / np)` cells; with it one
//!   stream of `n_ctx` cells is shared. `-np` unset means 4 slots AND a
//!   unified cache; `-c` unset or 0 means the training context.
//! - KV (`src/llama-kv-cache.cpp`): per layer and cell, K holds
//!   `head_dim_k * n_head_kv` and V `head_dim_v * n_head_kv` elements of the
//!   cache type, on the layer's device (MLA models cache no V).
//! - Compute: see [`compute_bytes`](super::compute::compute_bytes).

use std::path::Path;

use gguf::{GgmlType, Model};

use super::compute::compute_buffer;
use super::kv::{cache_type, context, kv_on_gpu};
use super::llama_args::{LlamaArgs, NglSetting};
use super::shape::{read, Shape};

/// Estimated GPU memory of one llama-server, in bytes, with what it assumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Weights placed on the GPU.
    pub weights_bytes: u64,
    /// KV cache on the GPU (all of it with full offload).
    pub kv_bytes: u64,
    /// Compute-graph allowance (see [`compute_bytes`](super::compute::compute_bytes)).
    pub compute_bytes: u64,
    /// Tensors of the `--mmproj` file (all on the GPU).
    pub mmproj_bytes: u64,
    pub total_bytes: u64,
    /// Host memory it holds beside: the weights left on the CPU (the input embeddings always)
    /// and the KV cache of layers not offloaded, or all of it with `-nkvo`.
    pub host_bytes: u64,
    /// All weights in the model files, wherever they end up.
    pub file_weights_bytes: u64,
    /// Repeating layers (`block_count`).
    pub layers: u64,
    /// Repeating layers on the GPU (the output head is not counted).
    pub gpu_layers: u64,
    /// Total context after llama.cpp's padding.
    pub ctx: u64,
    /// Slots (`-np`, 4 when auto).
    pub parallel: u64,
    pub notes: Vec<String>,
}

/// Estimates the GPU memory of a llama-server started with `args`.
pub fn estimate_llama(args: &LlamaArgs) -> Result<Estimate, String> {
    let path = model_path(args)?;
    let model = read(path, "model")?;
    let h = &model.header;
    let shape = Shape::of(h, path)?;
    let types = cache_types(args)?;
    let mut notes = Vec::new();
    let placement = Placement::new(args, shape.n_layer, &mut notes);
    let (weights, cpu_weights) = split_weights(&model, placement, &mut notes);
    let cells = context(args, h, &mut notes).map_err(|e| format!("{}: {e}", path.display()))?;
    let on_gpu = |il| placement.on_gpu(il);
    let (kv, kv_all) = kv_on_gpu(args, h, shape, types, cells, on_gpu, &mut notes);
    let compute = compute_buffer(args, &model, shape, cells, types.1, &mut notes)?;
    let mmproj = mmproj_bytes(args, &mut notes)?;
    notes.push(
        "not included: the GPU runtime's own context (CUDA: ~0.3-0.5 GiB per process)".into(),
    );
    Ok(Estimate {
        file_weights_bytes: model.tensor_bytes(),
        layers: shape.n_layer,
        gpu_layers: placement.gpu_layers(),
        ctx: cells.n_ctx,
        parallel: cells.parallel,
        host_bytes: cpu_weights.saturating_add(kv_all - kv),
        ..Estimate::of_gpu_parts(weights, kv, compute, mmproj, notes)
    })
}

/// `-m`, which an estimate cannot go without.
fn model_path(args: &LlamaArgs) -> Result<&Path, &'static str> {
    args.model
        .as_deref()
        .ok_or("the llama-server command has no -m/--model; cannot estimate its memory")
}

/// `-ctk` and `-ctv`, or why llama-server would refuse either.
fn cache_types(args: &LlamaArgs) -> Result<(GgmlType, GgmlType), String> {
    Ok((
        cache_type(args.cache_type_k.as_deref(), "-ctk")?,
        cache_type(args.cache_type_v.as_deref(), "-ctv")?,
    ))
}

impl Estimate {
    /// The GPU's parts and their total, with the notes; the model's layers and context (zero
    /// here) are the caller's to give.
    fn of_gpu_parts(weights: u64, kv: u64, compute: u64, mmproj: u64, notes: Vec<String>) -> Self {
        Estimate {
            weights_bytes: weights,
            kv_bytes: kv,
            compute_bytes: compute,
            mmproj_bytes: mmproj,
            total_bytes: weights
                .saturating_add(kv)
                .saturating_add(compute)
                .saturating_add(mmproj),
            host_bytes: 0,
            file_weights_bytes: 0,
            layers: 0,
            gpu_layers: 0,
            ctx: 0,
            parallel: 0,
            notes,
        }
    }
}

/// Which layers `-ngl` puts on the GPU: `first_gpu..=n_layer`, where layer `n_layer` is the
/// output head.
#[derive(Debug, Clone, Copy)]
struct Placement {
    n_layer: u64,
    first_gpu: u64,
}

impl Placement {
    fn new(args: &LlamaArgs, n_layer: u64, notes: &mut Vec<String>) -> Placement {
        let ngl = match args.ngl {
            None | Some(NglSetting::Auto) => {
                notes.push("-ngl auto (the default) counted as all layers on the GPU; llama.cpp's --fit may offload fewer or shrink an unset -c to fit free memory".into());
                n_layer + 1
            }
            Some(NglSetting::All) => n_layer + 1,
            Some(NglSetting::Layers(n)) => n.min(n_layer + 1),
        };
        let placement = Placement {
            n_layer,
            first_gpu: n_layer + 1 - ngl,
        };
        let gpu_layers = placement.gpu_layers();
        if ngl == 0 {
            notes.push("-ngl 0: weights and KV stay on the CPU (a CUDA build still offloads big batches, so compute is kept)".into());
        } else if ngl <= n_layer {
            notes.push(format!("-ngl {ngl} of {}: the output head and the last {gpu_layers} of {n_layer} layers on the GPU (llama.cpp offloads from the end)", n_layer + 1));
        }
        placement
    }

    fn on_gpu(self, il: u64) -> bool {
        il >= self.first_gpu
    }

    /// Repeating layers on the GPU (the output head is not counted).
    fn gpu_layers(self) -> u64 {
        self.n_layer - self.first_gpu.min(self.n_layer)
    }
}

/// Bytes of the tensors placed on the GPU and of those left on the CPU; with tied embeddings (no
/// `output.weight`) the embedding is copied to the GPU too as the output head.
fn split_weights(model: &Model, placement: Placement, notes: &mut Vec<String>) -> (u64, u64) {
    let n_layer = placement.n_layer;
    let (mut weights, mut cpu): (u64, u64) = (0, 0);
    for t in &model.tensors {
        let gpu = match layer_of(&t.name) {
            Some(il) => placement.on_gpu(il),
            None => !is_input(&t.name) && placement.on_gpu(n_layer),
        };
        match gpu {
            true => weights = weights.saturating_add(t.n_bytes),
            false => cpu = cpu.saturating_add(t.n_bytes),
        }
    }
    let find = |name: &str| model.tensors.iter().find(|t| t.name == name);
    if placement.on_gpu(n_layer) && find("output.weight").is_none() {
        if let Some(t) = find("token_embd.weight") {
            weights = weights.saturating_add(t.n_bytes);
            notes.push(
                "tied embeddings: token_embd is also copied to the GPU as the output head".into(),
            );
        }
    }
    (weights, cpu)
}

/// The repeating layer a tensor belongs to (`blk.<n>.…`).
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Tensors of llama.cpp's input layer (`LLM_TENSOR_LAYER_INPUT`): always CPU.
fn is_input(name: &str) -> bool {
    [
        "token_embd.",
        "position_embd.",
        "token_types.",
        "per_layer_token_embd.",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Weights of the `--mmproj` file, all on the GPU; its own compute buffer is not estimated.
fn mmproj_bytes(args: &LlamaArgs, notes: &mut Vec<String>) -> Result<u64, String> {
    match &args.mmproj {
        Some(p) => {
            notes.push(
                "mmproj: weights only, its image-encoder compute buffer is not included".into(),
            );
            Ok(read(p, "mmproj")?.tensor_bytes())
        }
        None => Ok(0),
    }
}

#[cfg(test)]
#[path = "estimate_tests.rs"]
mod tests;
