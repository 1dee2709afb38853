//! How a model is started and reached: its command, stop command, environment, upstream URL
//! and readiness check.

use super::parse::parse_proxy;
use crate::config::command::split_command;
use crate::config::engine::EngineModel;
use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::ConfigError;

/// What a model runs and where it listens, shared by its replicas before each gets its port.
pub(super) struct Launch {
    pub proxy: String,
    pub port: Option<u16>,
    /// The command, built by the engine or split from `cmd`.
    pub argv: Vec<String>,
    pub cmd_stop: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub check_endpoint: Option<String>,
}

/// Reads `proxy`, `cmd` (unless an engine builds the command), `cmdStop`, `env` and
/// `checkEndpoint`, in that order.
pub(super) fn decode_launch(
    m: &MapReader<'_>,
    engine: Option<&EngineModel>,
) -> Result<Launch, ConfigError> {
    let proxy = m.string("proxy")?.unwrap_or_default();
    let port = parse_proxy(&proxy).map_err(|e| m.err("proxy", e))?;
    let argv = launch_argv(m, engine, port, || m.string("cmd"))?;
    let cmd_stop = stop_command(m.string("cmdStop")?, m)?;
    let env = decode_env(m)?;
    m.string("checkEndpoint")?; // a mapping or a list is an error
    let check_endpoint = match (engine, m.node.get("checkEndpoint")) {
        (Some(e), None) => Some(e.kind.readiness().path.to_string()),
        (_, given) => decode_check_endpoint(given),
    };
    Ok(Launch {
        proxy,
        port,
        argv,
        cmd_stop,
        env,
        check_endpoint,
    })
}

/// The command: built by the engine for `port`, or split from `cmd` (read only when there is
/// no engine).
pub(super) fn launch_argv(
    m: &MapReader<'_>,
    engine: Option<&EngineModel>,
    port: Option<u16>,
    cmd: impl FnOnce() -> Result<Option<String>, ConfigError>,
) -> Result<Vec<String>, ConfigError> {
    match engine {
        Some(e) => Ok(e.argv(port.unwrap_or(0), None)),
        None => split_command(&cmd()?.unwrap_or_default()).map_err(|e| m.err("cmd", e)),
    }
}

/// `cmdStop`, split; a blank one is none.
pub(super) fn stop_command(
    text: Option<String>,
    m: &MapReader<'_>,
) -> Result<Option<Vec<String>>, ConfigError> {
    match text {
        Some(s) if !s.trim().is_empty() => {
            Ok(Some(split_command(&s).map_err(|e| m.err("cmdStop", e))?))
        }
        _ => Ok(None),
    }
}

/// `env`: a list of `NAME=value`.
fn decode_env(m: &MapReader<'_>) -> Result<Vec<(String, String)>, ConfigError> {
    m.strings("env")?
        .into_iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(m.err("env", format!("{e:?} is not NAME=value"))),
        })
        .collect()
}

/// `checkEndpoint` read as llama-swap reads it, for a model and for each of its replicas alike:
/// absent (or null) is `/health`; `none` turns the check off (ready at spawn); anything else is
/// trimmed and joined onto the proxy URL, so an empty value checks the proxy's root `/`.
pub(super) fn decode_check_endpoint(node: Option<&Node>) -> Option<String> {
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
