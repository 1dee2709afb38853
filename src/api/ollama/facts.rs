//! What corral knows of a model for Ollama's listings: its weights file (named by `-m` in the
//! command its instance runs, else in its config) and what that file's GGUF headers say: size,
//! family, parameter count, quantization, chat template. Nothing is guessed: a model whose weights
//! corral cannot read has only what its config says. Headers are read once per file version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::api::App;
use crate::config::ModelConfig;
use crate::engines::Task;

/// What a weights file says of its model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub size: u64,
    pub modified: Option<SystemTime>,
    pub format: Option<&'static str>,
    pub family: Option<String>,
    pub parameter_count: Option<u64>,
    pub quantization: Option<&'static str>,
    pub chat_template: Option<String>,
    /// The header's single values under `general.` and the architecture's prefix.
    pub info: Map<String, Value>,
}

impl Facts {
    /// Ollama's `details` of a model.
    pub fn details(&self) -> Value {
        let mut d = json!({"parent_model": "", "format": self.format.unwrap_or("")});
        if let Some(family) = &self.family {
            d["family"] = json!(family);
            d["families"] = json!([family]);
        }
        if let Some(n) = self.parameter_count {
            d["parameter_size"] = json!(parameter_size(n));
        }
        if let Some(q) = self.quantization {
            d["quantization_level"] = json!(q);
        }
        d
    }
}

/// The facts of a model's weights, or none when no readable weights file is named.
pub fn of_model(app: &App, model: &ModelConfig) -> Facts {
    weights_path(app, model).map_or_else(Facts::default, |p| of_file(&p))
}

/// The weights file of a model: `-m` of the command a running instance has, else of its config.
fn weights_path(app: &App, model: &ModelConfig) -> Option<PathBuf> {
    let running = app
        .fleet
        .snapshot()
        .into_iter()
        .filter(|s| s.model == *model.id)
        .find_map(|s| s.argv);
    let argv = running.as_deref().unwrap_or(&model.argv);
    crate::memory::parse_llama_args(argv).model
}

/// Headers read, by file, with the length and time of the version read.
type Cache = HashMap<PathBuf, (u64, Option<SystemTime>, Arc<Facts>)>;
static READ: LazyLock<Mutex<Cache>> = LazyLock::new(Default::default);

/// The facts of a weights file, read again only when it changed.
pub fn of_file(path: &Path) -> Facts {
    let Ok(meta) = std::fs::metadata(path) else {
        return Facts::default();
    };
    let (len, modified) = (meta.len(), meta.modified().ok());
    let cached = READ
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(path)
        .cloned();
    if let Some((l, m, facts)) = cached.filter(|(l, m, _)| *l == len && *m == modified) {
        let _ = (l, m);
        return (*facts).clone();
    }
    let facts = Arc::new(read(path, len, modified));
    let entry = (len, modified, facts.clone());
    READ.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf(), entry);
    (*facts).clone()
}

fn read(path: &Path, len: u64, modified: Option<SystemTime>) -> Facts {
    let mut facts = Facts {
        size: len,
        modified,
        ..Facts::default()
    };
    let Ok(model) = gguf::read_model(path) else {
        return facts;
    };
    let h = &model.header;
    facts.size = model.file_size().max(len);
    facts.format = Some("gguf");
    facts.family = h.architecture().map(String::from);
    facts.parameter_count = Some(model.n_elements()).filter(|n| *n > 0);
    facts.quantization = h.get_u64("general.file_type").and_then(file_type_name);
    facts.chat_template = h.get_str("tokenizer.chat_template").map(String::from);
    facts.info = info(h);
    if let Some(n) = facts.parameter_count {
        facts
            .info
            .insert("general.parameter_count".into(), json!(n));
    }
    facts
}

/// The single values of a header under `general.` and `<architecture>.`: Ollama's `model_info`.
/// The training context is left out: the context a model serves with is its config's (see
/// [`context_length`]).
fn info(h: &gguf::Header) -> Map<String, Value> {
    let arch = h.architecture().unwrap_or("");
    let ours = |k: &str| {
        k.starts_with("general.") || (!arch.is_empty() && k.starts_with(&format!("{arch}.")))
    };
    let mut info = Map::new();
    for (key, value) in h.metadata.iter().filter(|(k, _)| ours(k)) {
        if key.ends_with(".context_length") {
            continue;
        }
        let v = match value {
            gguf::Value::String(s) => json!(s),
            gguf::Value::Bool(b) => json!(b),
            gguf::Value::F32(f) => json!(f),
            gguf::Value::F64(f) => json!(f),
            other => match other.as_u64() {
                Some(n) => json!(n),
                None => continue,
            },
        };
        info.insert(key.clone(), v);
    }
    info
}

