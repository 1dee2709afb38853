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
//! - Compute: see [`compute_bytes`].

use std::path::{Path, PathBuf};

use gguf::{GgmlType, Header, Model};

/// llama-server's default physical batch (`-ub`), which sizes the compute graph.
pub const DEFAULT_UBATCH: u64 = 512;
/// Slots when `-np` is unset ("auto": 4 slots sharing one unified KV cache).
pub const AUTO_PARALLEL: u64 = 4;
/// llama.cpp pads the total and per-slot context to a multiple of this.
const CTX_PAD: u64 = 256;
/// llama.cpp's `LLAMA_MAX_LAYERS` and `LLAMA_MAX_SEQ`; also bound the work a
/// hostile header can cause.
const MAX_LAYERS: u64 = 512;
const MAX_SEQ: u64 = 256;
/// The `-ctk`/`-ctv` types llama-server accepts.
pub const CACHE_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

/// `-ngl`: a layer count, `auto` (the default: fit to free memory) or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NglSetting {
    Auto,
    All,
    Layers(u64),
}

/// The memory-relevant flags of a llama-server command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LlamaArgs {
    pub model: Option<PathBuf>,
    pub mmproj: Option<PathBuf>,
    /// `-c`; `Some(0)` means the model's training context, like unset.
    pub ctx: Option<u64>,
    /// `-np`; `None` is llama-server's "auto" (4 slots, unified KV).
    pub parallel: Option<u64>,
    pub ngl: Option<NglSetting>,
    pub cache_type_k: Option<String>,
    pub cache_type_v: Option<String>,
    /// `-ub`: tokens per graph evaluation; the compute buffer scales with it.
    pub ubatch: Option<u64>,
    /// `-fa on|off|auto`; only `off` changes the estimate (attention scores
    /// are then materialized: much larger compute buffer).
    pub flash_attn: Option<String>,
    /// `-kvu` / `-no-kvu`.
    pub kv_unified: Option<bool>,
    /// `-nkvo`: the KV cache stays in host memory.
    pub no_kv_offload: bool,
}

/// Parses the flags of [`LlamaArgs`] from a llama-server argv (with or
/// without the program name), as `-f V`, `--flag V` or `--flag=V`. Other
/// flags are skipped; values that do not parse count as absent (llama-server
/// itself will reject them).
pub fn parse_llama_args(argv: &[String]) -> LlamaArgs {
    let mut a = LlamaArgs::default();
    let mut i = 0;
    while i < argv.len() {
        let (flag, inline) = match argv[i].split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (argv[i].as_str(), None),
        };
        i += 1;
        match flag {
            "-kvu" | "--kv-unified" => a.kv_unified = Some(true),
            "-no-kvu" | "--no-kv-unified" => a.kv_unified = Some(false),
            "-nkvo" | "--no-kv-offload" => a.no_kv_offload = true,
            _ => {}
        }
        if !takes_value(flag) {
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None if i < argv.len() => {
                i += 1;
                argv[i - 1].clone()
            }
            None => break,
        };
        let num = value.trim().parse::<i64>().ok();
        match flag {
            "-m" | "--model" => a.model = Some(PathBuf::from(value)),
            "-mm" | "--mmproj" => a.mmproj = Some(PathBuf::from(value)),
            "-c" | "--ctx-size" => a.ctx = num.and_then(|n| u64::try_from(n).ok()),
            "-np" | "--parallel" => a.parallel = num.and_then(|n| u64::try_from(n).ok()),
            "-ub" | "--ubatch-size" => a.ubatch = num.and_then(|n| u64::try_from(n).ok()),
            "-ctk" | "--cache-type-k" => a.cache_type_k = Some(value),
            "-ctv" | "--cache-type-v" => a.cache_type_v = Some(value),
            "-fa" | "--flash-attn" => a.flash_attn = Some(value),
            _ => {
                a.ngl = match (value.as_str(), num) {
                    ("auto", _) | (_, Some(-1)) => Some(NglSetting::Auto),
                    ("all", _) => Some(NglSetting::All),
                    (_, Some(n)) if n <= -2 => Some(NglSetting::All),
                    (_, Some(n)) => Some(NglSetting::Layers(n as u64)),
                    _ => None,
                }
            }
        }
    }
    a
}

