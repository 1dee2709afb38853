//! vLLM's sleep mode and SGLang's memory release, imitated: the engine frees its GPU and keeps
//! its process, refuses inference while asleep, and wakes in `--wake-ms`.
//!
//! vLLM serves `POST /sleep?level=N`, `POST /wake_up`, `GET /is_sleeping`, `POST /collective_rpc`
//! and `POST /reset_prefix_cache` only when started with `--enable-sleep-mode` and with
//! `VLLM_SERVER_DEV_MODE=1` in its environment; elsewhere they are not found. After a level 2
//! sleep the weights are gone: a wake alone leaves it refusing inference until
//! `collective_rpc {"method": "reload_weights"}`. SGLang serves
//! `POST /release_memory_occupation` and `POST /resume_memory_occupation` with
//! `--enable-memory-saver`. `--fail-sleep` and `--fail-wake` make those calls answer 500.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};

use crate::args::Config;
use crate::events::Events;
use crate::imitate::Kind;

/// Whether the engine sleeps, and whether its weights must be reloaded before it serves.
#[derive(Debug, Default)]
pub struct Rest {
    /// 0 awake, else the level it sleeps at.
    level: AtomicU8,
    /// Woken from level 2 and not reloaded yet: no weights to serve with.
    weightless: AtomicBool,
}

impl Rest {
    /// True while inference must be refused: asleep, or woken without its weights.
    pub fn refuses(&self) -> bool {
        self.level.load(Ordering::Acquire) > 0 || self.weightless.load(Ordering::Acquire)
    }
}

/// llama-server's own idle sleep (`--sleep-idle-seconds`): asleep once nothing was asked of the
/// model for that long, shown as `is_sleeping` in `/props`; the next request wakes it.
#[derive(Debug, Default)]
pub struct Idle {
    /// When a request last used the model, in ms since start.
    last_used_ms: AtomicU64,
}

impl Idle {
    /// A request uses the model at `now_ms`; true when it found the engine asleep (it wakes).
    pub fn used(&self, cfg: &Config, now_ms: u64, others_active: bool) -> bool {
        let asleep = self.asleep(cfg, now_ms, others_active);
        self.last_used_ms.store(now_ms, Ordering::Release);
        asleep
    }

    /// Asleep at `now_ms`: idle sleep on, no other request in flight, and idle long enough.
    pub fn asleep(&self, cfg: &Config, now_ms: u64, others_active: bool) -> bool {
        let Some(idle_s) = cfg.sleep_idle_seconds else {
            return false;
        };
        let since = now_ms.saturating_sub(self.last_used_ms.load(Ordering::Acquire));
        !others_active && since >= idle_s * 1000
    }
}

/// An answer: status and JSON body.
pub type Answer = (u16, Value);

/// Answers a sleep route, or `None` when `path` is not one this engine serves now.
pub async fn route(
    cfg: &Config,
    rest: &Rest,
    events: Option<&Events>,
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Option<Answer> {
    let vllm = cfg.imitate == Kind::Vllm && cfg.enable_sleep_mode && dev_mode();
    let sglang = cfg.imitate == Kind::Sglang && cfg.enable_memory_saver;
    let answer = match (method.clone(), path) {
        (Method::GET, "/is_sleeping") if vllm => (
            200,
            json!({"is_sleeping": rest.level.load(Ordering::Acquire) > 0}),
        ),
        (Method::POST, "/sleep") if vllm => sleep(cfg, rest, level_of(query)),
        (Method::POST, "/release_memory_occupation") if sglang => sleep(cfg, rest, 1),
        (Method::POST, "/wake_up" | "/resume_memory_occupation") if vllm || sglang => {
            wake(cfg, rest).await
        }
        (Method::POST, "/collective_rpc") if vllm => reload(rest, body),
        (Method::POST, "/reset_prefix_cache") if vllm => (200, json!({})),
        _ => return None,
    };
    if let Some(ev) = events {
        let fields = [("path", json!(path)), ("status", json!(answer.0))];
        ev.emit("sleep_call", &fields);
    }
    Some(answer)
}

/// vLLM's development routes exist only with `VLLM_SERVER_DEV_MODE=1`.
fn dev_mode() -> bool {
    std::env::var("VLLM_SERVER_DEV_MODE").is_ok_and(|v| v == "1")
}

/// `level=N` of the query; vLLM's default is 1.
fn level_of(query: Option<&str>) -> u8 {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("level="))
        .and_then(|l| l.parse().ok())
        .unwrap_or(1)
}

fn sleep(cfg: &Config, rest: &Rest, level: u8) -> Answer {
    if cfg.fail_sleep {
        return (500, json!({"error": "sleep failed (--fail-sleep)"}));
    }
    rest.level.store(level.max(1), Ordering::Release);
    (200, json!({}))
}

async fn wake(cfg: &Config, rest: &Rest) -> Answer {
    if cfg.fail_wake {
        return (500, json!({"error": "wake failed (--fail-wake)"}));
    }
    tokio::time::sleep(Duration::from_millis(cfg.wake_ms)).await;
    let level = rest.level.swap(0, Ordering::AcqRel);
    if level == 2 {
        rest.weightless.store(true, Ordering::Release);
    }
    (200, json!({}))
}

/// `collective_rpc`: only `reload_weights` is known, which brings back a level 2 sleeper's weights.
fn reload(rest: &Rest, body: &[u8]) -> Answer {
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match asked.get("method").and_then(Value::as_str) {
        Some("reload_weights") => {
            rest.weightless.store(false, Ordering::Release);
            (200, json!({"results": [null]}))
        }
        other => (400, json!({"error": format!("unknown method {other:?}")})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_level_two_sleeper_serves_only_once_its_weights_are_reloaded() {
        let cfg = Config {
            imitate: Kind::Vllm,
            enable_sleep_mode: true,
            ..Config::default()
        };
        let rest = Rest::default();
        assert!(!rest.refuses());
        std::env::set_var("VLLM_SERVER_DEV_MODE", "1");
        let call = |m: Method, p: &'static str, q: Option<&'static str>, b: &'static [u8]| {
            let (cfg, rest) = (&cfg, &rest);
            async move { route(cfg, rest, None, &m, p, q, b).await.map(|a| a.0) }
        };
        assert_eq!(
            call(Method::POST, "/sleep", Some("level=2"), b"").await,
            Some(200)
        );
        assert!(rest.refuses());
        assert_eq!(call(Method::POST, "/wake_up", None, b"").await, Some(200));
        assert!(rest.refuses(), "weights gone until reloaded");
        let reload = br#"{"method": "reload_weights"}"#;
        assert_eq!(
            call(Method::POST, "/collective_rpc", None, reload).await,
            Some(200)
        );
        assert!(!rest.refuses());
        let plain = Config::default();
        let none = route(&plain, &rest, None, &Method::POST, "/sleep", None, b"").await;
        assert!(none.is_none(), "llama-server has no such route");
    }
}
