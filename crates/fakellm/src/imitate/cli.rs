//! Rewrites an imitated engine's command line into fakellm's own flags.
//!
//! Only the flags fakellm acts on are rewritten (model, address, served name, slots, context);
//! the rest pass through, and fakellm's parser ignores what it does not know, with a warning.

use super::Kind;

/// Engine flag (always followed by a value) → fakellm flag; `None` drops the flag and its value.
type Map = &'static [(&'static str, Option<&'static str>)];

const VLLM: Map = &[
    ("--served-model-name", Some("--alias")),
    ("--max-num-seqs", Some("--slots")),
    ("--max-model-len", Some("-c")),
];
const SGLANG: Map = &[
    ("-m", None), // `python -m sglang.launch_server`
    ("--model-path", Some("--model")),
    ("--served-model-name", Some("--alias")),
    ("--max-running-requests", Some("--slots")),
    ("--context-length", Some("-c")),
];
const TGI: Map = &[
    ("--model-id", Some("--model")),
    ("--hostname", Some("--host")),
    ("-p", Some("--port")),
    ("--served-model-name", Some("--alias")),
    ("--max-concurrent-requests", Some("--slots")),
    ("--max-total-tokens", Some("-c")),
];
const TEI: Map = &[
    ("--model-id", Some("--model")),
    ("--hostname", Some("--host")),
    ("-p", Some("--port")),
    ("--served-model-name", Some("--alias")),
    ("--max-concurrent-requests", Some("--slots")),
];

/// Takes `--imitate K` out of `args` and rewrites K's command line into fakellm's flags. `env`
/// reads the environment (Ollama takes its address, context and parallelism from it).
pub fn translate(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Kind, Vec<String>), String> {
    let (kind, args) = take_imitate(args)?;
    if kind == Kind::LlamaCpp {
        return Ok((kind, args));
    }
    let mut front: Vec<String> = Vec::new();
    if let Some(port) = kind.default_port() {
        front.extend(["--port".to_string(), port.to_string()]);
    }
    let map: Map = match kind {
        Kind::Vllm => VLLM,
        Kind::Sglang => SGLANG,
        Kind::Tgi => TGI,
        Kind::Tei => TEI,
        Kind::Ollama => {
            front.extend(ollama_env(env)?);
            &[]
        }
        Kind::LlamaCpp => unreachable!("returned above"),
    };
    let mut out = Vec::new();
    let mut leading = true;
    let mut i = 0;
    while i < args.len() {
        let tok = &args[i];
        i += 1;
        if tok.starts_with('-') {
            leading = false;
        } else if leading && matches!(kind, Kind::Vllm | Kind::Ollama) {
            // `vllm serve <model>`, `ollama serve`
            if tok != "serve" && kind == Kind::Vllm {
                out.extend(["--model".to_string(), tok.clone()]);
            }
            continue;
        }
        let (flag, inline) = match tok.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (tok.as_str(), None),
        };
        let Some((_, to)) = map.iter().find(|(from, _)| *from == flag) else {
            out.push(tok.clone());
            continue;
        };
        let value = match inline {
            Some(v) => v,
            None if i < args.len() => {
                i += 1;
                args[i - 1].clone()
            }
            None => return Err(format!("missing value for {flag}")),
        };
        if let Some(to) = to {
            out.extend([to.to_string(), value]);
        }
    }
    // the served name defaults to the model, as in the real engines; a given one comes later
    if let Some(pos) = out.iter().position(|a| a == "--model") {
        if let Some(model) = out.get(pos + 1) {
            front.extend(["--alias".to_string(), model.clone()]);
        }
    }
    front.extend(out);
    Ok((kind, front))
}

/// Splits `--imitate K` (or `--imitate=K`) out of the arguments.
fn take_imitate(args: &[String]) -> Result<(Kind, Vec<String>), String> {
    let mut kind = Kind::LlamaCpp;
    let mut rest = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let tok = &args[i];
        i += 1;
        let name = if let Some(v) = tok.strip_prefix("--imitate=") {
            v.to_string()
        } else if tok == "--imitate" {
            i += 1;
            args.get(i - 1)
                .cloned()
                .ok_or("missing value for --imitate")?
        } else {
            rest.push(tok.clone());
            continue;
        };
        kind = Kind::parse(&name).ok_or_else(|| {
            format!(
                "unknown engine '{name}' for --imitate (llama_cpp, vllm, tgi, sglang, tei, ollama)"
            )
        })?;
    }
    Ok((kind, rest))
}

/// `OLLAMA_HOST` (`host`, `host:port`, `:port`, `[v6]:port`, optionally with `http://`), and the
/// context and parallelism variables, as fakellm flags.
fn ollama_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    if let Some(raw) = env("OLLAMA_HOST").filter(|h| !h.trim().is_empty()) {
        let hp = raw.trim();
        let hp = hp
            .strip_prefix("http://")
            .or_else(|| hp.strip_prefix("https://"))
            .unwrap_or(hp);
        let hp = hp.trim_end_matches('/');
        let (host, port) = match hp.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()) => (h, p),
            _ => (hp, "11434"),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = if host.is_empty() { "127.0.0.1" } else { host };
        out.extend(["--host".to_string(), host.to_string()]);
        out.extend(["--port".to_string(), port.to_string()]);
    }
    if let Some(n) = env("OLLAMA_NUM_PARALLEL") {
        out.extend(["--slots".to_string(), n]);
    }
    if let Some(c) = env("OLLAMA_CONTEXT_LENGTH") {
        out.extend(["-c".to_string(), c]);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
