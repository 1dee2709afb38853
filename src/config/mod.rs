//! Configuration: a llama-swap config file, read unchanged.
//!
//! Two stages: [`expand`] runs llama-swap's pipeline on a located YAML tree ([`yaml`]), then
//! [`decode`] turns the tree into the typed, validated [`Config`] that the rest of corral uses.

pub(crate) mod catalog;
mod command;
mod decode;
pub mod engine;
mod expand;
pub(crate) mod matrix;
mod memory;
mod read;
pub(crate) mod reload_guard;
mod server;
pub mod sleep;
mod top_keys;
pub(crate) mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::logs::redact::{self, Redactor};
pub use decode::{parse_go_duration, CorsConfig};
pub use memory::{Device, MemorySpec, Vendor};
pub use server::ServerSettings;
pub use yaml::Loc;

/// A config error that names where it is: file, line, column and key.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub loc: Option<Loc>,
    pub key: Option<String>,
    pub msg: String,
}

impl ConfigError {
    pub fn at(loc: Loc, key: Option<String>, msg: String) -> Self {
        ConfigError {
            loc: Some(loc),
            key,
            msg,
        }
    }

    pub fn plain(msg: impl Into<String>) -> Self {
        ConfigError {
            loc: None,
            key: None,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = &self.loc {
            write!(f, "{loc}: ")?;
        }
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ConfigError {}

/// Where a config comes from: `--config` and/or `--config-dir`, as llama-swap takes them.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub file: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

impl Sources {
    /// The files to read, in merge order: the file, then the directory's `*.yml|*.yaml` sorted by name.
    pub fn files(&self) -> Result<Vec<PathBuf>, ConfigError> {
        let mut files = Vec::new();
        if let Some(f) = &self.file {
            files.push(f.clone());
        }
        if let Some(dir) = &self.dir {
            for p in yaml_files(dir)? {
                self.refuse_given_twice(&p)?;
                files.push(p);
            }
        }
        if files.is_empty() {
            return Err(ConfigError::plain(
                "no config given: use --config FILE and/or --config-dir DIR",
            ));
        }
        Ok(files)
    }

    /// A file of the directory that is also `--config` would be merged with itself.
    fn refuse_given_twice(&self, p: &Path) -> Result<(), ConfigError> {
        match &self.file {
            Some(f) if same_file(f, p) => Err(ConfigError::plain(format!(
                "{} is given both with --config and inside --config-dir",
                p.display()
            ))),
            _ => Ok(()),
        }
    }
}

/// The `*.yml` and `*.yaml` files of `dir`, sorted by name.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        ConfigError::plain(format!(
            "{}: cannot read config directory: {e}",
            dir.display()
        ))
    })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yml" | "yaml"))
        })
        .collect();
    found.sort();
    Ok(found)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// A loaded config and the warnings found on the way (unknown keys, clamped values).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// Loads the given sources; `env` answers `${env.X}` (tests pass a map, `main` the process environment).
pub fn load(
    sources: &Sources,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let mut texts = Vec::new();
    for path in sources.files()? {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::plain(format!("{}: cannot read config: {e}", path.display()))
        })?;
        texts.push((Arc::from(path.display().to_string()), text));
    }
    load_texts(&texts, env)
}

