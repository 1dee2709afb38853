//! Getting a model's weights before its engine starts: fetch them from the model's source (one
//! download however many instances and requests wait), show the progress on the instance, then
//! point the engine's command at the files.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Download, Inner};
use crate::config::engine::EngineModel;
use crate::sources::{Fetched, Progress};
use crate::supervisor::{ProcessSpec, StartError};

/// Fetches the weights of `engine` and returns `spec` with the engine's command over them; a spec
/// with nothing to fetch comes back as it was.
pub(super) async fn prepare(
    inner: &Arc<Inner>,
    id: &str,
    engine: Option<Arc<EngineModel>>,
    mut spec: ProcessSpec,
) -> Result<ProcessSpec, StartError> {
    let Some(engine) = engine.filter(|e| e.needs_fetch()) else {
        return Ok(spec);
    };
    let written = engine.source.to_string();
    inner.update(id, |i| i.phase.set_download(Some(Download::default())));
    // subscribed before the fetch begins, so no update of it is missed (the one that says a
    // download under way for another source serves this one too may be the last for a while);
    // ends with this function, or when the start is aborted and this future dropped
    let updates = inner.fetcher.subscribe();
    let _follower = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(follow_progress(
        inner.clone(),
        updates,
        id.to_string(),
        written.clone(),
    )));
    let fetched = fetch(inner, &engine).await;
    inner.update(id, |i| i.phase.set_download(None));
    let fetched = fetched.map_err(|error| StartError::Fetch { error })?;
    tracing::info!(
        instance = id,
        "weights of {written} at {} ({})",
        fetched.model.display(),
        crate::memory::format_bytes(fetched.bytes)
    );
    point_at(
        &mut spec,
        &engine,
        &written,
        &fetched,
        &inner.fetcher.ollama_store(),
    );
    scale_deadline(inner, id, &mut spec, fetched.bytes);
    Ok(spec)
}

/// The fetch, in a task of its own: the download goes on for other waiters (and resumes later)
/// whatever becomes of this start.
async fn fetch(inner: &Inner, engine: &EngineModel) -> Result<Fetched, String> {
    let fetcher = inner.fetcher.clone();
    let (source, want) = (engine.source.clone(), engine.want());
    let task = tokio::spawn(async move { fetcher.fetch(&source, &want).await });
    match tokio_util::task::AbortOnDropHandle::new(task).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the download task failed: {e}")),
    }
}

/// The load deadline scaled with the weights' size, now that it is known (it was the plain
/// health-check timeout while the source was only a name).
fn scale_deadline(inner: &Inner, id: &str, spec: &mut ProcessSpec, weights: u64) {
    let st = inner.lock();
    let Some(explicit) = st.instances.get(id).map(|i| i.model.load_timeout) else {
        return;
    };
    let health = st.config.health_check_timeout;
    spec.load_timeout =
        crate::memory::load_deadline(health, weights, st.config.load_bandwidth, explicit);
    spec.extend_on_progress = explicit.is_some() || spec.load_timeout > health;
}

/// Replaces the source as written in the command with the fetched files, and adds what the engine
/// needs knowing it has local files (a projector, offline mode).
fn point_at(
    spec: &mut ProcessSpec,
    engine: &EngineModel,
    written: &str,
    fetched: &Fetched,
    store: &std::path::Path,
) {
    let model = fetched.model.display().to_string();
    for arg in spec.argv.iter_mut().filter(|a| a.as_str() == written) {
        *arg = model.clone();
    }
    if let Some(mmproj) = &fetched.mmproj {
        if engine.kind == crate::engines::EngineKind::LlamaCpp
            && !spec.argv.iter().any(|a| a == "--mmproj" || a == "-mm")
        {
            spec.argv.push("--mmproj".into());
            spec.argv.push(mmproj.display().to_string());
        }
    }
    if engine.kind == crate::engines::EngineKind::Ollama {
        // the engine reads the store corral filled, and leaves it as it is: at its start
        // `ollama serve` removes the blobs no manifest names yet, which are the downloads corral
        // has under way for other models into the same store
        let store = ("OLLAMA_MODELS".to_string(), store.display().to_string());
        let keep = ("OLLAMA_NOPRUNE".to_string(), "1".to_string());
        for (key, value) in [store, keep] {
            if !spec.env.iter().any(|(k, _)| *k == key) {
                spec.env.push((key, value));
            }
        }
    }
    let port = spec_port(spec);
    for (key, value) in engine.engine_env_over(port, &model) {
        if !spec.env.iter().any(|(k, _)| *k == key) {
            spec.env.push((key, value));
        }
    }
}

fn spec_port(spec: &ProcessSpec) -> u16 {
    spec.base
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.port_u16())
        .unwrap_or(0)
}

