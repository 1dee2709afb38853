//! Context and KV cache: how many cells llama-server allocates for `-c`/`-np`/`-kvu`, and the
//! bytes they take per layer and cache type.

use gguf::{GgmlType, Header};

use super::llama_args::LlamaArgs;
use super::shape::{per_layer, Shape};

/// Slots when `-np` is unset ("auto": 4 slots sharing one unified KV cache).
pub const AUTO_PARALLEL: u64 = 4;
/// llama.cpp pads the total and per-slot context to a multiple of this.
const CTX_PAD: u64 = 256;
/// llama.cpp's `LLAMA_MAX_SEQ`; also bounds the work a hostile header can cause.
const MAX_SEQ: u64 = 256;
/// The `-ctk`/`-ctv` types llama-server accepts.
pub const CACHE_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

/// The cells of the context, as llama-server 11434 sizes them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cells {
    /// Total cells after padding.
    pub n_ctx: u64,
    /// Cells one slot's attention sees (its stream, or the unified cache).
    pub n_kv: u64,
    /// Slots (`-np`, 4 when auto).
    pub parallel: u64,
}

/// Bytes per `n` elements of a cache type (a whole number of blocks).
fn cache_row_bytes(ty: GgmlType, n: u64) -> u64 {
    n.div_ceil(ty.block_size()).saturating_mul(ty.type_size())
}

/// A `-ctk`/`-ctv` value (f16 when unset), or why llama-server would refuse it.
pub(super) fn cache_type(name: Option<&str>, flag: &str) -> Result<GgmlType, String> {
    let name = name.unwrap_or("f16");
    let known = CACHE_TYPES.iter().any(|t| t.eq_ignore_ascii_case(name));
    GgmlType::ALL
        .iter()
        .copied()
        .find(|t| known && t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            format!(
                "{flag} {name}: unknown KV cache type (known: {})",
                CACHE_TYPES.join(", ")
            )
        })
}

/// Rounds up to llama.cpp's context padding.
fn pad(n: u64) -> u64 {
    n.next_multiple_of(CTX_PAD)
}

/// The cells from `-c`/`-np`/`-kvu` as llama-server 11434 sizes them (see
/// the estimator's module docs).
pub(super) fn context(
    args: &LlamaArgs,
    h: &Header,
    notes: &mut Vec<String>,
) -> Result<Cells, String> {
    let ctx_req = requested_context(args, h, notes)?;
    let parallel = slots(args)?;
    if args.kv_unified.unwrap_or(args.parallel.is_none()) {
        return Ok(unified(ctx_req, parallel, notes));
    }
    per_slot(ctx_req, parallel, notes)
}

/// `-c`, else the model's training context (noted); more than llama.cpp allows is refused.
fn requested_context(args: &LlamaArgs, h: &Header, notes: &mut Vec<String>) -> Result<u64, String> {
    let ctx_req = match args.ctx.filter(|&c| c > 0) {
        Some(c) => c,
        None => {
            let c = h
                .arch_u64("context_length")
                .filter(|&c| c > 0)
                .ok_or("the model has no context_length; give -c")?;
            notes.push(format!("-c unset or 0: the model's training context {c}"));
            c
        }
    };
    if ctx_req > u64::from(u32::MAX) {
        return Err(format!("-c {ctx_req} is larger than llama.cpp allows"));
    }
    Ok(ctx_req)
}

/// `-np` (4 when auto), within llama.cpp's limit of slots.
fn slots(args: &LlamaArgs) -> Result<u64, String> {
    let parallel = args.parallel.filter(|&n| n > 0).unwrap_or(AUTO_PARALLEL);
    if parallel > MAX_SEQ {
        return Err(format!(
            "-np {parallel} exceeds llama.cpp's limit of {MAX_SEQ} slots"
        ));
    }
    Ok(parallel)
}

/// One stream of cells that every slot shares.
fn unified(ctx_req: u64, parallel: u64, notes: &mut Vec<String>) -> Cells {
    let n_ctx = pad(ctx_req);
    notes.push(format!(
        "KV cache: {n_ctx} cells unified, shared by {parallel} slot(s)"
    ));
    Cells {
        n_ctx,
        n_kv: n_ctx,
        parallel,
    }
}

