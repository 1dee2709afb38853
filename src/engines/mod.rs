//! Engine kinds: how corral builds an engine's command line and environment, how it tells that the
//! engine is ready, where it reads the engine's load, and what a failed start means.
//!
//! A model written as `engine: vllm, source: ..., ctx: 8192, slots: 4` names one of these kinds;
//! corral builds the command from it instead of running a user-written `cmd`. Everything here is a
//! pure function of the kind and the launch settings, so the rules are tested without a process.
//!
//! Config names are `llama_cpp` (also accepted: `llama.cpp`, `llamacpp`, `llama-cpp`), `vllm`,
//! `tgi`, `sglang`, `ollama`, `tei` and `custom`, matched without regard to case.

mod argv;
mod diagnose;
mod load;
mod readiness;

#[cfg(test)]
mod argv_tests;

pub use argv::{argv, env};
pub use diagnose::{diagnose, Cause, Diagnosis};
pub use load::{read_capacity, read_load, Load, LoadFormat, LoadReport};
pub use readiness::Readiness;

/// A kind of engine corral knows how to launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter)]
pub enum EngineKind {
    LlamaCpp,
    Vllm,
    Tgi,
    Sglang,
    Ollama,
    Tei,
    Custom,
}

/// What an engine wants to be given as its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelForm {
    /// A single file (a GGUF for llama.cpp).
    File,
    /// A model directory, as a Hugging Face snapshot lays it out.
    Directory,
    /// A name the engine resolves itself (an Ollama tag).
    Name,
    /// Whatever the source resolves to, file or directory: a custom engine's own business.
    AsGiven,
}

/// What the engine serves: generation or embeddings. Changes flags for engines that serve both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Task {
    #[default]
    TextGeneration,
    Embedding,
}

impl Task {
    /// Parses a config name: `text-generation` or `embedding` (also `embeddings`).
    pub fn parse(name: &str) -> Option<Task> {
        match name.trim().to_ascii_lowercase().as_str() {
            "text-generation" | "text_generation" | "generation" => Some(Task::TextGeneration),
            "embedding" | "embeddings" => Some(Task::Embedding),
            _ => None,
        }
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Task::TextGeneration => "text-generation",
            Task::Embedding => "embedding",
        }
    }
}

/// Everything a command line is built from.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// `engines.<kind>.command` split, or [`EngineKind::default_command`].
    pub command: &'a [String],
    /// Path to the GGUF or the model directory, or the name for Ollama.
    pub model: &'a str,
    /// llama.cpp's multimodal projector (`--mmproj`); other engines read it from the directory.
    pub mmproj: Option<&'a str>,
    /// The model id clients use.
    pub served_name: &'a str,
    pub host: &'a str,
    pub port: u16,
    /// Context per slot, in tokens.
    pub ctx: Option<u64>,
    /// Sequences served in parallel.
    pub slots: Option<usize>,
    pub task: Task,
    /// Extra user arguments, appended last so they override what corral chose.
    pub args: &'a [String],
}

impl EngineKind {
    /// Parses a config name (see the module docs for the accepted spellings).
    pub fn parse(name: &str) -> Option<EngineKind> {
        let kind = match name.trim().to_ascii_lowercase().as_str() {
            "llama_cpp" | "llama.cpp" | "llamacpp" | "llama-cpp" => EngineKind::LlamaCpp,
            "vllm" => EngineKind::Vllm,
            "tgi" => EngineKind::Tgi,
            "sglang" => EngineKind::Sglang,
            "ollama" => EngineKind::Ollama,
            "tei" => EngineKind::Tei,
            "custom" => EngineKind::Custom,
            _ => return None,
        };
        Some(kind)
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llama_cpp",
            EngineKind::Vllm => "vllm",
            EngineKind::Tgi => "tgi",
            EngineKind::Sglang => "sglang",
            EngineKind::Ollama => "ollama",
            EngineKind::Tei => "tei",
            EngineKind::Custom => "custom",
        }
    }

    /// The command run when `engines.<kind>.command` is not set; empty for `custom`, which has none.
    pub fn default_command(self) -> Vec<String> {
        let words: &[&str] = match self {
            EngineKind::LlamaCpp => &["llama-server"],
            EngineKind::Vllm => &["vllm", "serve"],
            EngineKind::Tgi => &["text-generation-launcher"],
            EngineKind::Sglang => &["python", "-m", "sglang.launch_server"],
            EngineKind::Ollama => &["ollama", "serve"],
            EngineKind::Tei => &["text-embeddings-router"],
            EngineKind::Custom => &[],
        };
        words.iter().map(|w| w.to_string()).collect()
    }

    /// What the engine wants as its model: a GGUF file (llama.cpp), a snapshot directory (vLLM,
    /// TGI, SGLang, TEI), a name it resolves itself (Ollama), or whatever was given (custom).
    pub fn model_form(self) -> ModelForm {
        match self {
            EngineKind::LlamaCpp => ModelForm::File,
            EngineKind::Vllm | EngineKind::Tgi | EngineKind::Sglang | EngineKind::Tei => {
                ModelForm::Directory
            }
            EngineKind::Ollama => ModelForm::Name,
            EngineKind::Custom => ModelForm::AsGiven,
        }
    }

    /// The path polled for readiness and how its answers read.
    pub fn readiness(self) -> Readiness {
        readiness::of(self)
    }

    /// Where live load and capacity come from.
    pub fn load_report(self) -> LoadReport {
        load::report_of(self)
    }
}