/// Loads configs from (file name, text) pairs.
pub fn load_texts(
    texts: &[(Arc<str>, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let env_secrets = std::cell::RefCell::new(Vec::new());
    let recording_env = |name: &str| {
        let value = env(name);
        if let Some(v) = value.as_ref().filter(|_| redact::is_secret_name(name)) {
            env_secrets.borrow_mut().push(v.clone());
        }
        value
    };
    let tree = expand::load_sources(texts, &recording_env)?;
    let tree = expand::resolve(tree)?;
    let mut warnings = Vec::new();
    let mut config = decode::decode(&tree, &mut warnings)?;
    let mut secrets = env_secrets.into_inner();
    secrets.extend(redact::CREDENTIAL_VARS.iter().filter_map(|name| env(name)));
    config.redactor = config.redactor_with(secrets);
    Ok(Loaded { config, warnings })
}

/// Loads one YAML string (tests and the embedded demo).
pub fn load_str(
    name: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    load_texts(&[(Arc::from(name), text.to_string())], env)
}

// === the typed config ===

/// The log streams `logToStdout` sends to stdout (and into the combined `/logs` history):
/// `none`, `both` (all three) or a comma list of `proxy`, `upstream` and `http`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogToStdout {
    proxy: bool,
    upstream: bool,
    http: bool,
}

impl Default for LogToStdout {
    /// `proxy`, as when the key is left out.
    fn default() -> Self {
        LogToStdout {
            proxy: true,
            upstream: false,
            http: false,
        }
    }
}

impl LogToStdout {
    /// Parses a value as llama-swap does; the error is its message.
    pub fn parse(value: &str) -> Result<LogToStdout, String> {
        let none = LogToStdout {
            proxy: false,
            upstream: false,
            http: false,
        };
        match value.trim() {
            "none" => Ok(none),
            "both" => Ok(LogToStdout {
                proxy: true,
                upstream: true,
                http: true,
            }),
            _ => Self::parse_list(value, none),
        }
    }

    /// A comma separated list of the outputs to turn on in `out`.
    fn parse_list(value: &str, mut out: LogToStdout) -> Result<LogToStdout, String> {
        for item in value.split(',') {
            match item.trim() {
                "proxy" => out.proxy = true,
                "upstream" => out.upstream = true,
                "http" => out.http = true,
                _ => {
                    return Err(format!(
                        "logToStdout must be none, both, or a comma separated list of proxy, \
                         upstream, http; got {value:?}"
                    ))
                }
            }
        }
        Ok(out)
    }

    /// corral's own log lines.
    pub fn proxy(self) -> bool {
        self.proxy
    }

    /// The engines' output.
    pub fn upstream(self) -> bool {
        self.upstream
    }

    /// One access line per HTTP request.
    pub fn http(self) -> bool {
        self.http
    }
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bounds on client connections (read once at start; a reload keeps the running values).
    pub server: ServerSettings,
    pub health_check_timeout: Duration,
    /// Devices whose memory corral places models on; empty turns memory placement off.
    pub devices: Vec<Device>,
    /// Host memory sleepers that keep their weights may hold in all (`hostMemory`); `None`: what
    /// the host has available when a sleep is decided.
    pub host_memory: Option<u64>,
    /// Bytes per second a load is expected to read at least; sets each model's load deadline.
    pub load_bandwidth: u64,
    /// How often nvidia-smi is read again for the memory other programs use on the devices
    /// (`deviceRefresh`); `None` when off, or when the devices were not found by `devices: auto`.
    pub device_refresh: Option<Duration>,
    /// How long a loading engine may show no progress after its deadline before it is killed.
    pub load_stall: Duration,
    pub log_level: String,
    pub log_time_format: String,
    pub log_to_stdout: LogToStdout,
    pub metrics_max_in_memory: u64,
    /// Also publish the endpoint picker's gauges under vLLM's names (`vllmMetricNames`).
    pub vllm_metric_names: bool,
    pub capture_buffer_mb: u64,
    pub store_path: Option<String>,
    pub ui_session_headers: Vec<String>,
    pub performance_disabled: bool,
    pub performance_every: Duration,
    pub start_port: u16,
    pub send_loading_state: bool,
    pub include_aliases_in_list: bool,
    pub global_ttl: Duration,
    pub unload_timeout: Duration,
    pub api_keys: Vec<ApiKey>,
    /// `/metrics` answers without a key even when `apiKeys` are set (`openMetrics`), for an
    /// endpoint picker or a scraper that sends none.
    pub open_metrics: bool,
    /// Ollama's API (`/api/tags`, `/api/chat`, ...) is served in front of the engines
    /// (`ollamaApi`, on unless set to false).
    pub ollama_api: bool,
    /// Host names accepted, beyond loopback names and addresses, while corral listens on a
    /// loopback address (`allowedHosts`).
    pub allowed_hosts: Vec<String>,
    /// `security.cors`; `None` answers browsers as llama-swap v250 did.
    pub cors: Option<CorsConfig>,
    /// Hides the secrets of this config wherever a command line or log text is shown.
    pub redactor: Redactor,
    /// Models by id, sorted.
    pub models: BTreeMap<String, ModelConfig>,
    pub groups: Vec<Group>,
    /// The compiled matrix router, when `routing.router.use` is `matrix`.
    pub router: Option<Arc<crate::config::matrix::Matrix>>,
    pub profiles: BTreeMap<String, Profile>,
    pub selectors: BTreeMap<String, Selector>,
    pub peers: BTreeMap<String, Peer>,
    pub ignore_paths: Vec<regex::Regex>,
    pub preload: Vec<String>,
    /// The profile active at start and after each reload (`hooks.on_startup.profile`).
    pub startup_profile: Option<String>,
    /// Model requests served at once across all models (`globalConcurrencyLimit`); 0: no limit.
    pub global_concurrency_limit: usize,
    pub fifo_priority: BTreeMap<String, i64>,
}

/// One `apiKeys` entry: a plain string is an admin key, as in llama-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub key: String,
    pub scope: Scope,
    /// What usage records and metrics call the key; a short fingerprint of it when unnamed.
    pub name: Option<String>,
    /// The models (ids, aliases or `*` patterns, `peer/*` for a peer's) the key may use; empty
    /// means every model.
    pub models: Vec<String>,
}

