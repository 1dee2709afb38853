//! The keys each mapping understands; any other key is warned about and ignored, as llama-swap
//! ignores it.

/// One `models.<id>` entry.
pub(super) const MODEL_KEYS: &[&str] = &[
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
    "disableKeepAlives",
    // corral's own
    "replicas",
    "startReplicas",
    "queueDepth",
    "queueTimeout",
    "slotsPollInterval",
    "balance",
    "prefixWait",
    "memory",
    "placement",
    "loadTimeout",
    crate::config::top_keys::REPLICAS_KEY,
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
    // sleep and wake (see `sleep.rs`)
    "sleepMode",
    "sleepEndpoints",
    "wakeEndpoints",
    "sleepLevel",
    "wakeTimeout",
];

/// `timeouts` of a model or a peer.
pub(super) const TIMEOUT_KEYS: &[&str] = &[
    "connect",
    "keepalive",
    "responseHeader",
    "tlsHandshake",
    "expectContinue",
    "idleConn",
    "streamIdle",
];

/// `filters` of a model.
pub(super) const MODEL_FILTER_KEYS: &[&str] =
    &["stripParams", "strip_params", "setParams", "setParamsByID"];
/// Peers take the same filters less `setParamsByID`.
pub(super) const PEER_FILTER_KEYS: &[&str] = &["stripParams", "strip_params", "setParams"];

/// What `capabilities.in` and `capabilities.out` may list.
pub(super) const MODALITIES: &[&str] = &["text", "audio", "image", "video"];
