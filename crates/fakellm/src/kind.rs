//! Which engine fakellm imitates: what the arguments choose and the imitation follows.

/// The engine fakellm imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    LlamaCpp,
    Vllm,
    Tgi,
    Sglang,
    Tei,
    Ollama,
}

impl Kind {
    pub fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "llama_cpp" | "llama.cpp" | "llamacpp" | "llama-cpp" => Kind::LlamaCpp,
            "vllm" => Kind::Vllm,
            "tgi" => Kind::Tgi,
            "sglang" => Kind::Sglang,
            "tei" => Kind::Tei,
            "ollama" => Kind::Ollama,
            _ => return None,
        })
    }

    /// The port the engine listens on when none is given.
    pub(crate) fn default_port(self) -> Option<u16> {
        match self {
            Kind::LlamaCpp => None,
            Kind::Vllm => Some(8000),
            Kind::Tgi | Kind::Tei => Some(3000),
            Kind::Sglang => Some(30000),
            Kind::Ollama => Some(11434),
        }
    }

    /// Whether the engine answers only once it is loaded (so it is ready as soon as it answers).
    pub(crate) fn binds_late(self) -> bool {
        matches!(self, Kind::Vllm | Kind::Tgi | Kind::Tei)
    }
}
