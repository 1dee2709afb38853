//! Top-level settings: health checks, logging, the performance monitor, the UI, lifetimes,
//! paths passed through upstream, and startup preloads.

use std::collections::BTreeMap;
use std::time::Duration;

use super::api_keys::{decode_allowed_hosts, decode_api_keys};
use super::parse::parse_go_duration;
use crate::config::read::MapReader;
use crate::config::{ApiKey, ConfigError, LogToStdout, Profile};

/// The settings read before the models, which take their defaults from some of them.
pub(super) struct Settings<'n> {
    pub health: i64,
    pub log_level: String,
    pub log_to_stdout: LogToStdout,
    /// `performance`, kept to read `disabled` with the settings read last.
    pub perf: MapReader<'n>,
    pub performance_every: Duration,
    /// `store`, kept to read `path` with the settings read last.
    pub store: MapReader<'n>,
    pub session_headers: Vec<String>,
    pub global_ttl: i64,
    pub unload: i64,
    pub api_keys: Vec<ApiKey>,
    pub open_metrics: bool,
    pub ollama_api: bool,
    pub allowed_hosts: Vec<String>,
    pub send_loading_state: bool,
}

pub(super) fn decode_settings<'n>(
    top: &MapReader<'n>,
    warnings: &mut Vec<String>,
) -> Result<Settings<'n>, ConfigError> {
    let health = health_check_timeout(top, warnings)?;
    let log_level = log_level(top)?;
    let log_to_stdout = log_to_stdout(top)?;
    let perf = top.child("performance", &["disabled", "every"], warnings)?;
    let performance_every = performance_every(&perf)?;
    Ok(Settings {
        health,
        log_level,
        log_to_stdout,
        perf,
        performance_every,
        store: top.child("store", &["path"], warnings)?,
        session_headers: session_headers(top, warnings)?,
        global_ttl: global_ttl(top)?,
        unload: unload_timeout(top)?,
        api_keys: decode_api_keys(top, warnings)?,
        open_metrics: top.boolean("openMetrics")?.unwrap_or(false),
        ollama_api: top.boolean("ollamaApi")?.unwrap_or(true),
        allowed_hosts: decode_allowed_hosts(top)?,
        send_loading_state: top.boolean("sendLoadingState")?.unwrap_or(false),
    })
}

/// `logLevel`: `info` unless it is one of the levels.
fn log_level(top: &MapReader<'_>) -> Result<String, ConfigError> {
    Ok(match top.string("logLevel")?.as_deref() {
        Some(l @ ("debug" | "info" | "warn" | "error")) => l.to_string(),
        _ => "info".to_string(),
    })
}

