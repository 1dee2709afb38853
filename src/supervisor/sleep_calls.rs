//! The HTTP calls that put an engine to sleep or wake it (`sleepEndpoints`, `wakeEndpoints`), made
//! in order to its base URL; the first that fails or answers other than 2xx ends the sequence.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::sleep::{SleepCall, DEFAULT_CALL_TIMEOUT};

/// Makes `calls` in order against `base`; the error names the step that failed and why.
pub async fn call_all(base: &str, calls: &[SleepCall], what: &str) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for (i, call) in calls.iter().enumerate() {
        let step = format!(
            "{what} step {}/{} ({} {})",
            i + 1,
            calls.len(),
            call.method,
            call.endpoint
        );
        let limit = call.timeout.unwrap_or(DEFAULT_CALL_TIMEOUT);
        match tokio::time::timeout(limit, one(&client, base, call)).await {
            Ok(Ok(())) => tracing::debug!("{step} done"),
            Ok(Err(e)) => return Err(format!("{step} failed: {e}")),
            Err(_) => return Err(format!("{step} took longer than {}s", limit.as_secs())),
        }
    }
    Ok(())
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn one(client: &HttpClient, base: &str, call: &SleepCall) -> Result<(), String> {
    let url = format!("{}{}", base.trim_end_matches('/'), call.endpoint);
    let mut req = http::Request::builder()
        .method(call.method.as_str())
        .uri(&url);
    if call.body.is_some() {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    let body = Full::new(Bytes::from(call.body.clone().unwrap_or_default()));
    let req = req.body(body).map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    Err(format!("answered {status}: {text}"))
}
