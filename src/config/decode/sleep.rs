//! `sleepMode`, `sleepEndpoints`, `wakeEndpoints` (read as llmsnap reads them), `sleepLevel` and
//! `wakeTimeout` of one model.

use std::time::Duration;

use crate::config::engine::EngineModel;
use crate::config::read::MapReader;
use crate::config::sleep::{engine_calls, SleepCall, SleepSpec, DEFAULT_WAKE_TIMEOUT};
use crate::config::yaml::Value;
use crate::config::ConfigError;
use crate::engines::EngineKind;

/// The keys of one `sleepEndpoints` or `wakeEndpoints` entry.
const CALL_KEYS: &[&str] = &["endpoint", "method", "body", "timeout"];
const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH"];

/// How the model sleeps, or `None` when it does not; an engine that sleeps is given the flags
/// and environment its sleep needs.
pub(super) fn decode_sleep(
    m: &MapReader<'_>,
    engine: Option<&mut EngineModel>,
    warnings: &mut Vec<String>,
) -> Result<Option<SleepSpec>, ConfigError> {
    let spec = decode_spec(m, engine.as_ref().map(|e| e.kind), warnings)?;
    if let (Some(e), Some(_)) = (engine, &spec) {
        prepare_engine(e);
    }
    Ok(spec)
}

/// Adds what `kind` needs to sleep to an engine model's arguments and environment, unless the
/// user already gave it.
fn prepare_engine(engine: &mut EngineModel) {
    let (flags, env) = crate::config::sleep::engine_needs(engine.kind);
    for flag in flags {
        if !engine.args.iter().any(|a| a == flag) {
            engine.args.push(flag.to_string());
        }
    }
    for (name, value) in env {
        if !engine.env.iter().any(|(k, _)| k == name) {
            engine.env.push((name.to_string(), value.to_string()));
        }
    }
}

/// Warns about a `cmd` model that sleeps through vLLM's routes without what they need.
pub(super) fn warn_cmd(
    m: &MapReader<'_>,
    is_cmd: bool,
    spec: Option<&SleepSpec>,
    launch: &super::launch::Launch,
    warnings: &mut Vec<String>,
) {
    let Some(spec) = spec.filter(|_| is_cmd) else {
        return;
    };
    let warned = crate::config::sleep::cmd_warning(&launch.argv, &launch.env, spec);
    warnings.extend(warned.map(|w| format!("{}: {w}", m.path)));
}

/// The spec: `None` for `sleepMode: disable`, or with neither `sleepMode: enable` nor endpoints
/// given. `kind` is the engine's, for the default calls.
fn decode_spec(
    m: &MapReader<'_>,
    kind: Option<EngineKind>,
    warnings: &mut Vec<String>,
) -> Result<Option<SleepSpec>, ConfigError> {
    let sleep = calls(m, "sleepEndpoints", warnings)?;
    let wake = calls(m, "wakeEndpoints", warnings)?;
    let enabled = match m.string("sleepMode")?.as_deref().map(str::trim) {
        Some("enable") => true,
        Some("disable") => return Ok(None),
        None => !sleep.is_empty() || !wake.is_empty(),
        Some(other) => {
            return Err(m.err(
                "sleepMode",
                format!("must be enable or disable, not {other:?}"),
            ))
        }
    };
    if !enabled {
        return Ok(None);
    }
    let level = match m.int("sleepLevel")? {
        None => 1,
        Some(l @ (1 | 2)) => l as u8,
        Some(l) => return Err(m.err("sleepLevel", format!("must be 1 or 2, not {l}"))),
    };
    let (sleep, wake) = match (sleep.is_empty(), wake.is_empty()) {
        (false, false) => (sleep, wake),
        (false, true) => return Err(m.err("wakeEndpoints", "is required when sleepEndpoints is given")),
        (true, false) => return Err(m.err("sleepEndpoints", "is required when wakeEndpoints is given")),
        (true, true) => kind.and_then(|k| engine_calls(k, level)).ok_or_else(|| {
            m.err(
                "sleepMode",
                "enable needs sleepEndpoints and wakeEndpoints here: corral knows the calls of engine: vllm and engine: sglang only",
            )
        })?,
    };
    let wake_timeout =
        crate::config::memory::seconds(m, "wakeTimeout")?.unwrap_or(DEFAULT_WAKE_TIMEOUT);
    Ok(Some(SleepSpec {
        level,
        sleep,
        wake,
        wake_timeout,
    }))
}