/// llama.cpp's `general.file_type` (`enum llama_ftype`) by name.
fn file_type_name(id: u64) -> Option<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (7, "Q8_0"),
        (8, "Q5_0"),
        (9, "Q5_1"),
        (10, "Q2_K"),
        (11, "Q3_K_S"),
        (12, "Q3_K_M"),
        (13, "Q3_K_L"),
        (14, "Q4_K_S"),
        (15, "Q4_K_M"),
        (16, "Q5_K_S"),
        (17, "Q5_K_M"),
        (18, "Q6_K"),
        (19, "IQ2_XXS"),
        (20, "IQ2_XS"),
        (21, "Q2_K_S"),
        (22, "IQ3_XS"),
        (23, "IQ3_XXS"),
        (24, "IQ1_S"),
        (25, "IQ4_NL"),
        (26, "IQ3_S"),
        (27, "IQ3_M"),
        (28, "IQ2_S"),
        (29, "IQ2_M"),
        (30, "IQ4_XS"),
        (31, "IQ1_M"),
        (32, "BF16"),
        (36, "TQ1_0"),
        (37, "TQ2_0"),
        (38, "MXFP4"),
    ];
    NAMES.iter().find(|(n, _)| *n == id).map(|(_, name)| *name)
}

/// A parameter count as Ollama writes it: `7.6B`, `494.03M`, `22.7K`.
pub fn parameter_size(n: u64) -> String {
    let n = n as f64;
    let (value, unit) = match n {
        n if n >= 1e9 => (n / 1e9, "B"),
        n if n >= 1e6 => (n / 1e6, "M"),
        n if n >= 1e3 => (n / 1e3, "K"),
        n => return format!("{n}"),
    };
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{value:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text}{unit}")
}

/// The context a model serves with, as far as corral knows it: its config's
/// `capabilities.context` for now. Where the engine's own report of it is read, it belongs here.
pub fn context_length(model: &ModelConfig) -> Option<u64> {
    Some(model.capabilities.context).filter(|c| *c > 0)
}

/// Whether a model serves embeddings rather than completions: its engine's task, or
/// llama-server's `--embedding` or a reranker.
pub fn embeds(model: &ModelConfig) -> bool {
    let task = model.engine.as_ref().map(|e| e.task);
    task == Some(Task::Embedding)
        || model.capabilities.reranker
        || model
            .argv
            .iter()
            .any(|a| a == "--embedding" || a == "--embeddings")
}

/// Ollama's `capabilities` of a model.
pub fn capabilities(model: &ModelConfig) -> Vec<&'static str> {
    if embeds(model) {
        return vec!["embedding"];
    }
    let mut caps = vec!["completion"];
    if model.capabilities.tools {
        caps.push("tools");
    }
    if model.capabilities.input.iter().any(|i| i == "image") {
        caps.push("vision");
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_sizes_read_as_ollamas() {
        assert_eq!(parameter_size(7_615_616_512), "7.62B");
        assert_eq!(parameter_size(70_553_706_496), "70.6B");
        assert_eq!(parameter_size(494_032_768), "494M");
        assert_eq!(parameter_size(8_000_000_000), "8B");
        assert_eq!(parameter_size(22_700), "22.7K");
        assert_eq!(parameter_size(12), "12");
    }

    #[test]
    fn a_tiny_gguf_tells_its_family_size_and_quantization() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        gguf::write_tiny_llama(&path, &gguf::TinyOptions::default()).unwrap();
        let facts = of_file(&path);
        assert_eq!(facts.format, Some("gguf"));
        assert_eq!(facts.family.as_deref(), Some("llama"));
        assert_eq!(facts.size, std::fs::metadata(&path).unwrap().len());
        assert!(facts.parameter_count.is_some_and(|n| n > 0));
        assert_eq!(facts.info["general.architecture"], "llama");
        assert!(facts.info.keys().all(|k| !k.ends_with("context_length")));
        let details = facts.details();
        assert_eq!(details["family"], "llama");
        assert_eq!(details["families"], json!(["llama"]));
        assert!(details["parameter_size"].is_string());
        assert_eq!(of_file(&path), facts, "read again from the cache");
    }

    #[test]
    fn a_file_that_is_not_gguf_has_its_size_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, b"not a gguf").unwrap();
        let facts = of_file(&path);
        assert_eq!((facts.size, facts.format, facts.family), (10, None, None));
        assert_eq!(of_file(&dir.path().join("missing")), Facts::default());
    }

    fn model(yaml: &str) -> ModelConfig {
        let config = crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config;
        config.models["m"].clone()
    }

    #[test]
    fn capabilities_follow_the_config() {
        let chat = model("models:\n  m: {cmd: srv, proxy: 'http://h:1', capabilities: {tools: true, in: [text, image], context: 8192}}\n");
        assert_eq!(capabilities(&chat), ["completion", "tools", "vision"]);
        assert_eq!(context_length(&chat), Some(8192));
        let embed = model("models:\n  m: {cmd: srv --embedding, proxy: 'http://h:1'}\n");
        assert_eq!(capabilities(&embed), ["embedding"]);
        assert_eq!(context_length(&embed), None);
    }
}
