//! `keep_alive`: how long a model stays loaded after a request. A duration (`"5m"`, `"1h30m"`, or
//! seconds as a number) sets the idle time of its running instances from now on; zero unloads them
//! once their requests are done; a negative value keeps them loaded.

use std::time::Duration;

use serde_json::Value;

use super::names;
use crate::api::App;

/// The idle time a request asks for: `None` keeps the model loaded.
pub type Ttl = Option<Duration>;

/// The `keep_alive` of a request, if it has one; text that is no duration is refused by name.
pub fn parse(value: Option<&Value>) -> Result<Option<Ttl>, String> {
    let bad =
        |v: &Value| format!("keep_alive {v} is not a duration like \"5m\", \"30s\", 300, 0 or -1");
    let secs = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| bad(value.unwrap()))?,
        Some(v @ Value::String(s)) => return text(s.trim()).ok_or_else(|| bad(v)).map(Some),
        Some(other) => return Err(bad(other)),
    };
    Ok(Some(seconds(secs)))
}

/// A number of seconds: negative keeps loaded.
fn seconds(secs: f64) -> Ttl {
    match secs < 0.0 {
        true => None,
        false => Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)),
    }
}

/// A Go duration, or a bare number of seconds, either maybe negative.
fn text(s: &str) -> Option<Ttl> {
    if let Ok(secs) = s.parse::<f64>() {
        return Some(seconds(secs));
    }
    match s.strip_prefix('-') {
        Some(rest) => crate::config::parse_go_duration(rest).map(|_| None),
        None => crate::config::parse_go_duration(s).map(Some),
    }
}

/// Sets `ttl` on the running instances of the local model `name` means (after the active
/// profile, an alias, or a replica's model); a peer's model, or a selector, keeps its own.
pub fn apply(app: &App, name: &str, ttl: Ttl) {
    let Some((_, model)) = names::local(app, name) else {
        return;
    };
    let set = app.fleet.keep_alive(&model, ttl);
    tracing::debug!(model = %model, instances = set, "keep_alive {ttl:?} from an Ollama request");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ttl(v: Value) -> Result<Option<Ttl>, String> {
        parse(Some(&v))
    }

    #[test]
    fn durations_numbers_zero_and_negatives() {
        let secs = |s| Ok(Some(Some(Duration::from_secs(s))));
        assert_eq!(ttl(json!("5m")), secs(300));
        assert_eq!(ttl(json!("1h30m")), secs(5400));
        assert_eq!(ttl(json!(30)), secs(30));
        assert_eq!(ttl(json!("30")), secs(30));
        assert_eq!(ttl(json!(0)), secs(0));
        assert_eq!(ttl(json!("0s")), secs(0));
        assert_eq!(ttl(json!(-1)), Ok(Some(None)));
        assert_eq!(ttl(json!("-1")), Ok(Some(None)));
        assert_eq!(ttl(json!("-5m")), Ok(Some(None)));
        assert_eq!(ttl(json!(1.5)), Ok(Some(Some(Duration::from_millis(1500)))));
        assert_eq!(parse(None), Ok(None));
        assert_eq!(ttl(Value::Null), Ok(None));
    }

    #[test]
    fn anything_else_is_refused_by_name() {
        for bad in [json!("soon"), json!("5 minutes"), json!(true), json!([1])] {
            let e = ttl(bad.clone()).unwrap_err();
            assert!(
                e.contains("keep_alive") && e.contains("\"5m\""),
                "{bad}: {e}"
            );
        }
    }
}
