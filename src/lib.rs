//! corral: a drop-in llama-swap compatible proxy in front of local LLM servers.
//!
//! Only `config`, `logging` and `fdlimit` are public modules; everything else is private to the
//! crate, so the compiler reports what nothing uses. What the binary, the tests, the benches and the
//! fuzz targets need is re-exported below, by name.
#![deny(unsafe_code)]
mod api;
mod clock;
pub mod config;
mod engines;
mod fleet;
mod gpu;
mod logs;
pub use logs::logging;
mod memory;
mod metrics;
mod observe;
mod proxy;
mod routing;
mod server;
mod sources;
mod supervisor;
mod ui;

pub use engines::{
    argv as engine_argv, diagnose, env as engine_env, read_capacity, read_load, Cause, Diagnosis,
    EngineKind, Launch, Load, LoadFormat, LoadReport, ModelForm, Readiness, Task,
};
pub use fleet::ledger::{need_of, place, Placement};
pub use logs::Logs;
pub use memory::{
    estimate_command, estimate_llama, format_bytes, load_deadline, parse_buffer_report,
    parse_llama_args, Estimate,
};
pub use metrics::Metrics;
pub use observe::activity::Activity;
pub use observe::meter::{Labels, Metered};
pub use proxy::body::BoxError;
pub use routing::extract::{
    classify, model_from_body, query_param, rewrite_multipart_model, BodyKind,
};
pub use routing::Limits;
pub use server::fdlimit;
pub use server::tls::TlsCertificate;
pub use server::{run, run_with_reloads, Options, Reload};
pub use sources::{FetchError, Fetched, Fetcher, Form, HfRef, Progress, Source, Want};
pub use ui::{Asset, ASSETS as UI_ASSETS};