/// One list of calls; absent reads as empty.
fn calls(
    m: &MapReader<'_>,
    key: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<SleepCall>, ConfigError> {
    let Some(node) = m.get(key) else {
        return Ok(Vec::new());
    };
    let Value::Seq(items) = &node.value else {
        return Err(m.err(key, "must be a list of {endpoint, method, body, timeout}"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let entry = MapReader::new(item, &format!("{}[{i}]", m.key(key)), CALL_KEYS, warnings)?;
            call(&entry)
        })
        .collect()
}

/// One entry: `endpoint` (a path), `method` (POST when not given), `body`, `timeout` (seconds).
fn call(e: &MapReader<'_>) -> Result<SleepCall, ConfigError> {
    let endpoint = e.string("endpoint")?.unwrap_or_default();
    if !endpoint.starts_with('/') {
        return Err(e.err("endpoint", "is required: a path such as /sleep?level=1"));
    }
    let method = e
        .string("method")?
        .unwrap_or_else(|| "POST".into())
        .to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        return Err(e.err(
            "method",
            format!("must be GET, POST, PUT or PATCH, not {method:?}"),
        ));
    }
    let timeout = match e.int("timeout")? {
        None | Some(0) => None,
        Some(t) if t > 0 => Some(Duration::from_secs(t as u64)),
        Some(t) => {
            return Err(e.err(
                "timeout",
                format!("must be a number of seconds, 0 or more, not {t}"),
            ))
        }
    };
    Ok(SleepCall {
        endpoint,
        method,
        body: e.string("body")?.filter(|b| !b.is_empty()),
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{load_str, Loaded};

    fn load(model: &str) -> Result<Loaded, String> {
        let yaml = format!("models:\n  m:\n{model}");
        load_str("t.yaml", &yaml, &|_| None).map_err(|e| e.to_string())
    }

    fn vllm(extra: &str) -> String {
        format!("    engine: vllm\n    source: /models/m\n{extra}")
    }

    #[test]
    fn a_vllm_model_that_enables_sleep_gets_level_one_and_the_flags_it_needs() {
        let c = load(&vllm("    sleepMode: enable\n")).unwrap().config;
        let m = &c.models["m"];
        let spec = m.sleep.as_ref().expect("sleeps");
        assert_eq!(
            (spec.level, spec.sleep[0].endpoint.as_str()),
            (1, "/sleep?level=1")
        );
        assert_eq!(
            spec.wake_timeout,
            crate::config::sleep::DEFAULT_WAKE_TIMEOUT
        );
        assert!(
            m.argv.iter().any(|a| a == "--enable-sleep-mode"),
            "{:?}",
            m.argv
        );
        let engine = m.engine.as_ref().unwrap();
        assert!(engine
            .env
            .contains(&("VLLM_SERVER_DEV_MODE".into(), "1".into())));
        let two = load(&vllm(
            "    sleepMode: enable\n    sleepLevel: 2\n    wakeTimeout: 9\n",
        ));
        let two = two.unwrap().config.models["m"].sleep.clone().unwrap();
        assert_eq!((two.wake.len(), two.wake_timeout.as_secs()), (3, 9));
        let off = load(&vllm("    sleepMode: disable\n")).unwrap().config;
        assert!(off.models["m"].sleep.is_none());
        assert!(!off.models["m"]
            .argv
            .iter()
            .any(|a| a == "--enable-sleep-mode"));
    }

    #[test]
    fn endpoints_are_read_as_llmsnap_reads_them() {
        let cmd = "    cmd: srv --port ${PORT}\n";
        let given = format!("{cmd}    sleepEndpoints:\n      - endpoint: /sleep\n        method: put\n        body: '{{\"level\": 1}}'\n        timeout: 5\n    wakeEndpoints:\n      - {{endpoint: /wake_up}}\n");
        let spec = load(&given).unwrap().config.models["m"]
            .sleep
            .clone()
            .unwrap();
        assert_eq!(spec.sleep[0].method, "PUT");
        assert_eq!(spec.sleep[0].body.as_deref(), Some(r#"{"level": 1}"#));
        assert_eq!(spec.sleep[0].timeout.map(|t| t.as_secs()), Some(5));
        assert_eq!(spec.wake[0].method, "POST");
    }

    #[test]
    fn bad_sleep_keys_are_errors_that_name_the_key() {
        let cmd = "    cmd: srv --port ${PORT}\n";
        let cases = [
            (vllm("    sleepMode: maybe\n"), "models.m.sleepMode"),
            (vllm("    sleepMode: enable\n    sleepLevel: 3\n"), "models.m.sleepLevel"),
            (format!("{cmd}    sleepMode: enable\n"), "models.m.sleepMode"),
            (format!("{cmd}    sleepEndpoints: [{{endpoint: /sleep}}]\n"), "models.m.wakeEndpoints"),
            (format!("{cmd}    wakeEndpoints: [{{endpoint: /wake_up}}]\n"), "models.m.sleepEndpoints"),
            (
                format!("{cmd}    sleepEndpoints: [{{endpoint: /s, method: DELETE}}]\n    wakeEndpoints: [{{endpoint: /w}}]\n"),
                "models.m.sleepEndpoints[0].method",
            ),
            (
                format!("{cmd}    sleepEndpoints: [{{method: POST}}]\n    wakeEndpoints: [{{endpoint: /w}}]\n"),
                "models.m.sleepEndpoints[0].endpoint",
            ),
            (
                format!("{cmd}    sleepEndpoints: [{{endpoint: /s, timeout: -1}}]\n    wakeEndpoints: [{{endpoint: /w}}]\n"),
                "models.m.sleepEndpoints[0].timeout",
            ),
        ];
        for (yaml, key) in cases {
            let err = load(&yaml).expect_err(&yaml);
            assert!(err.contains(key), "{key} in {err}");
        }
    }

    #[test]
    fn a_vllm_cmd_that_sleeps_without_sleep_mode_is_warned_about() {
        let cmd = "    cmd: vllm serve /m --port ${PORT}\n    sleepEndpoints: [{endpoint: /sleep}]\n    wakeEndpoints: [{endpoint: /wake_up}]\n";
        let warnings = load(cmd).unwrap().warnings;
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("models.m") && w.contains("--enable-sleep-mode")),
            "{warnings:?}"
        );
    }
}
