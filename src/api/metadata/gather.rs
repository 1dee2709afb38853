//! Collecting the facts the rules read: the launch from the config or the running command line,
//! the GGUF headers (read once per file version, off the serving threads), and the context a
//! running engine reports in `/props` (asked once per process).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::SystemTime;

use serde_json::Value;

use super::{Facts, GgufFacts, Launch, Projector};
use crate::config::ModelConfig;
use crate::fleet::{PhaseName, Snapshot};
use crate::memory::parse_llama_args;

/// A file's identity: a changed file is read again.
type FileKey = (PathBuf, u64, Option<SystemTime>);

/// GGUF headers read so far, by file; `None` for a file that is not a readable GGUF.
static HEADERS: LazyLock<Mutex<HashMap<FileKey, Option<GgufFacts>>>> =
    LazyLock::new(Mutex::default);

/// An engine process: its instance and process id.
type Process = (String, u32);

/// What running engines reported in `/props`, by process.
static RUNNING: LazyLock<Mutex<HashMap<Process, Option<u64>>>> = LazyLock::new(Mutex::default);

fn key_of(path: &Path) -> Option<FileKey> {
    let meta = std::fs::metadata(path).ok()?;
    Some((path.to_path_buf(), meta.len(), meta.modified().ok()))
}

/// The facts of one model, from what is cached: the command line its process runs (`argv`) or the
/// configured one, its GGUF and projector, and its engine's `/props`.
pub fn facts_for(model: &ModelConfig, running: Option<&Snapshot>) -> Facts {
    let argv = running
        .and_then(|s| s.argv.as_deref())
        .or_else(|| model.instances.first().map(|i| i.argv.as_slice()))
        .unwrap_or(&model.argv);
    let launch = match &model.engine {
        Some(e) => Launch::engine(e.ctx, e.slots),
        None => Launch::from_argv(argv),
    };
    let args = parse_llama_args(argv);
    let cached = |p: &Path| {
        let key = key_of(p)?;
        HEADERS.lock().ok()?.get(&key).cloned().flatten()
    };
    let projector = args.mmproj.as_deref().map(|p| match cached(p) {
        Some(g) if g.vision || g.audio => Projector {
            vision: g.vision,
            audio: g.audio,
        },
        _ => Projector {
            vision: true,
            audio: false,
        },
    });
    let running_ctx = running.and_then(|s| {
        let pid = s.pid?;
        let known = RUNNING.lock().ok()?;
        known.get(&(s.instance.clone(), pid)).copied().flatten()
    });
    Facts {
        launch,
        gguf: args.model.as_deref().and_then(cached),
        projector,
        running_ctx,
    }
}

/// Reads the GGUF files of `argvs` (model and projector) that are not read yet, on a blocking
/// thread: a header with a large vocabulary takes a while.
pub async fn read_headers(argvs: Vec<Vec<String>>) {
    let paths: Vec<PathBuf> = argvs
        .iter()
        .flat_map(|argv| {
            let a = parse_llama_args(argv);
            a.model.into_iter().chain(a.mmproj)
        })
        .collect();
    let unread: Vec<(FileKey, PathBuf)> = {
        let Ok(known) = HEADERS.lock() else { return };
        paths
            .into_iter()
            .filter_map(|p| Some((key_of(&p)?, p)))
            .filter(|(k, _)| !known.contains_key(k))
            .collect()
    };
    if unread.is_empty() {
        return;
    }
    let read = tokio::task::spawn_blocking(move || {
        unread
            .into_iter()
            .map(|(k, p)| (k, gguf_facts(&p)))
            .collect::<Vec<_>>()
    })
    .await;
    if let (Ok(read), Ok(mut known)) = (read, HEADERS.lock()) {
        known.extend(read);
    }
}

/// The facts of one GGUF file (every part of a split one), or `None` when it is not one.
fn gguf_facts(path: &Path) -> Option<GgufFacts> {
    let model = gguf::read_model(path).ok()?;
    Some(facts_of_header(
        &model.header,
        model.n_elements(),
        model.tensor_bytes(),
    ))
}

/// What a header says, with the parameter count and weight bytes of the whole model.
pub(crate) fn facts_of_header(h: &gguf::Header, n_params: u64, size: u64) -> GgufFacts {
    let flag = |k: &str| h.get_bool(k).unwrap_or(false);
    let template = h.get_str("tokenizer.chat_template").unwrap_or("");
    GgufFacts {
        n_ctx_train: h.arch_u64("context_length"),
        n_params,
        size,
        vision: flag("clip.has_vision_encoder"),
        audio: flag("clip.has_audio_encoder"),
        tools: template.contains("tools"),
    }
}

/// Asks each ready engine not asked yet for its per-request context (`/props`), and forgets the
/// processes that no longer run.
pub async fn learn_running(config: &crate::config::Config, snapshot: &[Snapshot]) {
    let ready: Vec<(String, u32, String)> = snapshot
        .iter()
        .filter(|s| s.state == PhaseName::Ready)
        .filter_map(|s| Some((s.instance.clone(), s.pid?, base_of(config, s)?)))
        .collect();
    forget_stopped(&ready);
    let unasked: Vec<_> = {
        let Ok(known) = RUNNING.lock() else { return };
        ready
            .into_iter()
            .filter(|(id, pid, _)| !known.contains_key(&(id.clone(), *pid)))
            .collect()
    };
    let asks = unasked
        .into_iter()
        .map(|(id, pid, base)| async move { ((id, pid), props_context(&base).await) });
    let answers = futures_util::future::join_all(asks).await;
    if let Ok(mut known) = RUNNING.lock() {
        known.extend(answers);
    }
}

/// Drops what was learned of processes that are not among `ready` (instance, pid): a restarted
/// engine is asked again.
pub fn forget_stopped(ready: &[(String, u32, String)]) {
    if let Ok(mut known) = RUNNING.lock() {
        known.retain(|(id, pid), _| ready.iter().any(|(i, p, _)| i == id && p == pid));
    }
}

/// The base URL of a snapshot's instance.
pub(crate) fn base_of(config: &crate::config::Config, s: &Snapshot) -> Option<String> {
    let model = config.models.get(&s.model)?;
    let spec = model.instances.iter().find(|i| i.id == s.instance)?;
    Some(spec.proxy.trim_end_matches('/').to_string())
}

/// `default_generation_settings.n_ctx` (per slot), else `n_ctx`, of an engine's `/props`.
async fn props_context(base: &str) -> Option<u64> {
    let client = crate::supervisor::HealthClient::default();
    let (status, body) = client.get(format!("{base}/props")).await?;
    if !status.is_success() {
        return None;
    }
    context_of_props(&serde_json::from_slice(&body).ok()?)
}

/// The per-request context in a `/props` answer.
pub(crate) fn context_of_props(props: &Value) -> Option<u64> {
    props["default_generation_settings"]["n_ctx"]
        .as_u64()
        .or_else(|| props["n_ctx"].as_u64())
        .filter(|n| *n > 0)
}
