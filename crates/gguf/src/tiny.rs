//! Tiny random-weight `llama` models that a real llama-server can load.
//!
//! What llama.cpp needs (from `src/models/llama.cpp`, `llama-model.cpp`,
//! `llama-vocab.cpp`): the `llama.*` hyperparameters below with exact GGUF
//! types (u32 counts, f32 epsilon), an SPM (`"llama"`) vocabulary whose
//! 256 `<0xNN>` BYTE tokens let any text tokenize, BOS/EOS ids, and one
//! tensor per name the arch creates, no more (extra tensors fail the load).
//! Rank pooling on `llama` needs no classifier tensor: the score is the first
//! component of the last token's normalized hidden state, so a reranker only
//! adds a separator between query and document.
//!
//! The weights are random but steered (see `BIAS`) so that sampling only
//! picks printable ASCII tokens: replies are valid UTF-8 and run to
//! `max_tokens` (finish reason "length") rather than stopping at random.

use std::io;
use std::path::Path;

use crate::types::GgmlType;
use crate::value::Array;
use crate::writer::Writer;

/// Shape and flavour of a tiny model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyOptions {
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_head: u32,
    /// Fewer KV heads than heads exercises grouped-query attention.
    pub n_head_kv: u32,
    pub n_ff: u32,
    /// Written as `llama.context_length` (the training context).
    pub n_ctx: u32,
    pub seed: u64,
    /// F16 matrices (norms stay F32) instead of all F32.
    pub f16: bool,
    /// Default pooling MEAN, for `--embeddings` without `--pooling`.
    pub embedding: bool,
    /// Default pooling RANK and a separator token, for `--reranking`.
    pub reranker: bool,
    /// `general.name`.
    pub name: String,
}

impl Default for TinyOptions {
    fn default() -> Self {
        TinyOptions {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 128,
            n_ctx: 512,
            seed: 42,
            f16: false,
            embedding: false,
            reranker: false,
            name: "corral-tiny-llama".into(),
        }
    }
}

/// A ChatML template, so `/v1/chat/completions` renders prompts.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// llama_token_type values from llama.h / gguf-py.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// The tiny vocabulary: `<unk>`, `<s>`, `</s>`, ChatML markers, 256 byte
/// tokens, `▁` and printable ASCII; returns (tokens, token types).
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
    }
    tokens.push("\u{2581}".into());
    types.push(NORMAL);
    for c in 0x21u8..=0x7e {
        tokens.push((c as char).to_string());
        types.push(NORMAL);
    }
    (tokens, types)
}

/// Deterministic uniform numbers from a 64-bit LCG (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Top 24 bits to [-1, 1).
        ((self.0 >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// f32 to IEEE half bits, round to nearest even.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let round =
        |r: u32, rem: u32, half: u32| r + u32::from(rem > half || (rem == half && r & 1 == 1));
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        return sign | round(m >> shift, m & ((1 << shift) - 1), half) as u16;
    }
    // A carry out of the mantissa correctly bumps the exponent.
    sign | round(((e as u32) << 10) | (man >> 13), man & 0x1fff, 0x1000) as u16
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_owned())
}

