//! `sendLoadingState`: a streaming chat request to a model that is not ready gets a 200 SSE stream
//! at once, with progress as `reasoning_content`, and then the real answer in the same response.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::sync::mpsc;

use crate::config::catalog::Target;
use crate::proxy::body::Body;
use crate::routing::forward::forward_local;
use crate::routing::Gateway;
use crate::supervisor::LoadingProgress;

fn reasoning(text: &str) -> Bytes {
    let chunk = json!({"id": "corral-loading", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"reasoning_content": text}}]});
    Bytes::from(format!("data: {chunk}\n\n"))
}

pub fn stream(
    gateway: Arc<Gateway>,
    model_id: String,
    target: Target,
    parts: http::request::Parts,
    bytes: Bytes,
    path_and_query: std::borrow::Cow<'static, str>,
    remote: SocketAddr,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let _ = tx.send(reasoning("━━━━━\n")).await;
        let _ = tx
            .send(reasoning(&format!("corral loading model: {model_id}\n")))
            .await;
        let Some(model) = gateway.config.models.get(&model_id).cloned() else {
            return;
        };
        let forward = forward_local(
            &gateway,
            &model,
            target,
            parts,
            bytes,
            path_and_query,
            remote,
        );
        tokio::pin!(forward);
        let mut dots = tokio::time::interval(Duration::from_millis(750));
        dots.tick().await;
        let mut shown = None;
        let result = loop {
            tokio::select! {
                r = &mut forward => break r,
                _ = dots.tick() => {
                    let line = match gateway.fleet.download_of(&model_id) {
                        Some(d) => reasoning(&download_line(&d)),
                        None => reasoning(&progress_line(gateway.fleet.loading_of(&model_id), &mut shown)),
                    };
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
            }
        };
        send_answer(&tx, result, started).await;
    });
    crate::proxy::body::sse_from_task(rx, task)
}

/// After the progress lines: how long loading took and the model's own stream, or the error as an
/// SSE event. Ends early when the client has left.
async fn send_answer(
    tx: &mpsc::Sender<Bytes>,
    result: Result<Response<Body>, crate::proxy::error::Error>,
    started: Instant,
) {
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => {
            let _ = tx.send(e.sse_event()).await;
            return;
        }
    };
    let _ = tx
        .send(reasoning(&format!(
            "\nDone! ({:.2}s)\n━━━━━\n",
            started.elapsed().as_secs_f64()
        )))
        .await;
    let mut body = resp.into_body();
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let data = frame.into_data().unwrap_or_default();
                if tx.send(data).await.is_err() {
                    return;
                }
            }
            // the engine died or the connection broke: the stream ends with the error event the
            // plain path sends, not as if the answer were whole
            Some(Err(e)) => {
                let _ = tx
                    .send(crate::observe::meter::stream_error_event(&e.to_string()))
                    .await;
                return;
            }
            None => return,
        }
    }
}

/// What a tick shows of the engine's own report: the report when it changed since the last one
/// shown, else a dot.
fn progress_line(report: Option<LoadingProgress>, shown: &mut Option<LoadingProgress>) -> String {
    match report {
        Some(r) if shown.as_ref() != Some(&r) => {
            let line = loading_line(&r);
            *shown = Some(r);
            line
        }
        _ => ".".to_string(),
    }
}

/// One line of an engine's report: its percentage and its message, as far as it gave them.
fn loading_line(r: &LoadingProgress) -> String {
    match r.progress {
        Some(p) if r.message.is_empty() => format!("\nloading {:.0}%", p * 100.0),
        Some(p) => format!("\nloading {:.0}%: {}", p * 100.0, r.message),
        None => format!("\nloading: {}", r.message),
    }
}

/// One progress line of a download: file, bytes of total, rate and time left.
fn download_line(d: &crate::fleet::Download) -> String {
    let size = crate::memory::format_bytes;
    let total = d.total.map_or_else(|| "?".to_string(), size);
    let eta = d
        .eta_seconds
        .map_or_else(String::new, |s| format!(", {s:.0}s left"));
    format!(
        "\ndownloading {}: {} of {total} ({}/s{eta})",
        d.file,
        size(d.bytes),
        size(d.bytes_per_second as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_shown_once_then_dots_until_it_changes() {
        let report = |p, m: &str| LoadingProgress {
            progress: p,
            message: m.into(),
        };
        let mut shown = None;
        let half = report(Some(0.5), "tensors");
        assert_eq!(progress_line(None, &mut shown), ".");
        assert_eq!(
            progress_line(Some(half.clone()), &mut shown),
            "\nloading 50%: tensors"
        );
        assert_eq!(progress_line(Some(half), &mut shown), ".");
        let warm = report(None, "warming up");
        assert_eq!(
            progress_line(Some(warm), &mut shown),
            "\nloading: warming up"
        );
        let quarter = report(Some(0.25), "");
        assert_eq!(progress_line(Some(quarter), &mut shown), "\nloading 25%");
    }
}
