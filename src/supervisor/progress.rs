//! Loading progress an engine reports about itself: a health check that is not ready yet may answer
//! with a JSON body `{"progress": 0.42, "message": "loading tensors"}`, as llama-swap reads it
//! (its `loading_progress.go`). Each change of the progress value restarts the load's countdown,
//! and the report is shown in `/api/events`, `/api/state` and the loading stream.

use serde::Serialize;
use serde_json::Value;

/// The most characters of a message kept: it is shown in the dashboard and resent with every
/// change of the model's status.
pub const MESSAGE_MAX_CHARS: usize = 1024;

/// The largest health answer read for a report. A report is a few dozen bytes; a larger body is
/// not one, and is not read further.
pub const BODY_MAX_BYTES: usize = 64 * 1024;

/// What an engine last said about its own load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadingProgress {
    /// The fraction loaded, from 0 to 1; `None` when the engine sent only a message.
    pub progress: Option<f64>,
    /// The current loading step; empty when the engine sent only a progress value.
    pub message: String,
}

/// Reads a report from a not-ready health answer's body. Both fields are optional, but a body
/// with neither, one that is not a JSON object, one with a field of the wrong type, or one over
/// [`BODY_MAX_BYTES`] is not a report (llama-server's own 503 "Loading model" body is one such).
/// Field names match without regard to ASCII case and the last of a repeated one wins, as Go's
/// decoder reads them.
pub fn parse(body: &[u8]) -> Option<LoadingProgress> {
    if body.is_empty() || body.len() > BODY_MAX_BYTES {
        return None;
    }
    let Value::Object(fields) = serde_json::from_slice::<Value>(body).ok()? else {
        return None;
    };
    let (mut progress, mut message) = (None, None);
    for (name, value) in &fields {
        if name.eq_ignore_ascii_case("progress") {
            progress = number_or_null(value)?;
        } else if name.eq_ignore_ascii_case("message") {
            message = text_or_null(value)?;
        }
    }
    let report = LoadingProgress {
        progress: progress.map(|p: f64| p.clamp(0.0, 1.0)),
        message: first_chars(message.unwrap_or_default().trim(), MESSAGE_MAX_CHARS).to_string(),
    };
    (report.progress.is_some() || !report.message.is_empty()).then_some(report)
}

/// A number (`Some(Some)`), null (`Some(None)`), or anything else (`None`: not a report).
fn number_or_null(value: &Value) -> Option<Option<f64>> {
    match value {
        Value::Null => Some(None),
        Value::Number(n) => n.as_f64().map(Some),
        _ => None,
    }
}

/// A string (`Some(Some)`), null (`Some(None)`), or anything else (`None`: not a report).
fn text_or_null(value: &Value) -> Option<Option<&str>> {
    match value {
        Value::Null => Some(None),
        Value::String(s) => Some(Some(s)),
        _ => None,
    }
}

/// The first `n` characters of `s` (all of it when shorter), cut on a character's edge.
fn first_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// The countdown of a load: its deadline is pushed back by the whole load timeout each time the
/// reported progress value changes, so the timeout bounds how long a load may go without
/// progress rather than how long it may take. A message alone does not count: it can change
/// while the load is stuck (a growing time left).
#[derive(Debug, Default)]
pub struct Countdown {
    last_progress: Option<f64>,
    last_report: Option<LoadingProgress>,
}

/// What one report changes.
#[derive(Debug, PartialEq)]
pub struct Noted {
    /// The progress value moved: the deadline starts again.
    pub restart: bool,
    /// The report differs from the last one: it is worth showing.
    pub changed: bool,
}