/// What a key may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything: model routes, management routes, metrics.
    Admin,
    /// Model routes (chat, completions, embeddings, ..., `/upstream/...`) and the model list.
    Inference,
    /// `/metrics` only, for a Prometheus scraper.
    Metrics,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Inference => "inference",
            Scope::Metrics => "metrics",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        [Scope::Admin, Scope::Inference, Scope::Metrics]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// True when a key of this scope may reach a route that needs `needed`.
    pub fn allows(self, needed: Scope) -> bool {
        self == Scope::Admin || self == needed
    }
}

/// One process corral runs for a model: the model itself, or one of its replicas.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// The model id, or `<model>-<n>` for replicas.
    pub id: String,
    pub argv: Vec<String>,
    pub cmd_stop: Option<Vec<String>>,
    pub proxy: String,
    pub port: Option<u16>,
    pub check_endpoint: Option<String>,
    /// Parallel slots named on the command line (`-np`/`--parallel`), or by `slots`.
    pub slots: Option<usize>,
    /// Environment its engine kind needs for this instance (an address of its own, ...).
    pub env: Vec<(String, String)>,
}

/// How requests wait for a free slot in a pool of replicas.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Start every replica on the first request instead of one at a time as load needs them.
    pub start_all: bool,
    /// Requests that may wait for a slot; beyond it, 429.
    pub queue_depth: usize,
    /// How long a request may wait for a slot; beyond it, 503.
    pub queue_timeout: Duration,
    /// How often a ready replica's `/slots` is polled to see work that reached it another way.
    pub slots_poll: Option<Duration>,
    /// How a request chooses among the ready replicas (`balance`).
    pub balance: Balance,
    /// How long a request may wait for the replica holding its prompt's prefix while another has a
    /// free slot (`prefixWait`, milliseconds; `balance: prefix` only). Zero: never.
    pub prefix_wait: Duration,
}

/// `balance`: how a pool chooses a replica for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// The replica that last served the longest prefix of the prompt, when it has a free slot;
    /// otherwise as `Slots`.
    #[default]
    Prefix,
    /// The ready replica with the most free slots.
    Slots,
    /// Each ready replica in turn, ignoring free slots (each replica queues for itself), for
    /// comparison with the slot-aware picks.
    RoundRobin,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            start_all: false,
            balance: Balance::Prefix,
            queue_depth: 64,
            queue_timeout: Duration::from_secs(60),
            slots_poll: Some(Duration::from_secs(5)),
            prefix_wait: Duration::ZERO,
        }
    }
}

/// One `models.<id>` entry.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: std::sync::Arc<str>,
    /// The engine and source it is served from, when named instead of a `cmd`.
    pub engine: Option<Arc<engine::EngineModel>>,
    /// The processes this model runs: one, or one per replica.
    pub instances: Vec<InstanceSpec>,
    pub pool: PoolSettings,
    pub memory: MemorySpec,
    /// An explicit load deadline, instead of one scaled by the weights.
    pub load_timeout: Option<Duration>,
    /// The command, split like a POSIX shell; run directly, never through a shell.
    pub argv: Vec<String>,
    /// `cmdStop`, split, with `${PID}` still in it.
    pub cmd_stop: Option<Vec<String>>,
    pub proxy: String,
    pub port: Option<u16>,
    pub aliases: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `None` for `checkEndpoint: none`.
    pub check_endpoint: Option<String>,
    /// Idle time before unloading; `None` never unloads.
    pub ttl: Option<Duration>,
    pub unload_timeout: Duration,
    pub unlisted: bool,
    pub use_model_name: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub concurrency_limit: usize,
    pub filters: Filters,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub send_loading_state: bool,
    pub timeouts: Timeouts,
    /// A new upstream connection for every request, none kept for reuse (`disableKeepAlives`),
    /// for engines that close a connection after a streamed answer.
    pub disable_keep_alives: bool,
    pub ignore_websockets: bool,
    pub capabilities: Capabilities,
    /// How it sleeps and wakes instead of stopping (`sleepMode`); `None` when it does not.
    pub sleep: Option<Arc<sleep::SleepSpec>>,
}

