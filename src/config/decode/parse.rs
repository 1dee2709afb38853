//! Values given as text in a config: upstream URLs, durations and counts.

use std::time::Duration;

/// Whole seconds from a config integer; negative values (already refused where they matter) read as 0.
pub(super) fn secs(n: i64) -> Duration {
    Duration::from_secs(n.max(0) as u64)
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

/// Checks the upstream URL and returns its port.
pub(super) fn parse_proxy(proxy: &str) -> Result<Option<u16>, String> {
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

/// The longest duration Go's time.Duration holds (2^63-1 ns, about 292 years): what
/// llama-swap's ParseDuration refuses as invalid beyond it.
const MAX_GO_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Parses Go duration strings such as `5s`, `1m30s`, `500ms`; `None` for anything else, one
/// longer than Go's durations hold included (it must not panic on `99999999999999999999s`).
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
        total += value * unit_seconds(&rest[..unit_end])?;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total)
        .ok()
        .filter(|d| *d <= MAX_GO_DURATION)
}

/// Seconds in one of Go's duration units.
fn unit_seconds(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    })
}
