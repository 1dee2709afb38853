//! API keys: Basic password, Bearer token or `x-api-key`, compared in constant time, each with a
//! scope that limits which routes it reaches.

use base64::Engine;
use http::{header, HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};
use std::sync::Arc;

use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use crate::api::hosts::HostRule;
use crate::config::{ApiKey, Scope};
use crate::proxy::error::Error;
use crate::proxy::headers::X_API_KEY;
use crate::routing::grant::Grant;

/// Header names looked up on every model request, made once (a name given as text is parsed for
/// each lookup).
static SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Digests of the configured keys with their grants; comparing digests keeps the comparison
/// length-independent.
pub struct Keys {
    keys: Vec<([u8; 32], Arc<Grant>)>,
    /// `/metrics` needs no key (`openMetrics`).
    open_metrics: bool,
    /// The names a loopback listener answers to; `None` on any other listener.
    hosts: Option<HostRule>,
}

impl Keys {
    pub fn new(keys: &[ApiKey]) -> Keys {
        Keys {
            keys: keys
                .iter()
                .map(|k| {
                    (
                        Sha256::digest(k.key.as_bytes()).into(),
                        Arc::new(Grant::new(k)),
                    )
                })
                .collect(),
            open_metrics: false,
            hosts: None,
        }
    }

    /// The keys of a config, with its open routes, and its `Host` rule when corral listens on a
    /// loopback address.
    pub fn for_config(config: &crate::config::Config, loopback_listener: bool) -> Keys {
        Keys {
            open_metrics: config.open_metrics,
            hosts: loopback_listener.then(|| HostRule::new(&config.allowed_hosts)),
            ..Keys::new(&config.api_keys)
        }
    }

    /// Ok unless a loopback listener is reached by a name it does not answer to.
    pub fn admit_host(&self, headers: &HeaderMap, uri: &http::Uri) -> Result<(), Error> {
        self.hosts
            .as_ref()
            .map_or(Ok(()), |rule| rule.admit(headers, uri))
    }

    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether `path` answers without a key although keys are configured.
    pub fn open(&self, path: &str) -> bool {
        self.open_metrics && path == "/metrics"
    }

    /// The grant of the key the request presents, when its scope reaches `needed`; `None` when no
    /// key is configured. 401 for a missing or unknown key, 403 for a known key without the scope.
    pub fn check(&self, headers: &HeaderMap, needed: Scope) -> Result<Option<Arc<Grant>>, Error> {
        if self.keys.is_empty() {
            return Ok(None);
        }
        // every key the request presents counts: a client may send corral's key in `x-api-key`
        // and its engine's own key in `Authorization`
        let mut known = false;
        for presented in presented_keys(headers) {
            let (k, granted) = self.lookup(&presented, needed);
            if granted.is_some() {
                return Ok(granted);
            }
            known |= k;
        }
        match known {
            true => Err(Error::Forbidden(format!(
                "forbidden: this API key lacks the {} scope",
                needed.name()
            ))),
            false => Err(Error::Unauthorized),
        }
    }

    /// Whether `presented` is a configured key, and the grant of an entry of it that reaches
    /// `needed`. Every configured key is compared, so the time taken does not depend on which one
    /// matched.
    fn lookup(&self, presented: &str, needed: Scope) -> (bool, Option<Arc<Grant>>) {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let (mut known, mut allowed) = (Choice::from(0), Choice::from(0));
        let mut chosen = 0u32;
        for (i, (key, grant)) in self.keys.iter().enumerate() {
            let hit = key.ct_eq(&digest);
            let reaches = hit & Choice::from(u8::from(grant.scope.allows(needed)));
            known |= hit;
            allowed |= reaches;
            chosen.conditional_assign(&(i as u32), reaches);
        }
        let granted = bool::from(allowed).then(|| self.keys[chosen as usize].1.clone());
        (known.into(), granted)
    }

    fn is_known(&self, presented: &str) -> bool {
        self.lookup(presented, Scope::Admin).0
    }

    /// Removes corral's own key headers before a request goes on: `x-api-key`, and `Authorization`
    /// when it carries a corral key (one meant for an engine's own `--api-key` passes). With no
    /// keys configured nothing is removed, as llama-swap forwards them.
    pub fn strip_own(&self, headers: &mut HeaderMap) {
        if self.keys.is_empty() {
            return;
        }
        headers.remove(&X_API_KEY);
        let authorization_is_ours = authorization_key(headers).is_some_and(|k| self.is_known(&k));
        if authorization_is_ours {
            headers.remove(header::AUTHORIZATION);
        }
    }
}

