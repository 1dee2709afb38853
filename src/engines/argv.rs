//! The command line and environment each engine kind is started with.
//!
//! The argv is always `command`, then corral's flags, then the user's `args`, so a user argument
//! overrides one of corral's (the engines take the last value of a repeated flag).
//!
//! Per kind:
//! - `llama_cpp`: `-m <file> [--mmproj <file>] --host H --port P --alias <served> [-c <ctx*slots>]
//!   [-np <slots>] [--embedding] --metrics`. llama-server's `-c` is the context of all slots
//!   together, so corral passes the per-slot context times the slots; with `ctx` but no `slots` it
//!   passes `-c <ctx>` and llama-server picks its slot count. `--embedding` keeps the model's own
//!   pooling (give `--pooling` in `args` to change it). `--metrics` turns on the gauges corral
//!   reads. The flags are the ones `config::decode::parse::slots_from_argv` and the memory estimator read.
//! - `vllm`: `<dir> --host H --port P --served-model-name <served> [--max-model-len <ctx>]
//!   [--max-num-seqs <slots>] [--runner pooling]`. `--runner pooling` is what current vLLM
//!   documents for embedding models (it replaced `--task embed`).
//! - `tgi`: `--model-id <dir> --hostname H --port P [--max-input-tokens <ctx-1>
//!   --max-total-tokens <ctx>] [--max-concurrent-requests <slots>]`. TGI serves generation only:
//!   the task is not passed. Its model id in answers is the directory; corral rewrites ids anyway.
//! - `sglang`: `--model-path <dir> --host H --port P --served-model-name <served>
//!   [--context-length <ctx>] [--max-running-requests <slots>] [--is-embedding] --enable-metrics`.
//! - `tei`: `--model-id <dir> --hostname H --port P --served-model-name <served>
//!   [--max-concurrent-requests <slots>] [--max-batch-tokens <ctx*slots>]`. TEI serves embeddings
//!   only; `--max-batch-tokens` must be at least the model's input length, or TEI refuses to start.
//! - `ollama`: `ollama serve` takes no flags: host and port go in `OLLAMA_HOST`, ctx and slots in
//!   `OLLAMA_CONTEXT_LENGTH` and `OLLAMA_NUM_PARALLEL`. The model is an Ollama tag that the server
//!   loads on the first request naming it, so corral must rewrite a request's `model` to
//!   `Launch::model`.
//! - `custom`: the command then `args`, with placeholders replaced in every word: `{host}`,
//!   `{port}`, `{model}`, `{name}` (the served name), and `{ctx}`, `{slots}`, `{mmproj}` when set.
//!   A placeholder with no value, or an unknown one, stays as written.

use std::path::Path;

use super::{EngineKind, Launch, Task};

/// The full argv (program first) that starts `kind` as `launch` describes.
pub fn argv(kind: EngineKind, launch: &Launch) -> Vec<String> {
    let mut out: Vec<String> = launch.command.to_vec();
    let flags = match kind {
        EngineKind::LlamaCpp => llama_cpp(launch),
        EngineKind::Vllm => vllm(launch),
        EngineKind::Tgi => tgi(launch),
        EngineKind::Sglang => sglang(launch),
        EngineKind::Tei => tei(launch),
        EngineKind::Ollama => Vec::new(),
        EngineKind::Custom => {
            out.extend(launch.args.iter().cloned());
            return out.iter().map(|w| substitute(w, launch)).collect();
        }
    };
    out.extend(flags);
    out.extend(launch.args.iter().cloned());
    out
}

/// Environment variables the engine needs, besides what corral passes to every engine.
///
/// Engines given a local directory get `HF_HUB_OFFLINE=1` (and the older `TRANSFORMERS_OFFLINE=1`)
/// so they never reach for the Hub to download again what corral already fetched. Ollama gets its
/// address, context and parallelism, which it reads only from the environment.
pub fn env(kind: EngineKind, launch: &Launch) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut put = |k: &str, v: String| out.push((k.to_string(), v));
    match kind {
        EngineKind::Vllm | EngineKind::Tgi | EngineKind::Sglang | EngineKind::Tei => {
            if Path::new(launch.model).is_absolute() {
                put("HF_HUB_OFFLINE", "1".into());
                put("TRANSFORMERS_OFFLINE", "1".into());
            }
        }
        EngineKind::Ollama => {
            put("OLLAMA_HOST", host_port(launch.host, launch.port));
            if let Some(ctx) = launch.ctx {
                put("OLLAMA_CONTEXT_LENGTH", ctx.to_string());
            }
            if let Some(slots) = launch.slots {
                put("OLLAMA_NUM_PARALLEL", slots.to_string());
            }
        }
        EngineKind::LlamaCpp | EngineKind::Custom => {}
    }
    out
}

