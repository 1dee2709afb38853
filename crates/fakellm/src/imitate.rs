//! Imitating engines other than llama-server (`--imitate vllm|tgi|sglang|tei|ollama`).
//!
//! Each imitation takes that engine's command line (so the argv corral builds for the engine
//! starts fakellm unchanged), starts up as the engine does, and publishes the engine's load
//! metrics. The OpenAI routes answer the same in every mode.
//!
//! Start-up, as the real engines behave:
//! - vLLM binds its port at once (no other process can take it) but listens only once loaded:
//!   until then connections are refused;
//! - TGI and TEI bind only once loaded;
//! - SGLang listens at once and answers 503 on `/health` until loaded;
//! - Ollama answers at once (`/`, `/api/version`); `--loading-ms` is ignored, since Ollama loads a
//!   model per request. Its address comes from `OLLAMA_HOST`, like `ollama serve`'s.

mod cli;
mod output;

pub use cli::translate;
pub(crate) use output::{fail, metrics, ollama_route, port_lines};

use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::time::Instant;

use crate::args::Config;
pub use crate::kind::Kind;

/// Whether the model counts as loaded from the moment the server answers.
pub(crate) fn ready_at_bind(cfg: &Config) -> bool {
    !cfg.never_healthy && (cfg.imitate.binds_late() || cfg.imitate == Kind::Ollama)
}

/// Binds the server's socket when and as the imitated engine does.
pub(crate) async fn bind(cfg: &Config, start: Instant) -> std::io::Result<TcpListener> {
    let host = cfg.host.trim_start_matches('[').trim_end_matches(']');
    match cfg.imitate {
        Kind::Vllm => {
            let addr = tokio::net::lookup_host((host, cfg.port))
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("the host resolves to no address"))?;
            let sock = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            sock.set_reuseaddr(true)?;
            sock.bind(addr)?;
            loaded(cfg, start).await;
            sock.listen(1024)
        }
        Kind::Tgi | Kind::Tei => {
            loaded(cfg, start).await;
            TcpListener::bind((host, cfg.port)).await
        }
        _ => TcpListener::bind((host, cfg.port)).await,
    }
}

/// Waits out the loading time (forever with `--never-healthy`).
async fn loaded(cfg: &Config, start: Instant) {
    if cfg.never_healthy {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep_until(start + Duration::from_millis(cfg.loading_ms)).await;
}
