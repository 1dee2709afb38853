//! Reloading the config on SIGHUP and, with `--watch-config`, when a config file changes; the TLS
//! certificate and key on SIGHUP.
//!
//! The watcher polls every two seconds, as llama-swap does, and compares each file's resolved path
//! as well as its size, modification time and inode: a ConfigMap mounted by Kubernetes changes by
//! swapping a symlink, which leaves the path the user gave untouched.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use corral::config::Sources;
use corral::{Reload, TlsCertificate};
use tokio::sync::mpsc;

fn load(sources: &Sources) -> Reload {
    if sources.file.is_none() && sources.dir.is_none() {
        return Err("the embedded demo config cannot be reloaded".into());
    }
    match corral::config::load(sources, &crate::env_lookup) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                tracing::warn!("config: {w}");
            }
            Ok(loaded.config)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// On each SIGHUP: the TLS certificate and key read again (when serving HTTPS), and the config.
/// The handler is in place when this returns, before the future is first polled: a SIGHUP
/// that comes once corral says it listens must not end it (the signal's default action).
pub fn on_sighup(
    sources: Sources,
    tls: Option<Arc<TlsCertificate>>,
    tx: mpsc::Sender<Reload>,
) -> impl std::future::Future<Output = ()> {
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        let Ok(mut hup) = hup else {
            return;
        };
        while hup.recv().await.is_some() {
            if let Some(tls) = &tls {
                reload_certificate(tls);
            }
            tracing::info!("SIGHUP: reloading the config");
            if tx.send(load(&sources)).await.is_err() {
                return;
            }
        }
    }
}

/// Reads the TLS files again; on failure the certificate in use stays, and the log says why.
fn reload_certificate(tls: &TlsCertificate) {
    match tls.reload() {
        Ok(()) => tracing::info!("SIGHUP: reloaded the TLS certificate and key"),
        Err(e) => tracing::warn!("TLS certificate reload failed, keeping the one in use: {e}"),
    }
}

/// What identifies a version of the config files.
type Stamp = Vec<(PathBuf, Option<PathBuf>, u64, Option<SystemTime>, u64)>;

fn stamp(sources: &Sources) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let files = sources.files().unwrap_or_default();
    files
        .into_iter()
        .map(|p| {
            let resolved = std::fs::canonicalize(&p).ok();
            let meta = std::fs::metadata(&p).ok();
            let (size, mtime, inode) =
                meta.map_or((0, None, 0), |m| (m.len(), m.modified().ok(), m.ino()));
            (p, resolved, size, mtime, inode)
        })
        .collect()
}

pub async fn watch(sources: Sources, tx: mpsc::Sender<Reload>) {
    let mut last = stamp(&sources);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let now = stamp(&sources);
        if now != last {
            last = now;
            tracing::info!("config changed: reloading");
            if tx.send(load(&sources)).await.is_err() {
                return;
            }
        }
    }
}