/// The scope a route needs: model routes and the model list are inference, `/metrics` is metrics,
/// everything else (management, logs, events, unload, load) is admin.
pub fn scope_for(path: &str) -> Scope {
    if path == "/metrics" {
        Scope::Metrics
    } else if is_model_route(path) {
        Scope::Inference
    } else {
        Scope::Admin
    }
}

/// Model routes (any method), the model list and its entries, and the load report peers read.
fn is_model_route(path: &str) -> bool {
    matches!(path, "/v1/models" | "/models" | "/api/load")
        || path.starts_with("/v1/models/")
        || path.starts_with("/upstream/")
        || crate::routing::inference::model_route(path).is_some()
        || crate::routing::inference::query_route(path).is_some()
        || crate::api::ollama::inference_scoped(path)
}

/// The peer paths corral's key for a peer is sent on: those an inference key reaches (its model
/// routes, model list and load report), never its own `/upstream/`. An admin passing another path
/// through to a peer sends it with no key of corral's, so no client borrows that key to read the
/// peer's captures or logs or unload its models.
pub fn peer_key_route(path: &str) -> bool {
    is_model_route(path) && !path.starts_with("/upstream/")
}

/// Routes that change state: a browser on another site must not reach them.
pub fn changes_state(method: &Method, path: &str) -> bool {
    match *method {
        Method::GET | Method::HEAD => path == "/unload",
        Method::POST => {
            path == "/api/models/unload"
                || matches!(path, "/models/load" | "/models/unload")
                || path.starts_with("/api/models/unload/")
                || path.starts_with("/api/models/load/")
                || (path.starts_with("/api/inflight/") && path.ends_with("/cancel"))
        }
        Method::PUT => path == "/api/profiles/active",
        _ => false,
    }
}

/// A model request a browser on another site could send without asking first (no CORS preflight):
/// a POST of a form, multipart or plain-text body, or a GET that names a model (`/upstream/<m>/..`,
/// `/props?model=`, a websocket), carrying no key header. A page could make one with a `<form>`,
/// an `<img>` or a `WebSocket` and load a model, or swap out the ones serving. A JSON body or a key
/// header makes the browser ask first, and CORS answers that for model routes, so those stay open
/// to browser apps.
pub fn simple_model_request(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    let simple = match *method {
        Method::POST => is_model_route(path) && simple_body(headers),
        Method::GET | Method::HEAD => {
            path.starts_with("/upstream/") || crate::routing::inference::query_route(path).is_some()
        }
        _ => false,
    };
    simple && !headers.contains_key(header::AUTHORIZATION) && !headers.contains_key(&X_API_KEY)
}

/// A body a `<form>` can send: none, a form, multipart or plain text.
fn simple_body(headers: &HeaderMap) -> bool {
    // no allocation: this runs for every model POST
    let ct = crate::routing::extract::content_type(headers).as_bytes();
    ct.is_empty()
        || [
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "text/plain",
        ]
        .iter()
        .any(|t| {
            ct.get(..t.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(t.as_bytes()))
        })
}

/// True for a request a browser sent from another origin. Browsers say so in `Sec-Fetch-Site`,
/// which is trusted alone where present (a proxy that rewrites `Host` cannot confuse it): only
/// `same-origin` and `none` (typed in the address bar) pass, since `same-site` is also a page on
/// another port of the same host (`localhost:3000`) or a sibling subdomain. Otherwise an `Origin`
/// whose host is not the one the request was sent to (`Host`, or the HTTP/2 authority). Requests
/// without either (curl, scripts, a same-origin GET) are not cross-site.
pub fn cross_site(headers: &HeaderMap, uri: &http::Uri) -> bool {
    if let Some(site) = headers.get(&SEC_FETCH_SITE).and_then(|v| v.to_str().ok()) {
        return !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.parse::<http::Uri>().ok())
        .and_then(|u| u.authority().cloned());
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .or_else(|| uri.authority().cloned());
    match (origin_host, host) {
        // Authority compares the host part case-insensitively
        (Some(o), Some(h)) => o != h,
        _ => true,
    }
}

/// The keys a request presents: the Basic password or Bearer token, and `x-api-key`.
pub fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = String> {
    let api_key = headers
        .get(&X_API_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(String::from);
    authorization_key(headers).into_iter().chain(api_key)
}

/// The key in `Authorization`: Basic password, else Bearer token.
fn authorization_key(headers: &HeaderMap) -> Option<String> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(encoded) = auth.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (_, password) = text.split_once(':')?;
        return (!password.is_empty()).then(|| password.to_string());
    }
    auth.strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
}

#[cfg(test)]
mod tests;