#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub strip_params: Vec<String>,
    /// In the order they are applied: sorted by path.
    pub set_params: Vec<SetParam>,
    pub set_params_by_id: BTreeMap<String, Vec<SetParam>>,
}

/// One `setParams` (or `setParamsByID`) entry.
#[derive(Debug, Clone, PartialEq)]
pub struct SetParam {
    /// The key, `a.b` for a nested one, without the `?` that marks it set-if-undefined.
    pub path: String,
    pub value: serde_json::Value,
    /// Spelled `key?`: set only when the request (as the stages before left it) lacks the key.
    pub if_undefined: bool,
}

#[derive(Debug, Clone)]
pub struct Timeouts {
    pub connect: Duration,
    pub keepalive: Duration,
    /// `None`: no limit on waiting for the upstream's response headers.
    pub response_header: Option<Duration>,
    pub tls_handshake: Duration,
    pub expect_continue: Duration,
    pub idle_conn: Duration,
    /// A response body that sends nothing for this long is ended (`None`: never).
    pub stream_idle: Option<Duration>,
}

#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    pub input: Vec<String>,
    pub output: Vec<String>,
    pub tools: bool,
    pub reranker: bool,
    pub context: u64,
    /// `disableAuto`: corral fills in nothing the config leaves unset.
    pub disable_auto: bool,
}

/// A swap group (`groups.<id>`, or the implicit `(default)` group of models in no group).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub id: String,
    pub swap: bool,
    pub exclusive: bool,
    pub persistent: bool,
    pub members: Vec<String>,
}

pub const DEFAULT_GROUP: &str = "(default)";

#[derive(Debug, Clone)]
pub struct Matrix {
    pub vars: BTreeMap<String, String>,
    pub evict_costs: BTreeMap<String, i64>,
    pub sets: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Profile {
    pub description: String,
    /// requested id → target; `None` disables the requested id.
    pub pins: BTreeMap<String, Option<String>>,
}

#[derive(Debug, Clone)]
pub struct Selector {
    pub strategy: String,
    pub targets: Vec<String>,
    pub spillover: u64,
    pub name: Option<String>,
    pub description: Option<String>,
    pub unlisted: bool,
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub proxy: String,
    pub api_key: Option<String>,
    pub models: Vec<String>,
    pub filters: Filters,
    pub timeouts: Timeouts,
}

impl Config {
    /// A redactor for every secret this config holds: `extra` (values of secret-named `${env.X}`
    /// substitutions and of corral's own credential variables), its API keys and peer keys, values
    /// of secret-named `env:` and `engines.<kind>.env` entries, and the secret values in each
    /// command, so they are masked wherever they turn up, engine output included.
    pub fn redactor_with(&self, extra: Vec<String>) -> Redactor {
        let mut values = extra;
        values.extend(self.api_keys.iter().map(|k| k.key.clone()));
        values.extend(self.peers.values().filter_map(|p| p.api_key.clone()));
        let secret_env = |env: &[(String, String)]| -> Vec<String> {
            env.iter()
                .filter(|(k, _)| redact::is_secret_name(k))
                .map(|(_, v)| v.clone())
                .collect()
        };
        for m in self.models.values() {
            values.extend(secret_env(&m.env));
            if let Some(engine) = &m.engine {
                values.extend(secret_env(&engine.env));
            }
            for inst in &m.instances {
                values.extend(secret_env(&inst.env));
                values.extend(redact::secret_values(&inst.argv));
                if let Some(stop) = &inst.cmd_stop {
                    values.extend(redact::secret_values(stop));
                }
            }
        }
        Redactor::new(values)
    }

    /// The model id a requested name means: an exact id first, then an alias.
    pub fn real_model_name(&self, name: &str) -> Option<&str> {
        if let Some((id, _)) = self.models.get_key_value(name) {
            return Some(id);
        }
        self.models
            .values()
            .find(|m| m.aliases.iter().any(|a| a == name))
            .map(|m| &*m.id)
    }

    /// The group a model belongs to (every model has one).
    pub fn group_of(&self, model: &str) -> &Group {
        self.groups
            .iter()
            .find(|g| g.members.iter().any(|m| m == model))
            .expect("every model is in a group")
    }
}

#[cfg(test)]
mod tests;
