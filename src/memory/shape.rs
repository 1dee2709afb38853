//! What a GGUF header says about a model's shape, read without touching tensor data.

use std::path::Path;

use gguf::{Header, Model};

/// llama.cpp's `LLAMA_MAX_LAYERS`; also bounds the work a hostile header can cause.
const MAX_LAYERS: u64 = 512;

/// Reads the headers of a GGUF file (`what` names it in errors: model, mmproj).
pub(super) fn read(path: &Path, what: &str) -> Result<Model, String> {
    if !path.exists() {
        return Err(format!("{what} file not found: {}", path.display()));
    }
    gguf::read_model(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

/// The two sizes every part of the estimate needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// Repeating layers (`block_count`).
    pub n_layer: u64,
    pub n_embd: u64,
}

impl Shape {
    /// Reads `block_count` and `embedding_length`, which must be there and above zero.
    pub(super) fn of(h: &Header, path: &Path) -> Result<Shape, String> {
        let arch = h
            .architecture()
            .ok_or_else(|| format!("{}: no general.architecture", path.display()))?;
        let need = |k: &str| {
            h.arch_u64(k)
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{}: missing or zero {arch}.{k}", path.display()))
        };
        let n_layer = need("block_count")?;
        if n_layer > MAX_LAYERS {
            return Err(format!(
                "{}: block_count {n_layer} exceeds llama.cpp's limit of {MAX_LAYERS}",
                path.display()
            ));
        }
        let n_embd = need("embedding_length")?;
        Ok(Shape { n_layer, n_embd })
    }
}

/// `<arch>.<key>` per layer: a scalar repeated, or an array (missing entries 0).
pub(super) fn per_layer(h: &Header, key: &str, n: u64) -> Option<Vec<u64>> {
    let v = h.arch_get(key)?;
    if let Some(x) = v.as_u64() {
        return Some(vec![x; n as usize]);
    }
    let arr = v.as_array()?;
    Some(
        (0..n as usize)
            .map(|i| arr.get(i).and_then(|x| x.as_u64()).unwrap_or(0))
            .collect(),
    )
}

/// Largest value of a possibly per-layer key.
pub(super) fn max_of(h: &Header, key: &str, n: u64) -> u64 {
    per_layer(h, key, n)
        .and_then(|v| v.into_iter().max())
        .unwrap_or(0)
}
