//! corral's own keys for client connections: `maxConnections`, `maxBufferedBodies` and
//! `clientTimeouts`.
//!
//! llama-swap has neither key (it decodes unknown keys silently), so a config that sets them still
//! loads there.

use std::time::Duration;

use super::read::MapReader;
use super::ConfigError;

pub const CLIENT_TIMEOUT_KEYS: &[&str] = &[
    "requestHeader",
    "requestBody",
    "requestBodyMinRate",
    "idle",
    "write",
    "http2PingInterval",
    "http2PingTimeout",
];

/// How client connections are bounded: their number and how long each may sit without progress.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// Open client connections at most; `None`: derived from the file-descriptor limit at start.
    pub max_connections: Option<usize>,
    /// Request body bytes buffered at once across all requests; `None`: a quarter of the RAM.
    pub max_buffered_bodies: Option<u64>,
    /// From accepting a connection (or the end of the previous response) to a complete request
    /// head; before the first request this also bounds HTTP/1-or-2 detection and the h2 preface.
    pub request_header: Duration,
    /// A request body that delivers nothing for this long is answered 408.
    pub request_body: Duration,
    /// Bytes per second a body must average once `request_body` has passed (0: no rate).
    pub request_body_min_rate: u64,
    /// A connection with no request in flight after its first one is closed after this long.
    pub idle: Duration,
    /// A response write that makes no progress for this long closes the connection.
    pub write: Duration,
    pub http2_ping_interval: Duration,
    pub http2_ping_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            max_connections: None,
            max_buffered_bodies: None,
            request_header: Duration::from_secs(30),
            request_body: Duration::from_secs(30),
            request_body_min_rate: 1024,
            idle: Duration::from_secs(60),
            write: Duration::from_secs(60),
            http2_ping_interval: Duration::from_secs(20),
            http2_ping_timeout: Duration::from_secs(20),
        }
    }
}

/// Reads `maxConnections` and `clientTimeouts` from the top level.
pub fn decode(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<ServerSettings, ConfigError> {
    let defaults = ServerSettings::default();
    let max_connections = max_connections(top)?;
    let max_buffered_bodies = max_buffered_bodies(top)?;
    let t = top.child("clientTimeouts", CLIENT_TIMEOUT_KEYS, warnings)?;
    let secs = |key: &str, default: Duration| -> Result<Duration, ConfigError> {
        Ok(super::memory::seconds(&t, key)?.unwrap_or(default))
    };
    let min_rate = match t.int("requestBodyMinRate")? {
        None => defaults.request_body_min_rate,
        Some(n) if n >= 0 => n as u64,
        Some(_) => return Err(t.err("requestBodyMinRate", "must be 0 or more bytes per second")),
    };
    Ok(ServerSettings {
        max_connections,
        max_buffered_bodies,
        request_header: secs("requestHeader", defaults.request_header)?,
        request_body: secs("requestBody", defaults.request_body)?,
        request_body_min_rate: min_rate,
        idle: secs("idle", defaults.idle)?,
        write: secs("write", defaults.write)?,
        http2_ping_interval: secs("http2PingInterval", defaults.http2_ping_interval)?,
        http2_ping_timeout: secs("http2PingTimeout", defaults.http2_ping_timeout)?,
    })
}

/// `maxConnections`: 0 (or none) lets corral choose.
fn max_connections(top: &MapReader<'_>) -> Result<Option<usize>, ConfigError> {
    match top.int("maxConnections")? {
        None | Some(0) => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(_) => Err(top.err("maxConnections", "must be 0 (automatic) or more")),
    }
}

/// `maxBufferedBodies`: a size above 0 when given.
fn max_buffered_bodies(top: &MapReader<'_>) -> Result<Option<u64>, ConfigError> {
    match super::memory::bytes_value(top, "maxBufferedBodies")? {
        Some(0) => Err(top.err("maxBufferedBodies", "must be a size above 0, such as 4GiB")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<ServerSettings, String> {
        super::super::load_str("t.yaml", yaml, &|_| None)
            .map(|l| l.config.server)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn absent_keys_give_the_defaults() {
        assert_eq!(load("models: {}\n").unwrap(), ServerSettings::default());
    }

    #[test]
    fn every_key_is_read() {
        let s = load(
            "maxConnections: 500\nmaxBufferedBodies: 2GiB\nclientTimeouts:\n  requestHeader: 5\n  requestBody: 6\n  requestBodyMinRate: 0\n  idle: 7\n  write: 8\n  http2PingInterval: 9\n  http2PingTimeout: 10\n",
        )
        .unwrap();
        assert_eq!(s.max_connections, Some(500));
        assert_eq!(s.max_buffered_bodies, Some(2 << 30));
        assert_eq!(s.request_header, Duration::from_secs(5));
        assert_eq!(s.request_body, Duration::from_secs(6));
        assert_eq!(s.request_body_min_rate, 0);
        assert_eq!(s.idle, Duration::from_secs(7));
        assert_eq!(s.write, Duration::from_secs(8));
        assert_eq!(s.http2_ping_interval, Duration::from_secs(9));
        assert_eq!(s.http2_ping_timeout, Duration::from_secs(10));
    }

    #[test]
    fn bad_values_name_file_line_column_and_key() {
        let err = load("models: {}\nclientTimeouts:\n  idle: 0\n").unwrap_err();
        assert!(err.starts_with("t.yaml:3:"), "{err}");
        assert!(err.contains("clientTimeouts.idle"), "{err}");
        let err = load("maxConnections: -1\n").unwrap_err();
        assert!(err.starts_with("t.yaml:1:"), "{err}");
        assert!(err.contains("maxConnections"), "{err}");
        let err = load("maxBufferedBodies: lots\n").unwrap_err();
        assert!(
            err.starts_with("t.yaml:1:") && err.contains("maxBufferedBodies"),
            "{err}"
        );
        let err = load("clientTimeouts:\n  requestBodyMinRate: fast\n").unwrap_err();
        assert!(err.contains("clientTimeouts.requestBodyMinRate"), "{err}");
    }
}
