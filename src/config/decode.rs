//! From the expanded tree to the typed [`Config`], with llama-swap's defaults and validation (§1.2-1.4).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::read::MapReader;
use super::yaml::{Node, Value};
use super::*;

const TOP_KEYS: &[&str] = &[
    "healthCheckTimeout",
    "logLevel",
    "logTimeFormat",
    "logToStdout",
    "logRequests",
    "metricsMaxInMemory",
    "captureBuffer",
    "store",
    "ui",
    "performance",
    "startPort",
    "sendLoadingState",
    "includeAliasesInList",
    "globalTTL",
    "unloadTimeout",
    "macros",
    "apiKeys",
    "models",
    "profiles",
    "selectors",
    "peers",
    "upstream",
    "hooks",
    "routing",
    "groups",
    "matrix",
    // corral's own
    "devices",
    "deviceRefresh",
    "loadBandwidth",
    "loadStallTimeout",
    "maxConnections",
    "maxBufferedBodies",
    "vllmMetricNames",
    "clientTimeouts",
    "engines",
];

const MODEL_KEYS: &[&str] = &[
    "cmd",
    "cmdStop",
    "proxy",
    "aliases",
    "env",
    "checkEndpoint",
    "ttl",
    "unloadTimeout",
    "unlisted",
    "useModelName",
    "name",
    "description",
    "concurrencyLimit",
    "filters",
    "macros",
    "metadata",
    "sendLoadingState",
    "timeouts",
    "compat",
    "capabilities",
    "healthCheckTimeout",
    // corral's own
    "replicas",
    "startReplicas",
    "queueDepth",
    "queueTimeout",
    "slotsPollInterval",
    "balance",
    "memory",
    "placement",
    "loadTimeout",
    super::expand::REPLICAS_KEY,
    // what to serve and how (see `engine.rs`)
    "engine",
    "source",
    "sha256",
    "ctx",
    "slots",
    "args",
    "task",
    "quantization",
    "params",
];

const TIMEOUT_KEYS: &[&str] = &[
    "connect",
    "keepalive",
    "responseHeader",
    "tlsHandshake",
    "expectContinue",
    "idleConn",
    "streamIdle",
];
const MODALITIES: &[&str] = &["text", "audio", "image"];

fn secs(n: i64) -> Duration {
    Duration::from_secs(n.max(0) as u64)
}

