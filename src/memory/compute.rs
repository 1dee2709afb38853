//! The compute buffer: the scratch memory llama-server's graph needs to evaluate one batch.

use gguf::{GgmlType, Header, Model};

use super::kv::Cells;
use super::llama_args::LlamaArgs;
use super::shape::{max_of, Shape};

/// llama-server's default physical batch (`-ub`), which sizes the compute graph.
pub const DEFAULT_UBATCH: u64 = 512;

/// The compute-buffer allowance, calibrated against llama-server 11434's
/// reported `compute buffer size` (CPU backend, tiny llama models from
/// E=256 to 2048, F=512 to 5632): the graph allocator's peak is one layer's
/// activations for `T = min(ubatch, n_ctx)` tokens, either in attention
/// (`~7*E` f32 per token) or the FFN (gate, up and their product `3*F`, plus
/// `~5*E` of residuals and norms), plus the attention mask (`n_kv * T` f16,
/// f32 without flash attention) that lives through the graph. Without flash
/// attention the scores `n_kv * T * n_head` f32 are materialized too. This
/// build computes logits only for one output per slot (`n_outputs_max`), so
/// the vocabulary adds just `np * n_vocab` f32. Matched the FFN-dominated
/// shapes of real models within 0.1%, overshoots up to ~33% when F <= E.
#[allow(clippy::too_many_arguments)]
pub fn compute_bytes(
    n_embd: u64,
    n_ff: u64,
    n_head: u64,
    n_vocab: u64,
    n_kv: u64,
    ubatch: u64,
    outputs: u64,
    flash_attn: bool,
) -> u64 {
    // Saturating: the shapes come from untrusted headers.
    let mul = |xs: &[u64]| xs.iter().fold(1u64, |a, &x| a.saturating_mul(x));
    let t = ubatch;
    let mask = mul(&[n_kv, t, if flash_attn { 2 } else { 4 }]);
    let scores = if flash_attn {
        0
    } else {
        mul(&[n_kv, t, n_head, 4])
    };
    let attn = mul(&[t, 4, 7, n_embd]).saturating_add(scores);
    let ffn = mul(&[t, 4, mul(&[3, n_ff]).saturating_add(mul(&[5, n_embd]))]);
    attn.max(ffn)
        .saturating_add(mask)
        .saturating_add(mul(&[outputs, n_vocab, 4]))
}

/// The compute buffer for this model and command line. A quantized V cache without flash
/// attention is refused, as llama-server refuses it.
pub(super) fn compute_buffer(
    args: &LlamaArgs,
    model: &Model,
    shape: Shape,
    cells: Cells,
    type_v: GgmlType,
    notes: &mut Vec<String>,
) -> Result<u64, String> {
    let h = &model.header;
    let flash_attn = flash_attention(args);
    let compute = compute_bytes(
        shape.n_embd,
        ffn_width(h, shape),
        max_of(h, "attention.head_count", shape.n_layer),
        vocabulary(model),
        cells.n_kv,
        ubatch(args, cells),
        cells.parallel,
        flash_attn,
    );
    check_attention(flash_attn, type_v, notes)?;
    Ok(compute)
}

/// The widest feed-forward a token runs through: the dense one, or for MoE the
/// `expert_used_count` experts it runs (plus shared ones).
fn ffn_width(h: &Header, shape: Shape) -> u64 {
    let n_ff = max_of(h, "feed_forward_length", shape.n_layer);
    let moe = (h.arch_u64("expert_used_count").unwrap_or(0))
        .saturating_mul(h.arch_u64("expert_feed_forward_length").unwrap_or(0))
        .saturating_add(h.arch_u64("expert_shared_feed_forward_length").unwrap_or(0));
    n_ff.max(moe)
}

/// Tokens per graph evaluation: `-ub` (512 unset), at most the context.
fn ubatch(args: &LlamaArgs, cells: Cells) -> u64 {
    args.ubatch
        .filter(|&u| u > 0)
        .unwrap_or(DEFAULT_UBATCH)
        .min(cells.n_ctx)
}

/// Refuses a quantized V cache without flash attention, as llama-server does, and notes what
/// turning flash attention off costs.
fn check_attention(
    flash_attn: bool,
    type_v: GgmlType,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    if !flash_attn && type_v.block_size() > 1 {
        return Err(format!(
            "-ctv {type_v} (a quantized V cache) needs flash attention; llama-server refuses it with -fa off"
        ));
    }
    if !flash_attn {
        notes.push(
            "-fa off: attention scores are materialized, compute grows with the context".into(),
        );
    }
    Ok(())
}

/// `-fa`: on unless turned off (`auto` counts as on).
fn flash_attention(args: &LlamaArgs) -> bool {
    !matches!(
        args.flash_attn
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("off" | "0" | "false" | "disabled")
    )
}

/// Tokens in the vocabulary: the embedding's rows, else `vocab_size`.
fn vocabulary(model: &Model) -> u64 {
    model
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .or_else(|| model.header.arch_u64("vocab_size"))
        .unwrap_or(0)
}
