//! Model metadata corral fills in without being told: the context one request can use, the
//! modalities a model takes, whether its chat template handles tools, and its size, from the
//! command line, the GGUF header and the running engine's `/props`.
//!
//! The rules are pure functions over [`Facts`]; `gather.rs` collects the facts (the GGUF read once
//! per file, `/props` once per engine process). What the config says always wins: the derived
//! values only fill fields a model's entry does not already carry (from `capabilities` or
//! `metadata`), and `capabilities.disableAuto` turns the filling off.

mod gather;
#[cfg(test)]
mod tests;

use serde_json::{json, Map, Value};

use crate::config::ModelConfig;
use crate::memory::parse_llama_args;

pub(crate) use gather::base_of;
pub use gather::{facts_for, learn_running, read_headers};

/// How the engine is told to size its context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Launch {
    /// The whole context (`-c`); `None` or 0 means the model's training context.
    pub ctx: Option<u64>,
    /// Parallel sequences (`-np`); `None` is llama-server's own choice, which shares one KV buffer.
    pub slots: Option<u64>,
    /// `--kv-unified`: every sequence may use the whole context.
    pub unified: bool,
}

impl Launch {
    /// An engine model's `ctx` (per slot) and `slots`.
    pub fn engine(ctx_per_slot: Option<u64>, slots: Option<usize>) -> Launch {
        let slots = slots.map(|s| s as u64);
        Launch {
            ctx: ctx_per_slot.map(|c| c.saturating_mul(slots.unwrap_or(1))),
            slots,
            unified: false,
        }
    }

    /// The `-c`, `-np` and `--kv-unified` of a llama-server command line.
    pub fn from_argv(argv: &[String]) -> Launch {
        let a = parse_llama_args(argv);
        Launch {
            ctx: a.ctx,
            slots: a.parallel,
            unified: a.kv_unified == Some(true),
        }
    }
}

/// What a model's GGUF header says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GgufFacts {
    /// `<arch>.context_length`: the context the model was trained with.
    pub n_ctx_train: Option<u64>,
    pub n_params: u64,
    /// Bytes of weights.
    pub size: u64,
    /// A vision or audio encoder in the file itself (`clip.has_vision_encoder`, ...).
    pub vision: bool,
    pub audio: bool,
    /// `tokenizer.chat_template` renders tools.
    pub tools: bool,
}

/// A multimodal projector (`--mmproj`): what it encodes. An unreadable one counts as vision,
/// which is what nearly every projector is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Projector {
    pub vision: bool,
    pub audio: bool,
}

/// Everything known about one model, before the rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub launch: Launch,
    pub gguf: Option<GgufFacts>,
    pub projector: Option<Projector>,
    /// The per-request context a running engine reports in `/props`.
    pub running_ctx: Option<u64>,
}

/// What the rules make of the facts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    pub context_length: Option<u64>,
    pub input: Vec<&'static str>,
    pub tools: bool,
    pub n_ctx_train: Option<u64>,
    pub n_params: Option<u64>,
    pub size: Option<u64>,
}

/// The context one request can use: the engine's own answer once it runs, else the context it is
/// told divided among its slots (the whole of it when the KV cache is unified or there is one
/// slot), with the training context where no `-c` is given.
pub fn request_context(facts: &Facts) -> Option<u64> {
    if let Some(n) = facts.running_ctx.filter(|n| *n > 0) {
        return Some(n);
    }
    let train = facts.gguf.as_ref().and_then(|g| g.n_ctx_train);
    let whole = facts.launch.ctx.filter(|c| *c > 0).or(train)?;
    Some(match facts.launch.slots {
        Some(n) if n > 1 && !facts.launch.unified => whole / n,
        _ => whole,
    })
}

/// The input modalities: text, with image and audio where a projector or the file encodes them.
pub fn input_modalities(facts: &Facts) -> Vec<&'static str> {
    let gguf = facts.gguf.as_ref();
    let vision = facts.projector.is_some_and(|p| p.vision) || gguf.is_some_and(|g| g.vision);
    let audio = facts.projector.is_some_and(|p| p.audio) || gguf.is_some_and(|g| g.audio);
    let mut input = vec!["text"];
    if vision {
        input.push("image");
    }
    if audio {
        input.push("audio");
    }
    input
}

/// Every rule applied.
pub fn derive(facts: &Facts) -> Derived {
    let gguf = facts.gguf.as_ref();
    Derived {
        context_length: request_context(facts),
        input: input_modalities(facts),
        tools: gguf.is_some_and(|g| g.tools),
        n_ctx_train: gguf.and_then(|g| g.n_ctx_train),
        n_params: gguf.map(|g| g.n_params).filter(|n| *n > 0),
        size: gguf.map(|g| g.size).filter(|n| *n > 0),
    }
}

/// Whether corral fills in this model's metadata (`capabilities.disableAuto` says no).
pub fn fills(model: &ModelConfig) -> bool {
    !model.capabilities.disable_auto
}

/// Adds the derived values to a model's entry where it has none: a configured capability or a
/// metadata key of the same name always wins.
pub fn fill(record: &mut Value, derived: &Derived) {
    if let Some(n) = derived.context_length {
        set_absent(record, "context_length", json!(n));
        set_absent(&mut record["meta"], "n_ctx", json!(n));
    }
    let meta = &mut record["meta"];
    for (key, v) in [
        ("n_ctx_train", derived.n_ctx_train),
        ("n_params", derived.n_params),
        ("size", derived.size),
    ] {
        if let Some(v) = v {
            set_absent(meta, key, json!(v));
        }
    }
    fill_architecture(record, &derived.input);
    if derived.tools {
        set_absent(
            record,
            "supported_parameters",
            json!(["tools", "tool_choice"]),
        );
        set_flag(record, "function_calling");
    }
    if derived.input.contains(&"image") {
        set_flag(record, "vision");
    }
}

/// `architecture` as llama.cpp's router and OpenRouter write it, unless the entry has one.
fn fill_architecture(record: &mut Value, input: &[&'static str]) {
    let modality = format!("{}->text", input.join("+"));
    set_absent(
        record,
        "architecture",
        json!({"input_modalities": input, "output_modalities": ["text"], "modality": modality}),
    );
}

/// A `capabilities` flag set true, unless the entry says otherwise already.
fn set_flag(record: &mut Value, flag: &str) {
    if !record["capabilities"].is_object() {
        record["capabilities"] = Value::Object(Map::new());
    }
    set_absent(&mut record["capabilities"], flag, json!(true));
}

fn set_absent(target: &mut Value, key: &str, value: Value) {
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        map.entry(key).or_insert(value);
    }
}