/// Copies the fetcher's progress for this source onto the instance while the fetch runs: the
/// files it takes together, since several download at once.
async fn follow_progress(
    inner: Arc<Inner>,
    mut updates: tokio::sync::broadcast::Receiver<Progress>,
    id: String,
    source: String,
) {
    let mut files = BTreeMap::new();
    loop {
        match updates.recv().await {
            Ok(p) if p.source == source || p.also.contains(&source) => {
                files.insert(p.file.clone(), p);
                let download = download_of(&files);
                inner.update(&id, |i| {
                    // a late update must not bring back a download that has ended
                    if let Some(d) = i.phase.download_mut() {
                        *d = download;
                    }
                })
            }
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    }
}

/// The download of a source's files (the latest word on each) as one: bytes and totals added
/// up, the rate of those still coming, and the time left at that rate.
fn download_of(files: &BTreeMap<String, Progress>) -> Download {
    let done = |p: &Progress| p.total.is_some_and(|t| p.bytes >= t);
    let bytes = files.values().map(|p| p.bytes).sum::<u64>();
    let total = files.values().map(|p| p.total).sum::<Option<u64>>();
    let rate: f64 = (files.values().filter(|p| !done(p)))
        .map(|p| p.bytes_per_second)
        .sum();
    let eta_seconds = match total {
        Some(t) if rate > 0.0 => Some(t.saturating_sub(bytes) as f64 / rate),
        _ => None,
    };
    let file = match files.keys().collect::<Vec<_>>()[..] {
        [one] => one.clone(),
        ref all => format!("{} files", all.len()),
    };
    Download {
        file,
        bytes,
        total,
        bytes_per_second: rate,
        eta_seconds,
    }
}

/// Sizes each model named by a remote GGUF that is not in the caches yet from the file's header,
/// read in the background, so placement knows its size before the download (only where corral
/// places by memory).
pub(super) fn size_before_download(inner: &Arc<Inner>) {
    let models: Vec<Arc<crate::config::ModelConfig>> = {
        let st = inner.lock();
        if st.config.devices.is_empty() {
            return;
        }
        let mut seen = std::collections::BTreeMap::new();
        for i in st.instances.values() {
            let no_size = i.need.bytes == 0 && i.measured.is_none();
            if no_size && i.model.engine.as_ref().is_some_and(|e| e.needs_fetch()) {
                seen.entry(i.model.id.clone())
                    .or_insert_with(|| i.model.clone());
            }
        }
        seen.into_values().collect()
    };
    for model in models {
        let weak = Arc::downgrade(inner);
        inner.runtime.spawn(async move {
            let Some(fetcher) = weak.upgrade().map(|i| i.fetcher.clone()) else {
                return;
            };
            let engine = model.engine.as_ref().expect("an engine model");
            if fetcher
                .cached_for_sizing(&engine.source, &engine.want())
                .is_some()
            {
                return;
            }
            let sized = match engine.want().form {
                crate::sources::Form::File => fetcher
                    .probe_gguf(&engine.source, &engine.want())
                    .await
                    .map(|r| r.map(Sized::Header)),
                crate::sources::Form::Directory => fetcher
                    .probe_safetensors(&engine.source, &engine.want())
                    .await
                    .map(|r| r.map(Sized::Weights)),
            };
            match (sized, weak.upgrade()) {
                (Some(Ok(sized)), Some(inner)) => inner.size_before_start(&model, &sized),
                (Some(Err(e)), _) => {
                    tracing::info!(model = %model.id, "not sized before download: {e}")
                }
                _ => {}
            }
        });
    }
}

/// What a look at the remote weights told of their size.
enum Sized {
    /// A sparse stand-in for the model's GGUF, for the estimator.
    Header(std::path::PathBuf),
    /// The weights' bytes, from safetensors headers.
    Weights(u64),
}

impl Inner {
    /// Gives the instances of `model` that have no size yet the size `sized` says.
    fn size_before_start(&self, model: &crate::config::ModelConfig, sized: &Sized) {
        let engine = model.engine.as_ref().expect("an engine model");
        let mut st = self.lock();
        let health = st.config.health_check_timeout;
        let bandwidth = st.config.load_bandwidth;
        for spec in &model.instances {
            let Some(inst) = st.instances.get_mut(&spec.id) else {
                continue;
            };
            if inst.need.bytes != 0 || inst.measured.is_some() {
                continue;
            }
            let need = match sized {
                Sized::Header(header) => {
                    let shown = header.display().to_string();
                    let weights = crate::config::engine::Weights {
                        model: &shown,
                        mmproj: None,
                    };
                    let mut over = spec.clone();
                    over.argv = engine.argv(spec.port.unwrap_or(0), Some(weights));
                    super::ledger::need_of(model, &over)
                }
                Sized::Weights(bytes) => super::ledger::Need {
                    bytes: *bytes,
                    weights: *bytes,
                    host: model.memory.host.unwrap_or(0),
                    source: "the weights in its safetensors headers".into(),
                },
            };
            tracing::info!(
                instance = %spec.id,
                "sized before download: {} ({})",
                crate::memory::format_bytes(need.bytes),
                need.source
            );
            inst.spec.load_timeout =
                crate::memory::load_deadline(health, need.weights, bandwidth, model.load_timeout);
            inst.need = need;
        }
        drop(st);
        self.touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(file: &str, bytes: u64, total: u64, rate: f64) -> Progress {
        Progress {
            source: "hf://org/m".into(),
            file: file.into(),
            bytes,
            total: Some(total),
            bytes_per_second: rate,
            eta_seconds: None,
            also: Vec::new(),
        }
    }

    /// Four shards at once are one download: their bytes and totals added up, the rate of those
    /// still coming, not whichever shard spoke last.
    #[test]
    fn a_download_of_several_files_is_shown_as_one() {
        let mut files = BTreeMap::new();
        for p in [
            progress("model-1.safetensors", 100, 100, 50.0),
            progress("model-2.safetensors", 40, 100, 20.0),
            progress("model-3.safetensors", 60, 100, 30.0),
        ] {
            files.insert(p.file.clone(), p);
        }
        let d = download_of(&files);
        assert_eq!(
            (d.file.as_str(), d.bytes, d.total),
            ("3 files", 200, Some(300))
        );
        assert_eq!(
            d.bytes_per_second, 50.0,
            "the finished shard's rate is over"
        );
        assert_eq!(d.eta_seconds, Some(2.0));
        files.retain(|f, _| f == "model-2.safetensors");
        assert_eq!(download_of(&files).file, "model-2.safetensors");
    }
}
