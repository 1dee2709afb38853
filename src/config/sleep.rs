//! Sleep and wake: a model whose engine can free the GPU and keep its process (vLLM's sleep
//! mode, SGLang's memory release) is put to sleep where a swap or memory would stop it, and woken
//! by the next request in a fraction of a cold start. The keys are llmsnap's (`sleepMode`,
//! `sleepEndpoints`, `wakeEndpoints`), with defaults per engine kind when only `sleepMode: enable`
//! is given, and `sleepLevel` choosing vLLM's level.

use std::time::Duration;

use crate::engines::EngineKind;

/// How long a wake may take in all when `wakeTimeout` is not set: well beyond a real wake (vLLM
/// wakes level 1 in seconds) and well short of a cold load.
pub const DEFAULT_WAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one sleep or wake call may take when its own `timeout` is not set (llmsnap's).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// What a sleeping engine still holds on its device (CUDA context, graphs), charged in place of
/// its whole need while it sleeps.
pub const SLEEP_RESIDUE: u64 = 512 << 20;

/// One HTTP call of a sleep or a wake, made to the model's upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SleepCall {
    /// The path (with its query), joined onto the proxy URL.
    pub endpoint: String,
    /// GET, POST, PUT or PATCH.
    pub method: String,
    /// Sent as JSON when given.
    pub body: Option<String>,
    /// This call's own limit, else [`DEFAULT_CALL_TIMEOUT`].
    pub timeout: Option<Duration>,
}

impl SleepCall {
    fn post(endpoint: &str, body: Option<&str>) -> SleepCall {
        SleepCall {
            endpoint: endpoint.into(),
            method: "POST".into(),
            body: body.map(str::to_string),
            timeout: None,
        }
    }
}

/// How a model sleeps and wakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SleepSpec {
    /// 1 keeps the weights in host memory (charged there while it sleeps), 2 drops them.
    pub level: u8,
    pub sleep: Vec<SleepCall>,
    pub wake: Vec<SleepCall>,
    /// The deadline of a whole wake, all its calls together (`wakeTimeout`).
    pub wake_timeout: Duration,
}

impl SleepSpec {
    /// True when the weights stay in host memory while it sleeps.
    pub fn keeps_weights(&self) -> bool {
        self.level == 1
    }
}

/// The calls an engine kind sleeps and wakes with, at `level`; `None` for a kind without a sleep
/// corral knows (llama-server sleeps by itself when idle; others cannot).
pub fn engine_calls(kind: EngineKind, level: u8) -> Option<(Vec<SleepCall>, Vec<SleepCall>)> {
    match (kind, level) {
        (EngineKind::Vllm, 1) => Some((
            vec![SleepCall::post("/sleep?level=1", None)],
            vec![SleepCall::post("/wake_up", None)],
        )),
        (EngineKind::Vllm, _) => Some((
            vec![SleepCall::post("/sleep?level=2", None)],
            vec![
                SleepCall::post("/wake_up", None),
                SleepCall::post("/collective_rpc", Some(r#"{"method": "reload_weights"}"#)),
                SleepCall::post("/reset_prefix_cache", None),
            ],
        )),
        (EngineKind::Sglang, _) => Some((
            vec![SleepCall::post("/release_memory_occupation", Some("{}"))],
            vec![SleepCall::post("/resume_memory_occupation", Some("{}"))],
        )),
        _ => None,
    }
}

/// The flags and environment an engine kind must be started with to take sleep calls: vLLM's
/// routes exist only in sleep mode with its development server on, SGLang's with its memory
/// saver.
pub fn engine_needs(
    kind: EngineKind,
) -> (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
) {
    match kind {
        EngineKind::Vllm => (&["--enable-sleep-mode"], &[("VLLM_SERVER_DEV_MODE", "1")]),
        EngineKind::Sglang => (&["--enable-memory-saver"], &[]),
        _ => (&[], &[]),
    }
}

/// What `corral check` says of a `cmd` model that sleeps through vLLM's routes but whose command
/// or environment lacks what vLLM needs to serve them; `None` when nothing is missing.
pub fn cmd_warning(argv: &[String], env: &[(String, String)], spec: &SleepSpec) -> Option<String> {
    let vllm_routes = spec.sleep.iter().any(|c| c.endpoint.starts_with("/sleep"));
    let runs_vllm = argv.iter().any(|a| a.contains("vllm"));
    if !vllm_routes && !runs_vllm {
        return None;
    }
    let (flags, needed_env) = engine_needs(EngineKind::Vllm);
    let mut missing: Vec<String> = flags
        .iter()
        .filter(|f| !argv.iter().any(|a| a == *f))
        .map(|f| f.to_string())
        .collect();
    missing.extend(
        needed_env
            .iter()
            .filter(|(k, v)| !env.iter().any(|(ek, ev)| ek == k && ev == v))
            .map(|(k, v)| format!("env {k}={v}")),
    );
    (!missing.is_empty()).then(|| {
        format!(
            "sleep is enabled but vLLM serves its sleep routes only with {}: without them every sleep fails and the engine is stopped instead",
            missing.join(" and ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_level_two_wakes_in_three_calls_and_sglang_releases_its_memory() {
        let (sleep, wake) = engine_calls(EngineKind::Vllm, 2).unwrap();
        assert_eq!(sleep[0].endpoint, "/sleep?level=2");
        let paths: Vec<&str> = wake.iter().map(|c| c.endpoint.as_str()).collect();
        assert_eq!(
            paths,
            ["/wake_up", "/collective_rpc", "/reset_prefix_cache"]
        );
        let (sleep, wake) = engine_calls(EngineKind::Sglang, 1).unwrap();
        assert_eq!(sleep[0].endpoint, "/release_memory_occupation");
        assert_eq!(wake[0].endpoint, "/resume_memory_occupation");
        assert!(engine_calls(EngineKind::LlamaCpp, 1).is_none());
    }

    #[test]
    fn a_vllm_command_without_sleep_mode_is_warned_about() {
        let (sleep, wake) = engine_calls(EngineKind::Vllm, 1).unwrap();
        let spec = SleepSpec {
            level: 1,
            sleep,
            wake,
            wake_timeout: DEFAULT_WAKE_TIMEOUT,
        };
        let argv: Vec<String> = ["vllm", "serve", "m"].map(String::from).to_vec();
        let warned = cmd_warning(&argv, &[], &spec).expect("warned");
        assert!(
            warned.contains("--enable-sleep-mode") && warned.contains("VLLM_SERVER_DEV_MODE=1")
        );
        let mut full = argv.clone();
        full.push("--enable-sleep-mode".into());
        let env = [("VLLM_SERVER_DEV_MODE".to_string(), "1".to_string())];
        assert_eq!(cmd_warning(&full, &env, &spec), None);
    }
}