/// `host:port`, with an IPv6 host in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn s(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn push(out: &mut Vec<String>, flag: &str, value: impl ToString) {
    out.push(flag.to_string());
    out.push(value.to_string());
}

fn llama_cpp(l: &Launch) -> Vec<String> {
    let mut out = s(&["-m", l.model]);
    if let Some(mmproj) = l.mmproj {
        push(&mut out, "--mmproj", mmproj);
    }
    push(&mut out, "--host", l.host);
    push(&mut out, "--port", l.port);
    push(&mut out, "--alias", l.served_name);
    if let Some(ctx) = l.ctx {
        let total = ctx.saturating_mul(l.slots.unwrap_or(1) as u64);
        push(&mut out, "-c", total);
    }
    if let Some(slots) = l.slots {
        push(&mut out, "-np", slots);
    }
    if l.task == Task::Embedding {
        out.push("--embedding".into());
    }
    out.push("--metrics".into());
    out
}

fn vllm(l: &Launch) -> Vec<String> {
    let mut out = vec![l.model.to_string()];
    push(&mut out, "--host", l.host);
    push(&mut out, "--port", l.port);
    push(&mut out, "--served-model-name", l.served_name);
    if let Some(ctx) = l.ctx {
        push(&mut out, "--max-model-len", ctx);
    }
    if let Some(slots) = l.slots {
        push(&mut out, "--max-num-seqs", slots);
    }
    if l.task == Task::Embedding {
        push(&mut out, "--runner", "pooling");
    }
    out
}

fn tgi(l: &Launch) -> Vec<String> {
    let mut out = s(&["--model-id", l.model]);
    push(&mut out, "--hostname", l.host);
    push(&mut out, "--port", l.port);
    if let Some(ctx) = l.ctx {
        // TGI wants room for at least one generated token after the longest input
        push(&mut out, "--max-input-tokens", ctx.saturating_sub(1).max(1));
        push(&mut out, "--max-total-tokens", ctx.max(2));
    }
    if let Some(slots) = l.slots {
        push(&mut out, "--max-concurrent-requests", slots);
    }
    out
}

fn sglang(l: &Launch) -> Vec<String> {
    let mut out = s(&["--model-path", l.model]);
    push(&mut out, "--host", l.host);
    push(&mut out, "--port", l.port);
    push(&mut out, "--served-model-name", l.served_name);
    if let Some(ctx) = l.ctx {
        push(&mut out, "--context-length", ctx);
    }
    if let Some(slots) = l.slots {
        push(&mut out, "--max-running-requests", slots);
    }
    if l.task == Task::Embedding {
        out.push("--is-embedding".into());
    }
    out.push("--enable-metrics".into());
    out
}

fn tei(l: &Launch) -> Vec<String> {
    let mut out = s(&["--model-id", l.model]);
    push(&mut out, "--hostname", l.host);
    push(&mut out, "--port", l.port);
    push(&mut out, "--served-model-name", l.served_name);
    if let Some(slots) = l.slots {
        push(&mut out, "--max-concurrent-requests", slots);
    }
    if let Some(ctx) = l.ctx {
        let total = ctx.saturating_mul(l.slots.unwrap_or(1) as u64);
        push(&mut out, "--max-batch-tokens", total);
    }
    out
}

/// Replaces the custom-engine placeholders in one word, in a single pass (a value that itself
/// holds `{port}` is not replaced again).
fn substitute(word: &str, l: &Launch) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let Some(close) = after.find('}') else {
            out.push_str(after);
            return out;
        };
        match value_of(&after[1..close], l) {
            Some(v) => out.push_str(&v),
            None => out.push_str(&after[..=close]),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

fn value_of(name: &str, l: &Launch) -> Option<String> {
    match name {
        "host" => Some(l.host.to_string()),
        "port" => Some(l.port.to_string()),
        "model" => Some(l.model.to_string()),
        "name" => Some(l.served_name.to_string()),
        "ctx" => l.ctx.map(|c| c.to_string()),
        "slots" => l.slots.map(|n| n.to_string()),
        "mmproj" => l.mmproj.map(str::to_string),
        _ => None,
    }
}