/// A stream of its own for each slot: `-c` is the total, split among them.
fn per_slot(ctx_req: u64, parallel: u64, notes: &mut Vec<String>) -> Result<Cells, String> {
    let seq = pad(pad(ctx_req) / parallel);
    if seq == 0 {
        return Err(format!("-c {ctx_req} is too small for {parallel} slots"));
    }
    notes.push(format!(
        "KV cache: -c is the total, {parallel} slot(s) of {seq} cells each"
    ));
    Ok(Cells {
        n_ctx: seq * parallel,
        n_kv: seq,
        parallel,
    })
}

/// KV bytes of the layers `keep` selects, and of all layers, for `cells`.
fn kv_cache(
    h: &Header,
    n_layer: u64,
    n_embd: u64,
    (type_k, type_v): (GgmlType, GgmlType),
    cells: u64,
    keep: impl Fn(u64) -> bool,
) -> (u64, u64) {
    let heads = KvHeads::of(h, n_layer, n_embd);
    let (mut kept, mut all) = (0, 0);
    for il in 0..n_layer {
        let bytes = heads.cell_bytes(il, (type_k, type_v)).saturating_mul(cells);
        all = bytes.saturating_add(all);
        kept = if keep(il) {
            bytes.saturating_add(kept)
        } else {
            kept
        };
    }
    (kept, all)
}

/// What one layer's KV cache holds per cell: its KV heads, and the width of each head's K and V.
struct KvHeads {
    n_head_kv: Vec<u64>,
    dim_k: u64,
    dim_v: u64,
    /// MLA caches the compressed latent as K only.
    mla: bool,
}

impl KvHeads {
    fn of(h: &Header, n_layer: u64, n_embd: u64) -> KvHeads {
        let n_head = per_layer(h, "attention.head_count", n_layer).unwrap_or_default();
        let n_head_kv =
            per_layer(h, "attention.head_count_kv", n_layer).unwrap_or_else(|| n_head.clone());
        let head0 = n_head.iter().copied().find(|&n| n > 0);
        let dim_k = h
            .arch_u64("attention.key_length")
            .or(head0.map(|n| n_embd / n))
            .unwrap_or(0);
        KvHeads {
            n_head_kv,
            dim_k,
            dim_v: h.arch_u64("attention.value_length").unwrap_or(dim_k),
            mla: h.arch_get("attention.key_length_mla").is_some(),
        }
    }

    /// Bytes of K and V one cell of layer `il` takes.
    fn cell_bytes(&self, il: u64, (type_k, type_v): (GgmlType, GgmlType)) -> u64 {
        let hkv = self.n_head_kv.get(il as usize).copied().unwrap_or(0);
        let k = cache_row_bytes(type_k, self.dim_k.saturating_mul(hkv));
        let v = if self.mla {
            0
        } else {
            cache_row_bytes(type_v, self.dim_v.saturating_mul(hkv))
        };
        k.saturating_add(v)
    }
}

/// The KV bytes on the GPU (those of the layers `on_gpu` selects, none with `-nkvo`) and in all;
/// with notes on what stays in host memory and what the estimate cannot see.
pub(super) fn kv_on_gpu(
    args: &LlamaArgs,
    h: &Header,
    shape: Shape,
    (type_k, type_v): (GgmlType, GgmlType),
    cells: Cells,
    on_gpu: impl Fn(u64) -> bool,
    notes: &mut Vec<String>,
) -> (u64, u64) {
    let (kv, kv_all) = kv_cache(
        h,
        shape.n_layer,
        shape.n_embd,
        (type_k, type_v),
        cells.n_ctx,
        |il| on_gpu(il) && !args.no_kv_offload,
    );
    note_kv(h, (type_k, type_v), kv, kv_all, notes);
    (kv, kv_all)
}

/// What stays in host memory, what the estimate cannot see, and the cache types when not f16.
fn note_kv(
    h: &Header,
    (type_k, type_v): (GgmlType, GgmlType),
    kv: u64,
    kv_all: u64,
    notes: &mut Vec<String>,
) {
    if kv_all == 0 {
        notes.push("no attention KV heads found: recurrent state is not estimated".into());
    } else if kv < kv_all {
        notes.push(format!(
            "{} of KV cache stays in host memory",
            super::format_bytes(kv_all - kv)
        ));
    }
    if h.arch_get("attention.sliding_window").is_some() {
        notes.push("sliding-window attention: its layers cache less, KV is an upper bound".into());
    }
    if type_k != GgmlType::F16 || type_v != GgmlType::F16 {
        notes.push(format!("KV cache types K {type_k}, V {type_v}"));
    }
}