impl Countdown {
    pub fn note(&mut self, report: &LoadingProgress) -> Noted {
        let restart = report.progress.is_some() && report.progress != self.last_progress;
        if restart {
            self.last_progress = report.progress;
        }
        let changed = self.last_report.as_ref() != Some(report);
        if changed {
            self.last_report = Some(report.clone());
        }
        Noted { restart, changed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(progress: Option<f64>, message: &str) -> Option<LoadingProgress> {
        Some(LoadingProgress {
            progress,
            message: message.into(),
        })
    }

    /// llama-swap's `TestProcessCommand_ParseLoadingProgress`, case for case.
    #[test]
    fn reports_are_read_as_llama_swap_reads_them() {
        let cases: [(&str, Option<LoadingProgress>); 11] = [
            (
                r#"{"progress":0.25,"message":"loading tensors"}"#,
                report(Some(0.25), "loading tensors"),
            ),
            (r#"{"progress":0}"#, report(Some(0.0), "")),
            (
                r#"{"message":"  warming up  "}"#,
                report(None, "warming up"),
            ),
            (r#"{"progress":7}"#, report(Some(1.0), "")),
            (r#"{"progress":-1}"#, report(Some(0.0), "")),
            (
                r#"{"status":"loading","source":"kyojin","message":"loading weights, 42% (stage 2 of 4)","progress":0.42,"stage":"weights","stage_index":2,"eta_s":null}"#,
                report(Some(0.42), "loading weights, 42% (stage 2 of 4)"),
            ),
            (
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
                None,
            ),
            (r#"{"message":""}"#, None),
            ("Service Unavailable", None),
            ("", None),
            (r#"{"progress":"half"}"#, None),
        ];
        for (body, want) in cases {
            assert_eq!(parse(body.as_bytes()), want, "{body}");
        }
    }

    #[test]
    fn only_an_object_is_a_report_and_names_match_in_any_case() {
        assert_eq!(parse(b"[0.5, \"x\"]"), None);
        assert_eq!(parse(b"0.5"), None);
        assert_eq!(parse(br#"{"message":5}"#), None);
        assert_eq!(
            parse(br#"{"progress":null,"message":"x"}"#),
            report(None, "x")
        );
        assert_eq!(parse(br#"{"Progress":0.5}"#), report(Some(0.5), ""));
    }

    /// llama-swap's `TestProcessCommand_ParseLoadingProgressTrimsMessage`: the cut lands on a
    /// character's edge.
    #[test]
    fn a_long_message_is_cut_at_1024_characters() {
        let long = "é".repeat(MESSAGE_MAX_CHARS + 10);
        let body = serde_json::json!({ "message": long }).to_string();
        let got = parse(body.as_bytes()).expect("a report");
        assert_eq!(got.message, "é".repeat(MESSAGE_MAX_CHARS));
    }

    #[test]
    fn a_body_over_64_kib_is_not_a_report() {
        let padding = " ".repeat(BODY_MAX_BYTES);
        let body = format!(r#"{{"progress":0.5}}{padding}"#);
        assert_eq!(parse(body.as_bytes()), None);
        let fits = format!(r#"{{"progress":0.5}}{}"#, &padding[..BODY_MAX_BYTES - 20]);
        assert_eq!(parse(fits.as_bytes()), report(Some(0.5), ""));
    }

    #[test]
    fn only_a_new_progress_value_restarts_the_countdown() {
        let mut countdown = Countdown::default();
        let r = |p, m| report(p, m).unwrap();
        let noted = |restart, changed| Noted { restart, changed };
        assert_eq!(countdown.note(&r(None, "starting")), noted(false, true));
        assert_eq!(countdown.note(&r(Some(0.1), "a")), noted(true, true));
        assert_eq!(countdown.note(&r(Some(0.1), "a")), noted(false, false));
        assert_eq!(countdown.note(&r(Some(0.1), "eta 9s")), noted(false, true));
        assert_eq!(countdown.note(&r(Some(0.2), "eta 9s")), noted(true, true));
    }
}

/// The countdown as an engine's start lives it: an engine that keeps reporting new progress loads
/// past its timeout, one whose progress is stuck (whatever its message says) does not.
#[cfg(test)]
mod wait_tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::logs::{LogRing, Logs};
    use crate::supervisor::{HealthClient, Process, ProcessSpec, Sinks, Spawner, StartError};

    /// A health route that answers 503 with `report(elapsed)` until `ready_after`, then 200.
    async fn health_route(ready_after: Option<Duration>, report: fn(Duration) -> String) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        let started = Instant::now();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 1024];
                let _ = conn.read(&mut request).await;
                let elapsed = started.elapsed();
                let (status, body) = match ready_after {
                    Some(after) if elapsed >= after => ("200 OK", "{}".to_string()),
                    _ => ("503 Service Unavailable", report(elapsed)),
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        url
    }

    /// A `sleep` engine checked at `url`, with a one-second `healthCheckTimeout` that progress
    /// alone may extend (no `loadTimeout`).
    fn spec(url: &str) -> ProcessSpec {
        ProcessSpec {
            id: "m".into(),
            argv: vec!["sleep".into(), "30".into()],
            base: "http://127.0.0.1:9".into(),
            env: vec![],
            withheld: vec![],
            cmd_stop: None,
            health_url: Some(url.parse().unwrap()),
            load_timeout: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            extend_on_progress: false,
        }
    }

    /// Starts the engine and waits for it as the fleet does: how it ended, after how long, and
    /// the reports it showed.
    async fn start(
        url: String,
    ) -> (
        Result<(), StartError>,
        Duration,
        Vec<super::LoadingProgress>,
    ) {
        let spawner = Spawner::start(tokio::runtime::Handle::current()).unwrap();
        let spec = spec(&url);
        let sinks = Sinks {
            model: Arc::new(LogRing::default()),
            logs: Arc::new(Logs::default()),
            upstream_to_stdout: false,
            redactor: Default::default(),
        };
        let process = Process::spawn(&spawner, &spec, sinks, "m").await.unwrap();
        let (started, mut shown) = (Instant::now(), Vec::new());
        let health = HealthClient::default();
        let ended = process.wait_ready(&spec, &health, |r| shown.push(r)).await;
        let took = started.elapsed();
        process.stop(&spec, Duration::ZERO, &spawner).await;
        (ended, took, shown)
    }

    /// llama-swap's `TestProcessCommand_LoadingProgressExtendsTimeout` and
    /// `TestProcessCommand_LoadingProgressStalls`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_progress_restarts_the_countdown_and_stuck_progress_times_out() {
        fn advancing(elapsed: Duration) -> String {
            let step = elapsed.as_millis() / 400 + 1;
            format!(
                r#"{{"progress":{},"message":"step {step}"}}"#,
                step as f64 / 10.0
            )
        }
        fn stuck(elapsed: Duration) -> String {
            format!(
                r#"{{"progress":0.1,"message":"eta {}ms"}}"#,
                elapsed.as_millis()
            )
        }
        let slow = health_route(Some(Duration::from_millis(2500)), advancing).await;
        let stalled = health_route(None, stuck).await;
        let ((slow, slow_took, reports), (stalled, stalled_took, _)) =
            tokio::join!(start(slow), start(stalled));
        assert!(slow.is_ok(), "{slow:?}");
        assert!(slow_took >= Duration::from_millis(2400), "{slow_took:?}");
        assert_eq!(reports[0].message, "step 1", "{reports:?}");
        assert!(reports.len() >= 5, "each new report is shown: {reports:?}");
        assert!(
            matches!(stalled, Err(StartError::Timeout { .. })),
            "{stalled:?}"
        );
        assert!(
            stalled_took < Duration::from_millis(2000),
            "{stalled_took:?}"
        );
    }
}
