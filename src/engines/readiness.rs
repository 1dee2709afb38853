//! How each engine shows that it is ready.
//!
//! Engines differ in when they answer at all. llama-server listens at once and answers `/health`
//! with 503 while it loads, then 200. vLLM binds its port before it loads (so no other process
//! takes it) but listens only once the engine is up: until then a connection is refused. TGI and
//! TEI bind only when the model is loaded. SGLang listens at once and answers `/health` with 503
//! until its warm-up request has passed (after that, `/health` runs a one-token generation, as
//! `/health_generate` always does). Ollama answers at once and loads models per request, so it is
//! ready as soon as `/api/version` answers.
//!
//! So one rule reads them all: a 2xx on [`Readiness::path`] is ready; a refused or timed-out
//! connection, or any other status, is not ready yet. A poll must use a timeout of its own.

use super::EngineKind;

/// The readiness probe of an engine kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The path polled with GET.
    pub path: &'static str,
    /// Whether the engine answers HTTP while it loads (with 503). When false, connections are
    /// refused until it is ready, so a refused connection is no sign of failure during a start.
    pub answers_while_loading: bool,
}

impl Readiness {
    /// Whether an answer with this status means ready.
    pub fn is_ready(&self, status: u16) -> bool {
        (200..300).contains(&status)
    }

    /// Whether an answer with this status means "still loading" (503), rather than a fault.
    pub fn is_loading(&self, status: u16) -> bool {
        status == 503
    }
}

pub(super) fn of(kind: EngineKind) -> Readiness {
    let (path, answers_while_loading) = match kind {
        EngineKind::LlamaCpp => ("/health", true),
        EngineKind::Vllm => ("/health", false),
        EngineKind::Tgi => ("/health", false),
        EngineKind::Tei => ("/health", false),
        EngineKind::Sglang => ("/health", true),
        EngineKind::Ollama => ("/api/version", true),
        // a custom engine is assumed to be llama-server-like
        EngineKind::Custom => ("/health", true),
    };
    Readiness {
        path,
        answers_while_loading,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    #[test]
    fn every_kind_has_a_path_and_reads_2xx_as_ready() {
        for kind in EngineKind::iter() {
            let r = kind.readiness();
            assert!(r.path.starts_with('/'), "{kind:?}");
            assert!(r.is_ready(200) && r.is_ready(204));
            assert!(!r.is_ready(503) && r.is_loading(503));
            assert!(!r.is_ready(404) && !r.is_loading(404));
        }
        assert_eq!(EngineKind::Ollama.readiness().path, "/api/version");
        assert!(!EngineKind::Vllm.readiness().answers_while_loading);
        assert!(EngineKind::Sglang.readiness().answers_while_loading);
    }
}