/// `healthCheckTimeout`: 120 s unless given, never below llama-swap's floor of 15 s.
fn health_check_timeout(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<i64, ConfigError> {
    let mut health = top.int("healthCheckTimeout")?.unwrap_or(120);
    if health < 15 {
        warnings.push(format!(
            "healthCheckTimeout {health} is below 15 s; using 15 s as llama-swap does"
        ));
        health = 15;
    }
    Ok(health)
}

/// `logToStdout`: `proxy` unless given; an empty value is refused, as llama-swap refuses it.
fn log_to_stdout(top: &MapReader<'_>) -> Result<LogToStdout, ConfigError> {
    match top.string("logToStdout")? {
        None => Ok(LogToStdout::default()),
        Some(value) => LogToStdout::parse(&value).map_err(|msg| top.err_named("logToStdout", msg)),
    }
}

/// `globalConcurrencyLimit`: model requests served at once across all models; 0 (the default)
/// is no limit.
pub(super) fn global_concurrency_limit(top: &MapReader<'_>) -> Result<usize, ConfigError> {
    let limit = top.int("globalConcurrencyLimit")?.unwrap_or(0);
    usize::try_from(limit).map_err(|_| {
        top.err_named(
            "globalConcurrencyLimit",
            "globalConcurrencyLimit must be >= 0",
        )
    })
}

/// `performance.every`: a Go duration, 5 s unless given, and no shorter.
fn performance_every(perf: &MapReader<'_>) -> Result<Duration, ConfigError> {
    let every = match perf.string("every")? {
        None => Duration::from_secs(5),
        Some(s) => parse_go_duration(&s).ok_or_else(|| {
            perf.err(
                "every",
                format!("{s:?} is not a duration like 5s or 1m, up to 2562047h"),
            )
        })?,
    };
    if every < Duration::from_secs(5) {
        return Err(perf.err("every", "must be at least 5s"));
    }
    Ok(every)
}

/// `ui.activity.session_id`: the request headers that group activity into sessions.
fn session_headers(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<String>, ConfigError> {
    let ui = top.child("ui", &["activity"], warnings)?;
    let activity = ui.child("activity", &["session_id"], warnings)?;
    Ok(if activity.get("session_id").is_some() {
        activity.strings("session_id")?
    } else {
        vec!["X-Session-ID".into(), "X-Litellm-Session-Id".into()]
    })
}

/// `globalTTL`: seconds, 0 (never unload) unless given.
fn global_ttl(top: &MapReader<'_>) -> Result<i64, ConfigError> {
    let global_ttl = top.int("globalTTL")?.unwrap_or(0);
    if global_ttl < 0 {
        return Err(top.err("globalTTL", "must be 0 or more"));
    }
    Ok(global_ttl)
}

/// `unloadTimeout`: seconds, 0 (or none) meaning 10.
fn unload_timeout(top: &MapReader<'_>) -> Result<i64, ConfigError> {
    let unload = top.int("unloadTimeout")?.unwrap_or(0);
    if unload < 0 {
        return Err(top.err("unloadTimeout", "must be 0 or more"));
    }
    Ok(if unload == 0 { 10 } else { unload })
}

/// `upstream.ignorePaths`: paths under `/upstream/` that do not count as activity.
pub(super) fn ignore_paths(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<regex::Regex>, ConfigError> {
    let upstream = top.child("upstream", &["ignorePaths"], warnings)?;
    let mut ignore = upstream.strings("ignorePaths")?;
    if ignore.is_empty() {
        ignore.push(r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$".into());
    }
    ignore
        .iter()
        .map(|p| {
            regex::Regex::new(p)
                .map_err(|e| upstream.err("ignorePaths", format!("invalid regex {p:?}: {e}")))
        })
        .collect()
}

/// `hooks.on_startup`: the models loaded when corral starts (`preload`), and the profile active
/// at start and after every reload (`profile`), which must name one of `profiles`.
pub(super) fn on_startup(
    top: &MapReader<'_>,
    profiles: &BTreeMap<String, Profile>,
    warnings: &mut Vec<String>,
) -> Result<(Vec<String>, Option<String>), ConfigError> {
    let hooks = top.child("hooks", &["on_startup"], warnings)?;
    let on_startup = hooks.child("on_startup", &["preload", "profile"], warnings)?;
    let preload = on_startup.strings("preload")?;
    let profile = on_startup.string("profile")?.filter(|p| !p.is_empty());
    if let Some(name) = profile.as_ref().filter(|p| !profiles.contains_key(*p)) {
        return Err(on_startup.err_named(
            "profile",
            format!("hooks.on_startup.profile references unknown profile {name:?}"),
        ));
    }
    Ok((preload, profile))
}

/// Settings read after everything else, so that a config with several errors reports the
/// same one first as it always has.
pub(super) struct LateSettings {
    pub log_time_format: String,
    pub metrics_max_in_memory: u64,
    pub vllm_metric_names: bool,
    pub capture_buffer_mb: u64,
    pub store_path: Option<String>,
    pub performance_disabled: bool,
    pub start_port: u16,
    pub include_aliases_in_list: bool,
}

pub(super) fn decode_late_settings(
    top: &MapReader<'_>,
    s: &Settings<'_>,
) -> Result<LateSettings, ConfigError> {
    Ok(LateSettings {
        log_time_format: top.string("logTimeFormat")?.unwrap_or_default(),
        metrics_max_in_memory: top
            .int("metricsMaxInMemory")?
            .filter(|v| *v > 0)
            .unwrap_or(1000) as u64,
        vllm_metric_names: top.boolean("vllmMetricNames")?.unwrap_or(false),
        capture_buffer_mb: top.int("captureBuffer")?.unwrap_or(5).max(0) as u64,
        store_path: s.store.string("path")?,
        performance_disabled: s.perf.boolean("disabled")?.unwrap_or(false),
        start_port: top.int("startPort")?.unwrap_or(5800) as u16,
        include_aliases_in_list: top.boolean("includeAliasesInList")?.unwrap_or(false),
    })
}
