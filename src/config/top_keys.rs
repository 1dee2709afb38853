//! The names both stages read: the keys of a config's top level, which the expansion checks for
//! leftover macros and the decoder reads, and the key under which the expansion hands each
//! replica's own values to the decoder.

/// Where the expansion leaves each replica's own cmd, proxy and port for the decoder.
pub(super) const REPLICAS_KEY: &str = "__replicas";

/// The top level of a config file (also the keys whose values may hold no unknown macro).
pub(super) const TOP_KEYS: &[&str] = &[
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
    "security",
    "globalConcurrencyLimit",
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
    "openMetrics",
    "allowedHosts",
    "ollamaApi",
    "hostMemory",
];