/// Whether `flag` is one of ours that takes a value.
pub(crate) fn takes_value(flag: &str) -> bool {
    matches!(
        flag,
        "-m" | "--model"
            | "-mm"
            | "--mmproj"
            | "-c"
            | "--ctx-size"
            | "-np"
            | "--parallel"
            | "-ngl"
            | "--gpu-layers"
            | "--n-gpu-layers"
            | "-ctk"
            | "--cache-type-k"
            | "-ctv"
            | "--cache-type-v"
            | "-ub"
            | "--ubatch-size"
            | "-fa"
            | "--flash-attn"
    )
}

/// Estimated GPU memory of one llama-server, in bytes, with what it assumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Weights placed on the GPU.
    pub weights_bytes: u64,
    /// KV cache on the GPU (all of it with full offload).
    pub kv_bytes: u64,
    /// Compute-graph allowance (see [`compute_bytes`]).
    pub compute_bytes: u64,
    /// Tensors of the `--mmproj` file (all on the GPU).
    pub mmproj_bytes: u64,
    pub total_bytes: u64,
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

fn read(path: &Path, what: &str) -> Result<Model, String> {
    if !path.exists() {
        return Err(format!("{what} file not found: {}", path.display()));
    }
    gguf::read_model(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

/// Bytes per `n` elements of a cache type (a whole number of blocks).
fn cache_row_bytes(ty: GgmlType, n: u64) -> u64 {
    n.div_ceil(ty.block_size()).saturating_mul(ty.type_size())
}

fn cache_type(name: Option<&str>, flag: &str) -> Result<GgmlType, String> {
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

/// `<arch>.<key>` per layer: a scalar repeated, or an array (missing entries 0).
fn per_layer(h: &Header, key: &str, n: u64) -> Option<Vec<u64>> {
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
fn max_of(h: &Header, key: &str, n: u64) -> u64 {
    per_layer(h, key, n)
        .and_then(|v| v.into_iter().max())
        .unwrap_or(0)
}

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

fn pad(n: u64) -> u64 {
    n.next_multiple_of(CTX_PAD)
}

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

/// (total cells, cells per stream, slots) from `-c`/`-np`/`-kvu` as
/// llama-server 11434 sizes them (see the module docs).
fn context(
    args: &LlamaArgs,
    h: &Header,
    notes: &mut Vec<String>,
) -> Result<(u64, u64, u64), String> {
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
    let parallel = args.parallel.filter(|&n| n > 0).unwrap_or(AUTO_PARALLEL);
    if parallel > MAX_SEQ {
        return Err(format!(
            "-np {parallel} exceeds llama.cpp's limit of {MAX_SEQ} slots"
        ));
    }
    if args.kv_unified.unwrap_or(args.parallel.is_none()) {
        let n_ctx = pad(ctx_req);
        notes.push(format!(
            "KV cache: {n_ctx} cells unified, shared by {parallel} slot(s)"
        ));
        return Ok((n_ctx, n_ctx, parallel));
    }
    let seq = pad(pad(ctx_req) / parallel);
    if seq == 0 {
        return Err(format!("-c {ctx_req} is too small for {parallel} slots"));
    }
    notes.push(format!(
        "KV cache: -c is the total, {parallel} slot(s) of {seq} cells each"
    ));
    Ok((seq * parallel, seq, parallel))
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
    let n_head = per_layer(h, "attention.head_count", n_layer).unwrap_or_default();
    let n_head_kv =
        per_layer(h, "attention.head_count_kv", n_layer).unwrap_or_else(|| n_head.clone());
    let head0 = n_head.iter().copied().find(|&n| n > 0);
    let dim_k = h
        .arch_u64("attention.key_length")
        .or(head0.map(|n| n_embd / n))
        .unwrap_or(0);
    let dim_v = h.arch_u64("attention.value_length").unwrap_or(dim_k);
    // MLA caches the compressed latent as K only.
    let mla = h.arch_get("attention.key_length_mla").is_some();
    let (mut kept, mut all) = (0, 0);
    for il in 0..n_layer {
        let hkv = n_head_kv.get(il as usize).copied().unwrap_or(0);
        let k = cache_row_bytes(type_k, dim_k.saturating_mul(hkv));
        let v = if mla {
            0
        } else {
            cache_row_bytes(type_v, dim_v.saturating_mul(hkv))
        };
        let bytes = k.saturating_add(v).saturating_mul(cells);
        all = bytes.saturating_add(all);
        kept = if keep(il) {
            bytes.saturating_add(kept)
        } else {
            kept
        };
    }
    (kept, all)
}

/// Estimates the GPU memory of a llama-server started with `args`.
pub fn estimate_llama(args: &LlamaArgs) -> Result<Estimate, String> {
    let path = args
        .model
        .as_deref()
        .ok_or("the llama-server command has no -m/--model; cannot estimate its memory")?;
    let model = read(path, "model")?;
    let h = &model.header;
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
    let (type_k, type_v) = (
        cache_type(args.cache_type_k.as_deref(), "-ctk")?,
        cache_type(args.cache_type_v.as_deref(), "-ctv")?,
    );
    let mut notes = Vec::new();

    // Placement: layers first_gpu..=n_layer (n_layer = the head) on the GPU.
    let ngl = match args.ngl {
        None | Some(NglSetting::Auto) => {
            notes.push("-ngl auto (the default) counted as all layers on the GPU; llama.cpp's --fit may offload fewer or shrink an unset -c to fit free memory".into());
            n_layer + 1
        }
        Some(NglSetting::All) => n_layer + 1,
        Some(NglSetting::Layers(n)) => n.min(n_layer + 1),
    };
    let first_gpu = n_layer + 1 - ngl;
    let on_gpu = |il: u64| il >= first_gpu;
    let gpu_layers = n_layer - first_gpu.min(n_layer);
    if ngl == 0 {
        notes.push("-ngl 0: weights and KV stay on the CPU (a CUDA build still offloads big batches, so compute is kept)".into());
    } else if ngl <= n_layer {
        notes.push(format!("-ngl {ngl} of {}: the output head and the last {gpu_layers} of {n_layer} layers on the GPU (llama.cpp offloads from the end)", n_layer + 1));
    }

    let mut weights: u64 = 0;
    for t in &model.tensors {
        let gpu = match layer_of(&t.name) {
            Some(il) => on_gpu(il),
            None => !is_input(&t.name) && on_gpu(n_layer),
        };
        weights = weights.saturating_add(if gpu { t.n_bytes } else { 0 });
    }
    let find = |name: &str| model.tensors.iter().find(|t| t.name == name);
    if on_gpu(n_layer) && find("output.weight").is_none() {
        if let Some(t) = find("token_embd.weight") {
            weights = weights.saturating_add(t.n_bytes);
            notes.push(
                "tied embeddings: token_embd is also copied to the GPU as the output head".into(),
            );
        }
    }

    let (n_ctx, n_kv, parallel) =
        context(args, h, &mut notes).map_err(|e| format!("{}: {e}", path.display()))?;
    let (kv, kv_all) = kv_cache(h, n_layer, n_embd, (type_k, type_v), n_ctx, |il| {
        on_gpu(il) && !args.no_kv_offload
    });
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

    // Compute buffer.
    let n_ff = max_of(h, "feed_forward_length", n_layer);
    // MoE: each token runs `expert_used_count` experts (plus shared ones).
    let moe = (h.arch_u64("expert_used_count").unwrap_or(0))
        .saturating_mul(h.arch_u64("expert_feed_forward_length").unwrap_or(0))
        .saturating_add(h.arch_u64("expert_shared_feed_forward_length").unwrap_or(0));
    let n_vocab = find("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .or_else(|| h.arch_u64("vocab_size"))
        .unwrap_or(0);
    let flash_attn = !matches!(
        args.flash_attn
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("off" | "0" | "false" | "disabled")
    );
    let ubatch = args
        .ubatch
        .filter(|&u| u > 0)
        .unwrap_or(DEFAULT_UBATCH)
        .min(n_ctx);
    let compute = compute_bytes(
        n_embd,
        n_ff.max(moe),
        max_of(h, "attention.head_count", n_layer),
        n_vocab,
        n_kv,
        ubatch,
        parallel,
        flash_attn,
    );
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

    let mmproj = match &args.mmproj {
        Some(p) => {
            notes.push(
                "mmproj: weights only, its image-encoder compute buffer is not included".into(),
            );
            read(p, "mmproj")?.tensor_bytes()
        }
        None => 0,
    };
    notes.push(
        "not included: the GPU runtime's own context (CUDA: ~0.3-0.5 GiB per process)".into(),
    );
    Ok(Estimate {
        weights_bytes: weights,
        kv_bytes: kv,
        compute_bytes: compute,
        mmproj_bytes: mmproj,
        total_bytes: weights
            .saturating_add(kv)
            .saturating_add(compute)
            .saturating_add(mmproj),
        file_weights_bytes: model.tensor_bytes(),
        layers: n_layer,
        gpu_layers,
        ctx: n_ctx,
        parallel,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::{Array, Writer};

    const E: u64 = 256;
    const VOCAB: u64 = 1000;
    /// Sizes of the synthetic model's tensors (see `synth`).
    const EMBD: u64 = E * VOCAB * 2;
    const LAYER: u64 = E * E * 2 + E / 32 * 34 * 512;
    const HEAD: u64 = E * 4 + E / 32 * 34 * VOCAB;

    /// A 4-layer `llama` header (8 heads, 2 KV heads of 32) with zero tensors.
    fn synth(tied: bool, meta: &[(&str, gguf::Value)]) -> Writer {
        let mut w = Writer::new();
        w.set("general.architecture", "llama")
            .set("llama.block_count", 4u32)
            .set("llama.embedding_length", E as u32)
            .set("llama.feed_forward_length", 512u32)
            .set("llama.attention.head_count", 8u32)
            .set("llama.attention.head_count_kv", 2u32)
            .set("llama.context_length", 4096u32);
        for (k, v) in meta {
            w.set(*k, v.clone());
        }
        w.add_zero_tensor("token_embd.weight", &[E, VOCAB], GgmlType::F16);
        for i in 0..4 {
            w.add_zero_tensor(format!("blk.{i}.attn_q.weight"), &[E, E], GgmlType::F16);
            w.add_zero_tensor(format!("blk.{i}.ffn_up.weight"), &[E, 512], GgmlType::Q8_0);
        }
        w.add_zero_tensor("output_norm.weight", &[E], GgmlType::F32);
        if !tied {
            w.add_zero_tensor("output.weight", &[E, VOCAB], GgmlType::Q8_0);
        }
        w
    }

    fn write(dir: &Path, w: &Writer) -> PathBuf {
        let p = dir.join("m.gguf");
        w.write_file(&p).unwrap();
        p
    }

    fn est(model: &Path, flags: &str) -> Result<Estimate, String> {
        let mut argv: Vec<String> = vec!["-m".into(), model.display().to_string()];
        argv.extend(flags.split_whitespace().map(String::from));
        estimate_llama(&parse_llama_args(&argv))
    }

    #[test]
    fn kv_bytes_follow_llama_cpp_context_rules() {
        let dir = tempfile::tempdir().unwrap();
        let m = write(dir.path(), &synth(false, &[]));
        // 4 layers x (K 32*2 + V 32*2) f16 = 1 KiB per cell.
        let per_cell = 4 * 128 * 2;
        for (flags, ctx, slots) in [
            ("-c 1000 -np 2", 1024, 2), // padded to 256, 512 per slot
            ("-c 1024 -np 3", 1536, 3), // 341 per slot padded to 512
            ("-c 1024", 1024, 4),       // -np auto: 4 slots, unified
            ("-c 1024 -np 3 -kvu", 1024, 3),
            ("-c 0 -np 1", 4096, 1), // the training context
            ("-np 2", 4096, 2),
        ] {
            let e = est(&m, flags).unwrap();
            assert_eq!((e.ctx, e.parallel), (ctx, slots), "{flags}");
            assert_eq!(e.kv_bytes, per_cell * ctx, "{flags}");
        }
        let e = est(&m, "-c 4096 -ctk q8_0 -ctv=q4_0").unwrap();
        assert_eq!(e.kv_bytes, 4 * (2 * 34 + 2 * 18) * 4096);
        let e = est(&m, "-c 4096 --cache-type-k F32").unwrap();
        assert_eq!(e.kv_bytes, 4 * (64 * 4 + 64 * 2) * 4096);
        let err = est(&m, "-ctk q3_k").unwrap_err();
        assert!(err.contains("q3_k") && err.contains("q8_0"), "{err}");
        assert!(est(&m, "-np 300").unwrap_err().contains("256"));
        assert!(est(&m, "-c 99999999999").is_err());
        // Hostile shapes: errors or saturated sizes, never a panic or a huge allocation.
        let huge = [("llama.attention.key_length", u64::MAX.into())];
        let e = est(&write(dir.path(), &synth(false, &huge)), "-c 256 -np 1").unwrap();
        assert_eq!((e.kv_bytes, e.total_bytes), (u64::MAX, u64::MAX));
        let layers = [("llama.block_count", (1u64 << 40).into())];
        let err = est(&write(dir.path(), &synth(false, &layers)), "").unwrap_err();
        assert!(err.contains("block_count"), "{err}");
    }

    #[test]
    fn kv_head_dims_per_layer_arrays_and_mla() {
        let dir = tempfile::tempdir().unwrap();
        let kv = (
            "llama.attention.head_count_kv",
            Array::U32(vec![2, 0, 4, 1]).into(),
        );
        let m = write(dir.path(), &synth(false, &[kv]));
        assert_eq!(
            est(&m, "-c 256").unwrap().kv_bytes,
            (2 + 4 + 1) * 64 * 2 * 256
        );
        let dims = [
            ("llama.attention.key_length", 128u32.into()),
            ("llama.attention.value_length", 64u32.into()),
        ];
        let m = write(dir.path(), &synth(false, &dims));
        assert_eq!(
            est(&m, "-c 256").unwrap().kv_bytes,
            4 * 2 * (128 + 64) * 2 * 256
        );
        let mla = ("llama.attention.key_length_mla", 192u32.into());
        let m = write(dir.path(), &synth(false, &[dims[0].clone(), mla]));
        assert_eq!(est(&m, "-c 256").unwrap().kv_bytes, 4 * 2 * 128 * 2 * 256);
    }

    #[test]
    fn ngl_offloads_the_last_layers_and_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let m = write(dir.path(), &synth(false, &[]));
        let all = 4 * LAYER + HEAD;
        for (ngl, weights, layers) in [
            ("", all, 4),
            ("-ngl auto", all, 4),
            ("--n-gpu-layers=all", all, 4),
            ("-ngl 99", all, 4),
            ("-ngl 5", all, 4),
            ("-ngl 4", HEAD + 3 * LAYER, 3), // layer 0 stays on the CPU
            ("--gpu-layers 3", HEAD + 2 * LAYER, 2),
            ("-ngl 1", HEAD, 0),
            ("-ngl 0", 0, 0),
        ] {
            let e = est(&m, &format!("-c 256 -np 1 {ngl}")).unwrap();
            assert_eq!((e.weights_bytes, e.gpu_layers), (weights, layers), "{ngl}");
            assert_eq!(
                e.kv_bytes,
                layers * 256 * 256,
                "{ngl}: KV follows the layers"
            );
            assert_eq!(e.file_weights_bytes, EMBD + all);
            assert_eq!(e.layers, 4);
            let sum = e.weights_bytes + e.kv_bytes + e.compute_bytes + e.mmproj_bytes;
            assert_eq!(e.total_bytes, sum);
        }
        assert_eq!(est(&m, "-c 256 -nkvo").unwrap().kv_bytes, 0);
        let auto = est(&m, "").unwrap();
        assert!(
            auto.notes.iter().any(|n| n.contains("-ngl auto")),
            "{:?}",
            auto.notes
        );
        // Tied embeddings: the head is a GPU copy of token_embd.
        let m = write(dir.path(), &synth(true, &[]));
        assert_eq!(est(&m, "").unwrap().weights_bytes, 4 * LAYER + E * 4 + EMBD);
        assert_eq!(est(&m, "-ngl 0").unwrap().weights_bytes, 0);
    }

    #[test]
    fn split_files_mmproj_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let w = synth(false, &[]);
        let single = est(&write(dir.path(), &w), "-c 512").unwrap();
        let parts = w.write_split(dir.path().join("s"), 3).unwrap();
        let split = est(&parts[0], "-c 512").unwrap();
        assert_eq!(split, single);
        std::fs::remove_file(&parts[2]).unwrap();
        let err = est(&parts[0], "").unwrap_err();
        assert!(err.contains("s-00003-of-00003.gguf"), "{err}");

        let missing = dir.path().join("nope.gguf");
        let err = est(&missing, "").unwrap_err();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let err = estimate_llama(&LlamaArgs::default()).unwrap_err();
        assert!(err.contains("-m"), "{err}");
        std::fs::write(dir.path().join("junk.gguf"), b"not a model").unwrap();
        let err = est(&dir.path().join("junk.gguf"), "").unwrap_err();
        assert!(err.contains("junk.gguf") && err.contains("GGUF"), "{err}");

        let mut proj = Writer::new();
        proj.set("general.architecture", "clip");
        proj.add_zero_tensor("v.patch_embd.weight", &[64, 1000], GgmlType::F16);
        let pp = dir.path().join("proj.gguf");
        proj.write_file(&pp).unwrap();
        let m = dir.path().join("m.gguf");
        let flags = format!("-c 512 --mmproj {}", pp.display());
        let e = est(&m, &flags).unwrap();
        assert_eq!(e.mmproj_bytes, 128_000);
        assert_eq!(e.total_bytes, single.total_bytes + 128_000);
        let err = est(&m, &format!("-mm {}", missing.display())).unwrap_err();
        assert!(err.contains("mmproj") && err.contains("nope.gguf"), "{err}");
    }

    #[test]
    fn compute_grows_with_ubatch_and_without_flash_attention() {
        let dir = tempfile::tempdir().unwrap();
        let m = write(dir.path(), &synth(false, &[]));
        let base = est(&m, "-c 4096 -np 1").unwrap().compute_bytes;
        // FFN-bound: 512 tokens x (3*512 + 5*256) f32 + f16 mask + 1 logit row.
        assert_eq!(
            base,
            512 * 4 * (3 * 512 + 5 * 256) + 4096 * 512 * 2 + VOCAB * 4
        );
        assert!(est(&m, "-c 4096 -np 1 -ub 256").unwrap().compute_bytes < base);
        assert!(est(&m, "-c 4096 -np 1 -fa off").unwrap().compute_bytes > 4 * base);
        assert_eq!(est(&m, "-c 4096 -np 1 -fa on").unwrap().compute_bytes, base);
        let err = est(&m, "-fa off -ctv q8_0").unwrap_err();
        assert!(err.contains("flash attention"), "{err}");
        assert!(est(&m, "-fa off -ctk q8_0").is_ok());
    }

    #[test]
    fn parses_llama_server_argv() {
        let argv: Vec<String> = "llama-server --model=/m/a.gguf -mm p.gguf -c 8192 -np 4 -ngl 33 -ctk q8_0 --cache-type-v=q4_0 -ub 1024 -fa off -kvu -nkvo --port 8080 -t 4"
            .split_whitespace().map(String::from).collect();
        let a = parse_llama_args(&argv);
        assert_eq!(a.model, Some(PathBuf::from("/m/a.gguf")));
        assert_eq!(a.mmproj, Some(PathBuf::from("p.gguf")));
        assert_eq!(
            (a.ctx, a.parallel, a.ubatch),
            (Some(8192), Some(4), Some(1024))
        );
        assert_eq!(a.ngl, Some(NglSetting::Layers(33)));
        assert_eq!(
            (a.cache_type_k.as_deref(), a.cache_type_v.as_deref()),
            (Some("q8_0"), Some("q4_0"))
        );
        assert_eq!(
            (a.flash_attn.as_deref(), a.kv_unified, a.no_kv_offload),
            (Some("off"), Some(true), true)
        );
        let ngl = |v: &str| parse_llama_args(&["-ngl".into(), v.into()]).ngl;
        assert_eq!(ngl("auto"), Some(NglSetting::Auto));
        assert_eq!(ngl("-1"), Some(NglSetting::Auto));
        assert_eq!(ngl("all"), Some(NglSetting::All));
        assert_eq!(ngl("-2"), Some(NglSetting::All));
        assert_eq!(ngl("0"), Some(NglSetting::Layers(0)));
        assert_eq!(ngl("lots"), None);
        let a = parse_llama_args(&["-np".into(), "-1".into(), "-c".into()]);
        assert_eq!((a.parallel, a.ctx), (None, None));
    }
}
