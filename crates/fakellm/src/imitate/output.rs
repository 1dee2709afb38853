//! What an imitated engine prints and publishes: its failure lines, its load metrics, and
//! Ollama's own routes.

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tokio::time::Instant;

use super::Kind;
use crate::args::Config;

/// `--fail-oom` / `--fail-port`: prints the engine's own failure lines and returns the exit code.
/// Out of memory comes after the loading time, as a real engine fails while loading.
pub(crate) async fn fail(cfg: &Config, start: Instant) -> i32 {
    if cfg.fail_port {
        for line in port_lines(cfg.imitate, &cfg.host, cfg.port, "Address already in use") {
            elog!("{line}");
        }
        return 1;
    }
    tokio::time::sleep_until(start + Duration::from_millis(cfg.loading_ms)).await;
    for line in oom_lines(cfg.imitate) {
        elog!("{line}");
    }
    1
}

/// The lines the engine prints when it runs out of GPU memory while loading.
fn oom_lines(kind: Kind) -> Vec<String> {
    let torch =
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has \
                 a total capacity of 23.55 GiB of which 1.06 GiB is free. Of the allocated memory \
                 20.12 GiB is allocated by PyTorch.";
    let ggml = [
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2048.00 MiB on device 0: cudaMalloc failed: out of memory",
        "alloc_tensor_range: failed to allocate CUDA0 buffer of size 2147483648",
    ];
    let lines: Vec<&str> = match kind {
        Kind::LlamaCpp => [
            &ggml[..],
            &[
                "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
                "main: exiting due to model loading error",
            ],
        ]
        .concat(),
        Kind::Vllm => vec![
            "ERROR 01-01 00:00:00 [core.py:700] EngineCore failed to start.",
            torch,
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ],
        Kind::Sglang => vec![
            "[2025-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):",
            torch,
        ],
        Kind::Tgi => vec![
            "ERROR text_generation_launcher: Error when initializing model",
            torch,
            "Error: ShardCannotStart",
        ],
        Kind::Tei => vec![
            "Error: Could not create backend",
            "",
            "Caused by:",
            "    Could not start backend: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
        ],
        Kind::Ollama => [
            &ggml[..],
            &["Error: llama runner process has terminated: cudaMalloc failed: out of memory"],
        ]
        .concat(),
    };
    lines.into_iter().map(String::from).collect()
}

/// The lines the engine prints when its port is taken (`err` is the system's message).
pub(crate) fn port_lines(kind: Kind, host: &str, port: u16, err: &str) -> Vec<String> {
    match kind {
        Kind::LlamaCpp => vec![
            format!("couldn't bind HTTP server socket, hostname: {host}, port: {port}"),
            format!("bind error: {err}"),
        ],
        Kind::Vllm => vec!["OSError: [Errno 98] Address already in use".into()],
        Kind::Sglang => vec![format!(
            "ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"
        )],
        Kind::Tgi | Kind::Tei => vec!["Error: Address already in use (os error 98)".into()],
        Kind::Ollama => vec![format!(
            "Error: listen tcp {host}:{port}: bind: address already in use"
        )],
    }
}

/// `/metrics` of the imitated engine, with `running` and `waiting` requests; `None` for
/// llama-server, whose metrics the server writes itself.
pub(crate) fn metrics(cfg: &Config, running: usize, waiting: usize) -> Option<String> {
    let name = &cfg.alias;
    let gauge = |metric: &str, help: &str, labels: &str, v: usize| {
        format!("# HELP {metric} {help}\n# TYPE {metric} gauge\n{metric}{labels} {v}\n")
    };
    let (r, w) = match cfg.imitate {
        Kind::LlamaCpp | Kind::Ollama => return None,
        Kind::Vllm => {
            let l = format!("{{engine=\"0\",model_name=\"{name}\"}}");
            (
                gauge(
                    "vllm:num_requests_running",
                    "Number of requests in model execution batches.",
                    &l,
                    running,
                ),
                gauge(
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    &l,
                    waiting,
                ),
            )
        }
        Kind::Sglang => {
            let l = format!("{{model_name=\"{name}\"}}");
            (
                gauge(
                    "sglang:num_running_reqs",
                    "The number of running requests.",
                    &l,
                    running,
                ),
                gauge(
                    "sglang:num_queue_reqs",
                    "The number of requests in the waiting queue.",
                    &l,
                    waiting,
                ),
            )
        }
        Kind::Tgi => (
            gauge("tgi_batch_current_size", "Current batch size", "", running),
            gauge("tgi_queue_size", "Current queue size", "", waiting),
        ),
        Kind::Tei => (
            gauge("te_batch_current_size", "Batch size", "", running),
            gauge("te_queue_size", "Queue size", "", waiting),
        ),
    };
    Some(format!("{r}{w}"))
}

/// Ollama's own GET routes: `/` and `/api/version` answer at once; `/api/ps` lists the model
/// while it is loaded, which here means from its first request on. `None` for other routes.
pub(crate) fn ollama_route(
    cfg: &Config,
    path: &str,
    used: bool,
) -> Option<(u16, &'static str, Bytes)> {
    if cfg.imitate != Kind::Ollama {
        return None;
    }
    const JSON: &str = "application/json; charset=utf-8";
    let body = match path {
        "/" => {
            return Some((
                200,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"Ollama is running"),
            ))
        }
        "/api/version" => json!({"version": "0.0.0-fakellm"}),
        "/api/ps" => {
            let models: Vec<_> = used
                .then(|| {
                    json!({"name": cfg.alias, "model": cfg.alias, "size": 0, "size_vram": 0,
                    "expires_at": "2100-01-01T00:00:00Z"})
                })
                .into_iter()
                .collect();
            json!({ "models": models })
        }
        _ => return None,
    };
    Some((200, JSON, Bytes::from(body.to_string())))
}