/// Builds the tiny model in memory (use [`Writer::write_split`] for parts).
pub fn tiny_llama_writer(o: &TinyOptions) -> io::Result<Writer> {
    if o.n_layer == 0 || o.n_head == 0 || o.n_head_kv == 0 || o.n_embd == 0 || o.n_ff == 0 {
        return Err(invalid("tiny model sizes must be non-zero"));
    }
    if o.n_embd % o.n_head != 0 || o.n_head % o.n_head_kv != 0 || (o.n_embd / o.n_head) % 2 != 0 {
        return Err(invalid(
            "need n_embd = n_head * even head size and n_head a multiple of n_head_kv",
        ));
    }
    let (tokens, types) = tiny_vocab();
    let token_types = types.clone();
    let n_vocab = tokens.len() as u64;
    let head_dim = o.n_embd / o.n_head;
    let mut w = Writer::new();
    w.set("general.architecture", "llama")
        .set("general.name", o.name.as_str())
        .set("general.file_type", u32::from(o.f16))
        .set("llama.vocab_size", n_vocab as u32)
        .set("llama.context_length", o.n_ctx)
        .set("llama.embedding_length", o.n_embd)
        .set("llama.block_count", o.n_layer)
        .set("llama.feed_forward_length", o.n_ff)
        .set("llama.attention.head_count", o.n_head)
        .set("llama.attention.head_count_kv", o.n_head_kv)
        .set("llama.attention.layer_norm_rms_epsilon", 1e-5f32)
        .set("llama.rope.dimension_count", head_dim)
        .set("llama.rope.freq_base", 10000.0f32);
    if o.reranker {
        w.set("llama.pooling_type", 4u32);
    } else if o.embedding {
        w.set("llama.pooling_type", 1u32);
    }
    w.set("tokenizer.ggml.model", "llama")
        .set("tokenizer.ggml.scores", Array::F32(vec![0.0; tokens.len()]))
        .set("tokenizer.ggml.token_type", Array::I32(token_types))
        .set("tokenizer.ggml.tokens", Array::String(tokens))
        .set("tokenizer.ggml.bos_token_id", 1u32)
        .set("tokenizer.ggml.eos_token_id", 2u32)
        .set("tokenizer.ggml.unknown_token_id", 0u32)
        .set("tokenizer.ggml.add_bos_token", true)
        .set("tokenizer.ggml.add_eos_token", false);
    if o.reranker {
        // Rerank prompts become <s> query </s> document.
        w.set("tokenizer.ggml.seperator_token_id", 2u32)
            .set("tokenizer.ggml.add_sep_token", true);
    }
    w.set("tokenizer.chat_template", CHATML_TEMPLATE);

    let (e, ff, kv) = (
        u64::from(o.n_embd),
        u64::from(o.n_ff),
        u64::from(o.n_head_kv * head_dim),
    );
    let mut rng = Lcg(o.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut random = |n_in: u64, n_out: u64| {
        let scale = (3.0 / n_in as f32).sqrt();
        (0..n_in * n_out)
            .map(|_| rng.next_f32() * scale)
            .collect::<Vec<f32>>()
    };
    let ones = |n: u64| {
        (0..n)
            .flat_map(|_| 1.0f32.to_le_bytes())
            .collect::<Vec<u8>>()
    };

    // Every token embedding carries a large constant in the last dimension,
    // which survives the random layers; output rows of control and byte
    // tokens weigh it strongly negative, so sampling only ever picks
    // printable ASCII: replies are valid UTF-8 and never stop early.
    let bias_dim = (e - 1) as usize;
    let mut embd = random(e, n_vocab);
    let mut out = random(e, n_vocab);
    for (t, ty) in types.iter().enumerate() {
        embd[t * e as usize + bias_dim] = BIAS;
        out[t * e as usize + bias_dim] = if *ty == NORMAL { 0.0 } else { -2.0 * BIAS };
    }

    matrix(&mut w, o.f16, "token_embd.weight".into(), e, n_vocab, embd);
    for i in 0..o.n_layer {
        w.add_tensor(
            format!("blk.{i}.attn_norm.weight"),
            &[e],
            GgmlType::F32,
            ones(e),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.attn_q.weight"),
            e,
            e,
            random(e, e),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.attn_k.weight"),
            e,
            kv,
            random(e, kv),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.attn_v.weight"),
            e,
            kv,
            random(e, kv),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.attn_output.weight"),
            e,
            e,
            random(e, e),
        );
        w.add_tensor(
            format!("blk.{i}.ffn_norm.weight"),
            &[e],
            GgmlType::F32,
            ones(e),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.ffn_gate.weight"),
            e,
            ff,
            random(e, ff),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.ffn_up.weight"),
            e,
            ff,
            random(e, ff),
        );
        matrix(
            &mut w,
            o.f16,
            format!("blk.{i}.ffn_down.weight"),
            ff,
            e,
            random(ff, e),
        );
    }
    w.add_tensor("output_norm.weight", &[e], GgmlType::F32, ones(e));
    matrix(&mut w, o.f16, "output.weight".into(), e, n_vocab, out);
    Ok(w)
}

/// Size of the constant component that steers sampling to NORMAL tokens.
const BIAS: f32 = 8.0;

/// Adds a 2-D weight, `n_in` values per row, as F16 or F32.
fn matrix(w: &mut Writer, f16: bool, name: String, n_in: u64, n_out: u64, vals: Vec<f32>) {
    let (ty, data): (GgmlType, Vec<u8>) = if f16 {
        let bytes = vals.iter().flat_map(|&v| f32_to_f16_bits(v).to_le_bytes());
        (GgmlType::F16, bytes.collect())
    } else {
        (
            GgmlType::F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    };
    w.add_tensor(name, &[n_in, n_out], ty, data);
}

/// Writes a tiny random-weight `llama` model to `path` (about 450 KB in
/// F32 with the defaults).
pub fn write_tiny_llama(path: impl AsRef<Path>, opts: &TinyOptions) -> io::Result<()> {
    tiny_llama_writer(opts)?.write_file(path)
}