pub fn decode(root: &Node, warnings: &mut Vec<String>) -> Result<Config, ConfigError> {
    let top = MapReader::new(root, "", TOP_KEYS, warnings)?;

    let mut health = top.int("healthCheckTimeout")?.unwrap_or(120);
    if health < 15 {
        warnings.push(format!(
            "healthCheckTimeout {health} is below 15 s; using 15 s as llama-swap does"
        ));
        health = 15;
    }
    let log_level = match top.string("logLevel")?.as_deref() {
        Some(l @ ("debug" | "info" | "warn" | "error")) => l.to_string(),
        _ => "info".to_string(),
    };
    let log_to_stdout = match top.string("logToStdout")?.as_deref() {
        None | Some("proxy") => LogToStdout::Proxy,
        Some("upstream") => LogToStdout::Upstream,
        Some("both") => LogToStdout::Both,
        Some("none") => LogToStdout::None,
        Some(other) => {
            return Err(top.err(
                "logToStdout",
                format!("must be proxy, upstream, both or none, not {other:?}"),
            ))
        }
    };
    let perf = top.child("performance", &["disabled", "every"], warnings)?;
    let every = match perf.string("every")? {
        None => Duration::from_secs(5),
        Some(s) => parse_go_duration(&s)
            .ok_or_else(|| perf.err("every", format!("{s:?} is not a duration like 5s or 1m")))?,
    };
    if every < Duration::from_secs(5) {
        return Err(perf.err("every", "must be at least 5s"));
    }
    let store = top.child("store", &["path"], warnings)?;
    let ui = top.child("ui", &["activity"], warnings)?;
    let activity = ui.child("activity", &["session_id"], warnings)?;
    let session_headers = if activity.get("session_id").is_some() {
        activity.strings("session_id")?
    } else {
        vec!["X-Session-ID".into(), "X-Litellm-Session-Id".into()]
    };
    let global_ttl = top.int("globalTTL")?.unwrap_or(0);
    if global_ttl < 0 {
        return Err(top.err("globalTTL", "must be 0 or more"));
    }
    let unload = top.int("unloadTimeout")?.unwrap_or(0);
    if unload < 0 {
        return Err(top.err("unloadTimeout", "must be 0 or more"));
    }
    let unload = if unload == 0 { 10 } else { unload };
    let api_keys = decode_api_keys(&top, warnings)?;
    let send_loading_state = top.boolean("sendLoadingState")?.unwrap_or(false);

    let models_node = top.child("models", &[], &mut Vec::new())?;
    let engines = super::engine::decode_engines(&top, warnings)?;
    let devices = super::memory::devices(&top, warnings)?;
    let mut models = BTreeMap::new();
    for (id, node) in models_node.entries() {
        let defaults = ModelDefaults {
            engines: engines.clone(),
            global_ttl,
            unload,
            send_loading_state,
            devices: devices.clone(),
        };
        let model = decode_model(id, node, &defaults, warnings)?;
        models.insert(id.clone(), model);
    }
    register_aliases(&mut models, &models_node)?;

    let upstream = top.child("upstream", &["ignorePaths"], warnings)?;
    let mut ignore = upstream.strings("ignorePaths")?;
    if ignore.is_empty() {
        ignore.push(r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$".into());
    }
    let ignore_paths = ignore
        .iter()
        .map(|p| {
            regex::Regex::new(p)
                .map_err(|e| upstream.err("ignorePaths", format!("invalid regex {p:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let hooks = top.child("hooks", &["on_startup"], warnings)?;
    let preload = hooks
        .child("on_startup", &["preload"], warnings)?
        .strings("preload")?;

    let routing = top.child("routing", &["router", "scheduler"], warnings)?;
    let router = routing.child("router", &["use", "settings"], warnings)?;
    let router_use = router.string("use")?.unwrap_or_else(|| "group".into());
    if router_use != "group" && router_use != "matrix" {
        return Err(router.err(
            "use",
            format!("must be group or matrix, not {router_use:?}"),
        ));
    }
    let settings = router.child("settings", &["groups", "matrix"], warnings)?;
    let scheduler = routing.child("scheduler", &["use", "settings"], warnings)?;
    if let Some(s) = scheduler.string("use")? {
        if s != "fifo" {
            return Err(scheduler.err("use", format!("only fifo is supported, not {s:?}")));
        }
    }
    let fifo =
        scheduler
            .child("settings", &["fifo"], warnings)?
            .child("fifo", &["priority"], warnings)?;
    let priority = fifo.child("priority", &[], &mut Vec::new())?;
    let mut fifo_priority = BTreeMap::new();
    for (name, _) in priority.entries() {
        let value = priority.int(name)?.unwrap_or(0);
        let known = models.contains_key(name) || models.values().any(|m| m.aliases.contains(name));
        if !known {
            return Err(priority.err(name, "is not a model id or alias"));
        }
        fifo_priority.insert(name.clone(), value);
    }

    let legacy_groups = top.get("groups").is_some();
    let legacy_matrix = top.get("matrix").is_some();
    if (legacy_groups || legacy_matrix) && router.get("use").or(router.get("settings")).is_some() {
        let key = if legacy_groups { "groups" } else { "matrix" };
        return Err(top.err(
            key,
            "top-level groups/matrix cannot be combined with routing.router settings",
        ));
    }
    if legacy_groups && legacy_matrix {
        return Err(top.err("matrix", "use either groups or matrix, not both"));
    }
    let (groups_reader, matrix_reader) = if legacy_groups || legacy_matrix {
        (
            top.child("groups", &[], &mut Vec::new())?,
            top.child("matrix", &["vars", "evict_costs", "sets"], warnings)?,
        )
    } else {
        (
            settings.child("groups", &[], &mut Vec::new())?,
            settings.child("matrix", &["vars", "evict_costs", "sets"], warnings)?,
        )
    };
    let groups = decode_groups(&groups_reader, &models, !devices.is_empty(), warnings)?;
    let use_matrix = router_use == "matrix" || legacy_matrix;
    let matrix = if use_matrix {
        Some(decode_matrix(&matrix_reader, &models)?)
    } else {
        None
    };
    let router = match &matrix {
        None => None,
        Some(m) => {
            let ids = models.keys().cloned().collect();
            let sets = m.sets.clone();
            let compiled = crate::matrix::Matrix::compile(&m.vars, &m.evict_costs, &sets, &ids)
                .map_err(|e| matrix_reader.err("sets", e))?;
            Some(Arc::new(compiled))
        }
    };

    let profiles = decode_profiles(&top, warnings)?;
    let selectors = decode_selectors(&top, warnings)?;
    let peers = decode_peers(&top, &models, warnings)?;

    let load_bandwidth = super::memory::load_bandwidth(&top)?;
    let device_refresh = super::memory::device_refresh(&top)?;
    let load_stall =
        super::memory::seconds(&top, "loadStallTimeout")?.unwrap_or(Duration::from_secs(30));
    let server = super::server::decode(&top, warnings)?;
    Ok(Config {
        server,
        router,
        devices,
        load_bandwidth,
        device_refresh,
        load_stall,
        health_check_timeout: secs(health),
        log_level,
        log_time_format: top.string("logTimeFormat")?.unwrap_or_default(),
        log_to_stdout,
        metrics_max_in_memory: top
            .int("metricsMaxInMemory")?
            .filter(|v| *v > 0)
            .unwrap_or(1000) as u64,
        vllm_metric_names: top.boolean("vllmMetricNames")?.unwrap_or(false),
        capture_buffer_mb: top.int("captureBuffer")?.unwrap_or(5).max(0) as u64,
        store_path: store.string("path")?,
        ui_session_headers: session_headers,
        performance_disabled: perf.boolean("disabled")?.unwrap_or(false),
        performance_every: every,
        start_port: top.int("startPort")?.unwrap_or(5800) as u16,
        send_loading_state,
        include_aliases_in_list: top.boolean("includeAliasesInList")?.unwrap_or(false),
        global_ttl: secs(global_ttl),
        unload_timeout: secs(unload),
        api_keys,
        redactor: Default::default(),
        models,
        groups,
        profiles,
        selectors,
        peers,
        ignore_paths,
        preload,
        fifo_priority,
    })
}

struct ModelDefaults {
    engines: BTreeMap<&'static str, super::engine::EngineSettings>,
    global_ttl: i64,
    unload: i64,
    send_loading_state: bool,
    devices: Vec<Device>,
}

fn decode_model(
    id: &str,
    node: &Node,
    d: &ModelDefaults,
    warnings: &mut Vec<String>,
) -> Result<ModelConfig, ConfigError> {
    let m = MapReader::new(node, &format!("models.{id}"), MODEL_KEYS, warnings)?;
    if id.is_empty() || id.contains(char::is_whitespace) {
        return Err(ConfigError::at(
            node.loc.clone(),
            Some(m.path.clone()),
            "model ids must be non-empty and contain no spaces".into(),
        ));
    }
    let engine = super::engine::decode_model_engine(id, &m, &d.engines, warnings)?;
    let proxy = m.string("proxy")?.unwrap_or_default();
    let port = parse_proxy(&proxy).map_err(|e| m.err("proxy", e))?;
    let argv = match &engine {
        Some(e) => e.argv(port.unwrap_or(0), None),
        None => {
            let cmd = m.string("cmd")?.unwrap_or_default();
            split_command(&cmd).map_err(|e| m.err("cmd", e))?
        }
    };
    let cmd_stop = match m.string("cmdStop")? {
        Some(s) if !s.trim().is_empty() => {
            Some(split_command(&s).map_err(|e| m.err("cmdStop", e))?)
        }
        _ => None,
    };
    let env = m
        .strings("env")?
        .into_iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(m.err("env", format!("{e:?} is not NAME=value"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    m.string("checkEndpoint")?; // a mapping or a list is an error
    let check_endpoint = match (&engine, m.node.get("checkEndpoint")) {
        (Some(e), None) => Some(e.kind.readiness().path.to_string()),
        (_, given) => decode_check_endpoint(given),
    };
    let ttl = match m.int("ttl")?.unwrap_or(-1) {
        -1 => d.global_ttl,
        t if t < 0 => {
            return Err(m.err(
                "ttl",
                "must be -1 (use globalTTL), 0 (never) or a number of seconds",
            ))
        }
        t => t,
    };
    let unload = match m.int("unloadTimeout")?.unwrap_or(0) {
        0 => d.unload,
        t if t < 0 => return Err(m.err("unloadTimeout", "must be 0 or more")),
        t => t,
    };
    let mut limit = m.int("concurrencyLimit")?.unwrap_or(0);
    if limit < 0 {
        return Err(m.err("concurrencyLimit", "must be 0 or more"));
    }
    if id == "comfyui_auto" {
        limit = limit.max(50);
    }
    let name = m.string("name")?;
    if name.as_ref().is_some_and(|n| n.chars().count() > 128) {
        return Err(m.err("name", "must be at most 128 characters"));
    }
    let description = m.string("description")?;
    if description
        .as_ref()
        .is_some_and(|n| n.chars().count() > 1024)
    {
        return Err(m.err("description", "must be at most 1024 characters"));
    }
    let metadata = match m.get("metadata") {
        None => serde_json::Map::new(),
        Some(n) => match n.to_json() {
            serde_json::Value::Object(o) => o,
            _ => return Err(m.err("metadata", "must be a mapping")),
        },
    };
    let caps = m.child(
        "capabilities",
        &["in", "out", "tools", "reranker", "context"],
        warnings,
    )?;
    let capabilities = Capabilities {
        input: modalities(&caps, "in")?,
        output: modalities(&caps, "out")?,
        tools: caps.boolean("tools")?.unwrap_or(false),
        reranker: caps.boolean("reranker")?.unwrap_or(false),
        context: match caps.int("context")? {
            Some(c) if c < 0 => return Err(caps.err("context", "must be 0 or more")),
            c => c.unwrap_or(0) as u64,
        },
    };
    let compat = m.child("compat", &["ignoreWebsockets"], warnings)?;
    let shape = InstanceShape {
        argv: &argv,
        cmd_stop: &cmd_stop,
        proxy: &proxy,
        port,
        check_endpoint: &check_endpoint,
        engine: engine.as_ref(),
    };
    let instances = decode_instances(id, &m, &shape)?;
    let pool = decode_pool(&m)?;
    let mut memory = super::memory::memory_spec(&m, &d.devices, warnings)?;
    super::memory::size_from_params(&m, &mut memory)?;
    memory.pack = match m.string("placement")?.as_deref() {
        None | Some("spread") => false,
        Some("pack") => true,
        Some(other) => {
            return Err(m.err(
                "placement",
                format!("must be spread or pack, not {other:?}"),
            ))
        }
    };
    let load_timeout = super::memory::seconds(&m, "loadTimeout")?;
    let ollama_name = engine.as_ref().and_then(|e| e.ollama_name());
    Ok(ModelConfig {
        engine: engine.map(std::sync::Arc::new),
        memory,
        load_timeout,
        instances,
        pool,
        id: id.to_string(),
        argv,
        cmd_stop,
        proxy,
        port,
        aliases: m.strings("aliases")?,
        env,
        check_endpoint,
        ttl: (ttl > 0).then(|| secs(ttl)),
        unload_timeout: secs(unload),
        unlisted: m.boolean("unlisted")?.unwrap_or(false),
        use_model_name: m
            .string("useModelName")?
            .filter(|s| !s.is_empty())
            .or(ollama_name),
        name: name.filter(|s| !s.is_empty()),
        description: description.filter(|s| !s.is_empty()),
        concurrency_limit: if limit == 0 { 10 } else { limit as usize },
        filters: decode_filters(&m, MODEL_FILTER_KEYS, warnings)?,
        metadata,
        send_loading_state: m
            .boolean("sendLoadingState")?
            .unwrap_or(d.send_loading_state),
        timeouts: decode_timeouts(&m.child("timeouts", TIMEOUT_KEYS, warnings)?, None)?,
        ignore_websockets: compat.boolean("ignoreWebsockets")?.unwrap_or(false)
            || id == "comfyui_auto",
        capabilities,
    })
}

/// `checkEndpoint` read as llama-swap reads it, for a model and for each of its replicas alike:
/// absent (or null) is `/health`; `none` turns the check off (ready at spawn); anything else is
/// trimmed and joined onto the proxy URL, so an empty value checks the proxy's root `/`.
fn decode_check_endpoint(node: Option<&Node>) -> Option<String> {
    let text = node
        .filter(|n| !matches!(n.value, Value::Null))
        .and_then(Node::scalar_text);
    match text.as_deref().map(str::trim) {
        None => Some("/health".into()),
        Some("none") => None,
        Some(path) if path.starts_with('/') => Some(path.into()),
        Some(path) => Some(format!("/{path}")),
    }
}

/// What every instance of a model shares, before each gets its port.
struct InstanceShape<'a> {
    argv: &'a [String],
    cmd_stop: &'a Option<Vec<String>>,
    proxy: &'a str,
    port: Option<u16>,
    check_endpoint: &'a Option<String>,
    engine: Option<&'a super::engine::EngineModel>,
}

/// The instances a model runs: one, or `replicas` of them with their own ports.
fn decode_instances(
    id: &str,
    m: &MapReader<'_>,
    shape: &InstanceShape<'_>,
) -> Result<Vec<InstanceSpec>, ConfigError> {
    let Some(replicas) = m.get(super::expand::REPLICAS_KEY) else {
        let port = shape.port.unwrap_or(0);
        return Ok(vec![InstanceSpec {
            id: id.to_string(),
            argv: shape.argv.to_vec(),
            cmd_stop: shape.cmd_stop.clone(),
            proxy: shape.proxy.to_string(),
            port: shape.port,
            check_endpoint: shape.check_endpoint.clone(),
            slots: shape
                .engine
                .and_then(|e| e.slots)
                .or_else(|| slots_from_argv(shape.argv)),
            env: shape.engine.map(|e| e.engine_env(port)).unwrap_or_default(),
        }]);
    };
    let Value::Seq(items) = &replicas.value else {
        return Err(m.err("replicas", "internal: bad replica expansion"));
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let text = |key: &str| item.get(key).and_then(Node::scalar_text);
        let proxy = text("proxy").unwrap_or_default();
        let port = parse_proxy(&proxy).map_err(|e| m.err("proxy", e))?;
        let argv = match shape.engine {
            Some(e) => e.argv(port.unwrap_or(0), None),
            None => split_command(&text("cmd").unwrap_or_default()).map_err(|e| m.err("cmd", e))?,
        };
        let cmd_stop = match text("cmdStop") {
            Some(s) if !s.trim().is_empty() => {
                Some(split_command(&s).map_err(|e| m.err("cmdStop", e))?)
            }
            _ => None,
        };
        let check_endpoint = match (shape.engine, item.get("checkEndpoint")) {
            (Some(_), None) => shape.check_endpoint.clone(),
            (_, given) => decode_check_endpoint(given),
        };
        let slots = shape
            .engine
            .and_then(|e| e.slots)
            .or_else(|| slots_from_argv(&argv));
        out.push(InstanceSpec {
            id: format!("{id}-{i}"),
            env: shape
                .engine
                .map(|e| e.engine_env(port.unwrap_or(0)))
                .unwrap_or_default(),
            argv,
            cmd_stop,
            proxy,
            port,
            check_endpoint,
            slots,
        });
    }
    Ok(out)
}

fn decode_pool(m: &MapReader<'_>) -> Result<PoolSettings, ConfigError> {
    let defaults = PoolSettings::default();
    let start_all = match m.string("startReplicas")?.as_deref() {
        None | Some("on-demand") => false,
        Some("all") => true,
        Some(other) => {
            return Err(m.err(
                "startReplicas",
                format!("must be on-demand or all, not {other:?}"),
            ))
        }
    };
    let depth = match m.int("queueDepth")? {
        None => defaults.queue_depth,
        Some(d) if d >= 0 => d as usize,
        Some(_) => return Err(m.err("queueDepth", "must be 0 or more")),
    };
    let timeout = match m.int("queueTimeout")? {
        None => defaults.queue_timeout,
        Some(t) if t > 0 => secs(t),
        Some(_) => return Err(m.err("queueTimeout", "must be a number of seconds above 0")),
    };
    let poll = match m.int("slotsPollInterval")? {
        None => defaults.slots_poll,
        Some(0) => None,
        Some(t) if t > 0 => Some(secs(t)),
        Some(_) => {
            return Err(m.err(
                "slotsPollInterval",
                "must be 0 (off) or a number of seconds",
            ))
        }
    };
    let balance = match m.string("balance")?.as_deref() {
        None => defaults.balance,
        Some("prefix") => Balance::Prefix,
        Some("slots") => Balance::Slots,
        Some("round-robin") => Balance::RoundRobin,
        Some(other) => {
            return Err(m.err(
                "balance",
                format!("must be prefix, slots or round-robin, not {other:?}"),
            ))
        }
    };
    Ok(PoolSettings {
        balance,
        start_all,
        queue_depth: depth,
        queue_timeout: timeout,
        slots_poll: poll,
    })
}

/// `-np N` / `--parallel N` in a llama-server command line.
pub fn slots_from_argv(argv: &[String]) -> Option<usize> {
    argv.iter().enumerate().find_map(|(i, a)| {
        let value = match a.as_str() {
            "-np" | "--parallel" => argv.get(i + 1).map(String::as_str),
            _ => a
                .strip_prefix("--parallel=")
                .or_else(|| a.strip_prefix("-np=")),
        }?;
        value.parse::<usize>().ok().filter(|n| *n > 0)
    })
}

/// Splits a command like a POSIX shell (no expansion, no shell), after joining `\` continuations.
pub fn split_command(cmd: &str) -> Result<Vec<String>, String> {
    let joined = cmd.replace("\\\r\n", " ").replace("\\\n", " ");
    let argv = shlex::split(&joined)
        .ok_or_else(|| "cannot split the command: unbalanced quotes".to_string())?;
    if argv.is_empty() {
        return Err("empty command".into());
    }
    Ok(argv)
}

/// Checks the upstream URL and returns its port.
fn parse_proxy(proxy: &str) -> Result<Option<u16>, String> {
    let uri: http::Uri = proxy
        .parse()
        .map_err(|e| format!("{proxy:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err("https upstreams are not supported yet; use http".into()),
        _ => return Err(format!("{proxy:?} must start with http://")),
    }
    if uri.host().is_none() {
        return Err(format!("{proxy:?} has no host"));
    }
    Ok(uri.port_u16().or(Some(80)))
}

fn modalities(caps: &MapReader<'_>, key: &str) -> Result<Vec<String>, ConfigError> {
    let list = caps.strings(key)?;
    if let Some(bad) = list.iter().find(|m| !MODALITIES.contains(&m.as_str())) {
        return Err(caps.err(key, format!("{bad:?} is not one of text, audio, image")));
    }
    Ok(list)
}

const MODEL_FILTER_KEYS: &[&str] = &["stripParams", "strip_params", "setParams", "setParamsByID"];
/// Peers take the same filters less `setParamsByID`.
const PEER_FILTER_KEYS: &[&str] = &["stripParams", "strip_params", "setParams"];

fn decode_filters(
    m: &MapReader<'_>,
    keys: &[&str],
    warnings: &mut Vec<String>,
) -> Result<Filters, ConfigError> {
    let f = m.child("filters", keys, warnings)?;
    let strip = f
        .string("stripParams")?
        .or(f.string("strip_params")?)
        .unwrap_or_default();
    let mut strip_params: Vec<String> = strip
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "model")
        .map(String::from)
        .collect();
    strip_params.sort();
    strip_params.dedup();
    let as_object = |key: &str,
                     node: Option<&Node>|
     -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
        match node.map(Node::to_json) {
            None | Some(serde_json::Value::Null) => Ok(Default::default()),
            Some(serde_json::Value::Object(mut o)) => {
                o.remove("model");
                Ok(o)
            }
            Some(_) => Err(f.err(key, "must be a mapping")),
        }
    };
    let set_params = as_object("setParams", f.get("setParams"))?;
    let mut set_params_by_id = BTreeMap::new();
    if let Some(by_id) = f.get("setParamsByID") {
        for (id, params) in by_id.entries() {
            set_params_by_id.insert(id.clone(), as_object("setParamsByID", Some(params))?);
        }
    }
    Ok(Filters {
        strip_params,
        set_params,
        set_params_by_id,
    })
}

fn decode_timeouts(
    t: &MapReader<'_>,
    response_header_default: Option<i64>,
) -> Result<Timeouts, ConfigError> {
    let get = |key: &str, default: i64| -> Result<Duration, ConfigError> {
        match t.int(key)? {
            Some(v) if v < 0 => Err(t.err(key, "must be 0 or more")),
            v => Ok(secs(v.unwrap_or(default))),
        }
    };
    let rh = get("responseHeader", response_header_default.unwrap_or(0))?;
    Ok(Timeouts {
        connect: get("connect", 30)?,
        keepalive: get("keepalive", 30)?,
        response_header: (!rh.is_zero()).then_some(rh),
        tls_handshake: get("tlsHandshake", 10)?,
        expect_continue: get("expectContinue", 1)?,
        idle_conn: get("idleConn", 90)?,
        stream_idle: Some(get("streamIdle", 600)?).filter(|d| !d.is_zero()),
    })
}

/// Aliases (and `setParamsByID` keys, which act as aliases) must name one model only.
fn register_aliases(
    models: &mut BTreeMap<String, ModelConfig>,
    reader: &MapReader<'_>,
) -> Result<(), ConfigError> {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let ids: BTreeSet<String> = models.keys().cloned().collect();
    for model in models.values_mut() {
        let extra: Vec<String> = model
            .filters
            .set_params_by_id
            .keys()
            .filter(|k| **k != model.id && !model.aliases.contains(k))
            .cloned()
            .collect();
        model.aliases.extend(extra);
        for alias in &model.aliases {
            let err = |msg: String| reader.err(&model.id, msg);
            if alias.is_empty() {
                return Err(err("aliases must not be empty".into()));
            }
            if ids.contains(alias) {
                return Err(err(format!("alias {alias:?} is also a model id")));
            }
            if let Some(other) = owner.insert(alias.clone(), model.id.clone()) {
                if other != model.id {
                    return Err(err(format!(
                        "alias {alias:?} is also used by model {other:?}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// With devices configured, models in no group are placed by memory alone: the implicit group
/// neither swaps nor evicts, and the memory ledger decides what must stop.
fn decode_groups(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    placed_by_memory: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<Group>, ConfigError> {
    let mut groups = Vec::new();
    let mut placed: BTreeMap<String, String> = BTreeMap::new();
    for (gid, node) in r.entries() {
        let g = MapReader::new(
            node,
            &r.key(gid),
            &["swap", "exclusive", "persistent", "members"],
            warnings,
        )?;
        let members = g.strings("members")?;
        for member in &members {
            if !models.contains_key(member) {
                return Err(g.err("members", format!("no model config for {member:?}")));
            }
            if let Some(prev) = placed.insert(member.clone(), gid.clone()) {
                let msg = if prev == *gid {
                    format!("{member:?} is listed twice")
                } else {
                    format!("{member:?} is already in group {prev:?}")
                };
                return Err(g.err("members", msg));
            }
        }
        groups.push(Group {
            id: gid.clone(),
            swap: g.boolean("swap")?.unwrap_or(true),
            exclusive: g.boolean("exclusive")?.unwrap_or(true),
            persistent: g.boolean("persistent")?.unwrap_or(false),
            members,
        });
    }
    let rest: Vec<String> = models
        .keys()
        .filter(|m| !placed.contains_key(*m))
        .cloned()
        .collect();
    if !rest.is_empty() {
        groups.push(Group {
            id: DEFAULT_GROUP.into(),
            swap: !placed_by_memory,
            exclusive: !placed_by_memory,
            persistent: false,
            members: rest,
        });
    }
    Ok(groups)
}

fn decode_matrix(
    r: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<Matrix, ConfigError> {
    let mut vars = BTreeMap::new();
    let v = r.child("vars", &[], &mut Vec::new())?;
    for (name, _) in v.entries() {
        let valid = (1..=32).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        if !valid {
            return Err(v.err(name, "matrix var names must match ^[a-zA-Z0-9.-]{1,32}$"));
        }
        let target = v.string(name)?.unwrap_or_default();
        if !models.contains_key(&target) {
            return Err(v.err(name, format!("{target:?} is not a model id")));
        }
        vars.insert(name.clone(), target);
    }
    let mut evict_costs = BTreeMap::new();
    let c = r.child("evict_costs", &[], &mut Vec::new())?;
    for (name, _) in c.entries() {
        match c.int(name)? {
            Some(cost) if cost > 0 => evict_costs.insert(name.clone(), cost),
            _ => return Err(c.err(name, "evict costs must be integers above 0")),
        };
    }
    let s = r.child("sets", &[], &mut Vec::new())?;
    let mut sets = Vec::new();
    for (name, _) in s.entries() {
        sets.push((name.clone(), s.string(name)?.unwrap_or_default()));
    }
    if sets.is_empty() {
        return Err(r.err("sets", "a matrix needs at least one set"));
    }
    Ok(Matrix {
        vars,
        evict_costs,
        sets,
    })
}

fn decode_profiles(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Profile>, ConfigError> {
    let r = top.child("profiles", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (name, node) in r.entries() {
        let p = MapReader::new(node, &r.key(name), &["description", "pins"], warnings)?;
        let Some(pins_node) = p.get("pins") else {
            return Err(p.err(
                "pins",
                "a profile needs pins (a mapping of requested id to target)",
            ));
        };
        if !matches!(pins_node.value, Value::Map(_)) {
            return Err(p.err("pins", "must be a mapping of requested id to target"));
        }
        let pins = pins_node
            .entries()
            .iter()
            .map(|(k, v)| (k.clone(), v.scalar_text().filter(|s| !s.is_empty())))
            .collect();
        out.insert(
            name.clone(),
            Profile {
                description: p.string("description")?.unwrap_or_default(),
                pins,
            },
        );
    }
    Ok(out)
}

fn decode_selectors(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Selector>, ConfigError> {
    let r = top.child("selectors", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (id, node) in r.entries() {
        let keys = &[
            "strategy",
            "targets",
            "settings",
            "name",
            "description",
            "unlisted",
            "metadata",
        ];
        let s = MapReader::new(node, &r.key(id), keys, warnings)?;
        let strategy = s.string("strategy")?.unwrap_or_default();
        if !["warm", "pin", "spillover"].contains(&strategy.as_str()) {
            return Err(s.err(
                "strategy",
                format!("must be warm, pin or spillover, not {strategy:?}"),
            ));
        }
        let targets = s.strings("targets")?;
        if targets.is_empty() {
            return Err(s.err("targets", "a selector needs at least one target"));
        }
        let settings = s.child("settings", &["spillover"], warnings)?;
        let spillover = settings.int("spillover")?.unwrap_or(1);
        if spillover < 1 {
            return Err(settings.err("spillover", "must be 1 or more"));
        }
        let metadata = match s.get("metadata").map(Node::to_json) {
            Some(serde_json::Value::Object(o)) => o,
            _ => Default::default(),
        };
        out.insert(
            id.clone(),
            Selector {
                strategy,
                targets,
                spillover: spillover as u64,
                name: s.string("name")?,
                description: s.string("description")?,
                unlisted: s.boolean("unlisted")?.unwrap_or(false),
                metadata,
            },
        );
    }
    Ok(out)
}

/// `apiKeys`: plain strings (admin keys, as in llama-swap) or `{key: K, scope: admin|inference|metrics}`.
fn decode_api_keys(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<ApiKey>, ConfigError> {
    let items = match top.get("apiKeys").map(|n| &n.value) {
        None => return Ok(Vec::new()),
        Some(Value::Seq(items)) => items,
        Some(_) => return Err(top.err("apiKeys", "must be a list of keys")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| decode_api_key(item, &format!("apiKeys[{i}]"), warnings))
        .collect()
}

fn decode_api_key(
    item: &Node,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<ApiKey, ConfigError> {
    let at = |msg: &str| ConfigError::at(item.loc.clone(), Some(path.into()), msg.into());
    let (key, scope) = match &item.value {
        Value::Map(_) => {
            let r = MapReader::new(item, path, &["key", "scope"], warnings)?;
            let key = r
                .string("key")?
                .ok_or_else(|| r.err("key", "a scoped key needs `key`"))?;
            let scope = match r.string("scope")? {
                None => Scope::Admin,
                Some(name) => Scope::parse(&name).ok_or_else(|| {
                    r.err(
                        "scope",
                        format!("must be admin, inference or metrics, not {name:?}"),
                    )
                })?,
            };
            (key, scope)
        }
        Value::Seq(_) | Value::Null => {
            return Err(at("must be a key, or {key: ..., scope: ...}"));
        }
        _ => (item.scalar_text().unwrap_or_default(), Scope::Admin),
    };
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(at("keys must be non-empty and contain no spaces"));
    }
    Ok(ApiKey { key, scope })
}

fn decode_peers(
    top: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Peer>, ConfigError> {
    let r = top.child("peers", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (id, node) in r.entries() {
        let p = MapReader::new(
            node,
            &r.key(id),
            &["proxy", "apiKey", "models", "filters", "timeouts"],
            warnings,
        )?;
        let proxy = p
            .string("proxy")?
            .ok_or_else(|| p.err("proxy", "a peer needs a proxy URL"))?;
        if !(proxy.starts_with("http://") || proxy.starts_with("https://"))
            || proxy.parse::<http::Uri>().is_err()
        {
            return Err(p.err("proxy", format!("{proxy:?} is not an http(s) URL")));
        }
        if proxy
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.authority().map(|a| a.as_str().contains('@')))
            == Some(true)
        {
            return Err(p.err(
                "proxy",
                "credentials in the URL are not sent; give the key as apiKey",
            ));
        }
        let peer_models = p.strings("models")?;
        if peer_models.is_empty() {
            return Err(p.err("models", "a peer needs at least one model"));
        }
        for m in &peer_models {
            let fqn = format!("{id}/{m}");
            if models.contains_key(&fqn) || models.values().any(|x| x.aliases.contains(&fqn)) {
                return Err(p.err(
                    "models",
                    format!("{fqn:?} collides with a local model or alias"),
                ));
            }
        }
        let mut filters = decode_filters(&p, PEER_FILTER_KEYS, warnings)?;
        filters.set_params_by_id.clear();
        out.insert(
            id.clone(),
            Peer {
                proxy,
                api_key: p.string("apiKey")?.filter(|k| !k.is_empty()),
                models: peer_models,
                filters,
                timeouts: decode_timeouts(&p.child("timeouts", TIMEOUT_KEYS, warnings)?, Some(60))?,
            },
        );
    }
    Ok(out)
}

/// Parses Go duration strings such as `5s`, `1m30s`, `500ms`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_secs_f64(total))
}
