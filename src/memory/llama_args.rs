//! The flags of a llama-server command line that decide how much memory it takes.

use std::path::PathBuf;

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
        set_switch(&mut a, flag);
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
        set_value(&mut a, flag, value);
    }
    a
}

/// The flags that take no value.
fn set_switch(a: &mut LlamaArgs, flag: &str) {
    match flag {
        "-kvu" | "--kv-unified" => a.kv_unified = Some(true),
        "-no-kvu" | "--no-kv-unified" => a.kv_unified = Some(false),
        "-nkvo" | "--no-kv-offload" => a.no_kv_offload = true,
        _ => {}
    }
}

/// A flag of ours that takes a value (see [`takes_value`]), with its value.
fn set_value(a: &mut LlamaArgs, flag: &str, value: String) {
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
        _ => a.ngl = ngl_setting(&value, num),
    }
}

/// `-ngl`: `auto` or -1 fit to free memory, `all` or below -1 every layer, else a count.
fn ngl_setting(value: &str, num: Option<i64>) -> Option<NglSetting> {
    match (value, num) {
        ("auto", _) | (_, Some(-1)) => Some(NglSetting::Auto),
        ("all", _) => Some(NglSetting::All),
        (_, Some(n)) if n <= -2 => Some(NglSetting::All),
        (_, Some(n)) => Some(NglSetting::Layers(n as u64)),
        _ => None,
    }
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
