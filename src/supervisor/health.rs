//! Readiness probes: one HTTP GET of an engine's health endpoint, read as ready, not yet (with the
//! loading progress the answer may carry), or unreachable.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::progress::{self, LoadingProgress};
use super::ProcessSpec;

/// One readiness probe's answer.
pub enum Probe {
    Ready,
    /// Not ready: a fingerprint of the answer when there was one, and the loading progress it
    /// reported.
    NotReady {
        answer: Option<u64>,
        loading: Option<LoadingProgress>,
    },
}

/// A small client for health probes.
#[derive(Clone)]
pub struct HealthClient {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
}

impl Default for HealthClient {
    fn default() -> Self {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        HealthClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl HealthClient {
    async fn get_json(&self, url: String) -> Option<(http::StatusCode, serde_json::Value)> {
        let (status, body) = self.get(url).await?;
        let value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        Some((status, value))
    }

    /// A GET within two seconds: its status and body.
    pub async fn get(&self, url: String) -> Option<(http::StatusCode, bytes::Bytes)> {
        let fut = async {
            let resp = self.client.get(url.parse().ok()?).await.ok()?;
            let status = resp.status();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        };
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .ok()
            .flatten()
    }

    /// Requests an engine of `kind` holds (running and waiting), from its own load report
    /// (`vllm:num_requests_running`, `tgi_queue_size`, Ollama's `/api/ps`, ...); `None` when it
    /// publishes none or does not answer.
    pub async fn engine_load(
        &self,
        spec: &ProcessSpec,
        kind: crate::engines::EngineKind,
    ) -> Option<usize> {
        let path = kind.load_report().path?;
        let url = format!("{}{path}", spec.base.trim_end_matches('/'));
        let (status, body) = self.get(url).await?;
        let text = std::str::from_utf8(&body)
            .ok()
            .filter(|_| status.is_success())?;
        let load = crate::engines::read_load(kind, text)?;
        Some((load.running + load.waiting) as usize)
    }

    /// Slots the engine reports: `/props` `total_slots`, else the length of `/slots`.
    pub async fn total_slots(&self, spec: &ProcessSpec) -> Option<usize> {
        let base = spec.base.trim_end_matches('/');
        if let Some((status, v)) = self.get_json(format!("{base}/props")).await {
            if let Some(n) = v
                .get("total_slots")
                .and_then(|n| n.as_u64())
                .filter(|n| status.is_success() && *n > 0)
            {
                return Some(n as usize);
            }
        }
        let (status, v) = self.get_json(format!("{base}/slots")).await?;
        v.as_array()
            .filter(|a| status.is_success() && !a.is_empty())
            .map(|a| a.len())
    }

    /// How many of the engine's slots are processing, from `/slots`; `None` when it has no such route.
    pub async fn slots_processing(&self, spec: &ProcessSpec) -> Option<usize> {
        let (status, v) = self
            .get_json(format!("{}/slots", spec.base.trim_end_matches('/')))
            .await?;
        let slots = v.as_array().filter(|_| status.is_success())?;
        Some(
            slots
                .iter()
                .filter(|s| {
                    s.get("is_processing")
                        .and_then(|p| p.as_bool())
                        .unwrap_or(false)
                })
                .count(),
        )
    }

    /// Ready on a 200; otherwise a fingerprint of the answer, to notice a load that is moving,
    /// and the loading progress it reports. At most [`progress::BODY_MAX_BYTES`] of a body are
    /// read: a larger one is no report, and the rest of it is left unread.
    pub async fn probe(&self, url: &http::Uri) -> Probe {
        let fut = async {
            let resp = self.client.get(url.clone()).await.ok()?;
            let status = resp.status();
            let body = read_capped(resp.into_body(), progress::BODY_MAX_BYTES).await?;
            Some((status, body))
        };
        match tokio::time::timeout(Duration::from_secs(2), fut).await {
            Ok(Some((status, _))) if status == http::StatusCode::OK => Probe::Ready,
            Ok(Some((status, body))) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (status.as_u16(), &body[..]).hash(&mut h);
                Probe::NotReady {
                    answer: Some(h.finish()),
                    loading: progress::parse(&body),
                }
            }
            _ => Probe::NotReady {
                answer: None,
                loading: None,
            },
        }
    }
}

/// A body's first bytes, up to one past `cap` (so that a larger body shows as larger); `None`
/// when it breaks off.
async fn read_capped(mut body: hyper::body::Incoming, cap: usize) -> Option<Vec<u8>> {
    let mut read = Vec::new();
    while read.len() <= cap {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.ok()?.into_data() {
            let room = cap + 1 - read.len();
            read.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Some(read)
}
