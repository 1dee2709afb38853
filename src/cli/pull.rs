//! `corral pull`: fetch the weights of configured models without starting any engine, so a host
//! can be readied ahead of traffic (an image build, a deploy step) and the first request does not
//! wait on a download.

mod show;

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;

use corral::config::engine::EngineModel;
use corral::config::Config;
use corral::{FetchError, Fetcher};
use tokio::sync::{broadcast, Semaphore};
use tokio::task::JoinSet;

use show::Show;

/// Downloads run at once; more would split the bandwidth without finishing any model sooner.
const AT_ONCE: usize = 3;

/// One model to fetch.
struct Item {
    id: String,
    engine: Arc<EngineModel>,
}

/// Fetches the weights of `names` (every model with a source when empty). Exit 0 when all are
/// on disk, 1 naming each model that failed (after the others finished), 2 for an unknown name.
pub fn run(config: &Config, names: &[String]) -> ExitCode {
    let items = match select(config, names) {
        Ok(items) => items,
        Err(msg) => {
            eprintln!("corral pull: {msg}");
            return ExitCode::from(2);
        }
    };
    if items.is_empty() {
        println!("nothing to pull: no model named has a source");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("corral pull: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = runtime.block_on(pull_all(items));
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    for (id, e) in &failed {
        eprintln!("corral pull: {id}: {e}");
    }
    let ids: Vec<&str> = failed.iter().map(|(id, _)| id.as_str()).collect();
    eprintln!(
        "corral pull: {} failed: {}",
        plural(ids.len(), "model"),
        ids.join(", ")
    );
    ExitCode::FAILURE
}

/// The models to fetch, in config order. Names are checked before anything downloads; a model
/// that runs a plain `cmd` is skipped with a note, as it has nothing to fetch.
fn select(config: &Config, names: &[String]) -> Result<Vec<Item>, String> {
    if names.is_empty() {
        let with_source = config.models.values().filter_map(|m| {
            let engine = m.engine.clone()?;
            Some(Item {
                id: m.id.to_string(),
                engine,
            })
        });
        return Ok(with_source.collect());
    }
    let unknown: Vec<&str> = names
        .iter()
        .filter(|n| config.real_model_name(n).is_none())
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
        return Err(format!(
            "unknown {}: {}; the config has: {}",
            if unknown.len() == 1 {
                "model"
            } else {
                "models"
            },
            unknown.join(", "),
            known.join(", ")
        ));
    }
    let mut seen = BTreeSet::new();
    let mut items = Vec::new();
    for name in names {
        let id = config.real_model_name(name).unwrap_or(name);
        if !seen.insert(id.to_string()) {
            continue;
        }
        match config.models.get(id).and_then(|m| m.engine.clone()) {
            Some(engine) => items.push(Item {
                id: id.to_string(),
                engine,
            }),
            None => println!("{id}: skipped, it runs its cmd and has no source to fetch"),
        }
    }
    Ok(items)
}

/// Fetches every item, [`AT_ONCE`] at a time, and returns the failures.
async fn pull_all(items: Vec<Item>) -> Vec<(String, FetchError)> {
    let fetcher = Fetcher::from_env(&|name| std::env::var(name).ok());
    let show = Arc::new(Show::new(
        items
            .iter()
            .map(|i| (i.engine.source.to_string(), i.id.clone())),
    ));
    let watcher = tokio::spawn(watch(fetcher.subscribe(), show.clone()));
    let slots = Arc::new(Semaphore::new(AT_ONCE));
    let mut running = JoinSet::new();
    for item in items {
        let want = item.engine.want();
        if let Some(done) = fetcher.cached(&item.engine.source, &want) {
            show.cached(&item.id, &done);
            continue;
        }
        let (fetcher, show, slots) = (fetcher.clone(), show.clone(), slots.clone());
        running.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let source = &item.engine.source;
            let result = fetcher.fetch(source, &want).await;
            show.finished(&item.id, &source.to_string(), result.as_ref().ok());
            (item.id, result)
        });
    }
    let mut failed = Vec::new();
    while let Some(joined) = running.join_next().await {
        match joined {
            Ok((id, Err(e))) => failed.push((id, e)),
            Ok((_, Ok(_))) => {}
            Err(e) => eprintln!("corral pull: a fetch stopped: {e}"),
        }
    }
    watcher.abort();
    failed.sort_by(|a, b| a.0.cmp(&b.0));
    failed
}

/// Shows progress updates as they come, until aborted.
async fn watch(mut updates: broadcast::Receiver<corral::Progress>, show: Arc<Show>) {
    loop {
        match updates.recv().await {
            Ok(p) => show.progress(&p),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}
