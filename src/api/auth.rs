//! API keys: Basic password, Bearer token or `x-api-key`, compared in constant time, each with a
//! scope that limits which routes it reaches.

use base64::Engine;
use http::{header, HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};
use std::sync::Arc;

use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use super::grant::Grant;
use super::hosts::HostRule;
use crate::config::{ApiKey, Scope};
use crate::error::Error;

/// Header names looked up on every model request, made once (a name given as text is parsed for
/// each lookup).
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
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

/// Model routes (any method), the model list, and the load report peers read.
fn is_model_route(path: &str) -> bool {
    matches!(path, "/v1/models" | "/models" | "/api/load")
        || path.starts_with("/upstream/")
        || super::inference::model_route(path).is_some()
        || super::inference::query_route(path).is_some()
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
            path.starts_with("/upstream/") || super::inference::query_route(path).is_some()
        }
        _ => false,
    };
    simple && !headers.contains_key(header::AUTHORIZATION) && !headers.contains_key(&X_API_KEY)
}

/// A body a `<form>` can send: none, a form, multipart or plain text.
fn simple_body(headers: &HeaderMap) -> bool {
    // no allocation: this runs for every model POST
    let ct = super::extract::content_type(headers).as_bytes();
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
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        h
    }

    fn admin(key: &str) -> Keys {
        Keys::new(&[ApiKey {
            key: key.into(),
            scope: Scope::Admin,
            name: None,
            models: vec![],
        }])
    }

    #[test]
    fn accepts_all_three_forms() {
        let keys = admin("sekrit");
        for form in [
            ("authorization", "Bearer sekrit".to_string()),
            ("x-api-key", "sekrit".to_string()),
            (
                "authorization",
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("anyone:sekrit")
                ),
            ),
        ] {
            let h = headers(&[(form.0, &form.1)]);
            assert!(keys.check(&h, Scope::Admin).is_ok(), "{form:?}");
        }
    }

    #[test]
    fn rejects_near_misses() {
        let keys = admin("sekrit");
        for wrong in ["Sekrit", "sekri", "sekrit2", "xekrit", ""] {
            let h = headers(&[("x-api-key", wrong)]);
            assert!(
                matches!(keys.check(&h, Scope::Admin), Err(Error::Unauthorized)),
                "{wrong}"
            );
        }
        assert!(keys.check(&HeaderMap::new(), Scope::Admin).is_err());
        assert!(Keys::new(&[])
            .check(&HeaderMap::new(), Scope::Admin)
            .is_ok());
    }

    #[test]
    fn a_key_in_either_header_counts() {
        let keys = admin("ours");
        let both = headers(&[
            ("authorization", "Bearer engine-own"),
            ("x-api-key", "ours"),
        ]);
        assert!(keys.check(&both, Scope::Admin).is_ok());
        let neither = headers(&[("authorization", "Bearer engine-own"), ("x-api-key", "x")]);
        assert!(keys.check(&neither, Scope::Admin).is_err());
    }

    #[test]
    fn scopes_reach_only_their_routes() {
        let keys = Keys::new(&[
            ApiKey {
                key: "inf".into(),
                scope: Scope::Inference,
                name: None,
                models: vec![],
            },
            ApiKey {
                key: "met".into(),
                scope: Scope::Metrics,
                name: None,
                models: vec![],
            },
        ]);
        let with = |k: &str| headers(&[("x-api-key", k)]);
        assert!(keys.check(&with("inf"), Scope::Inference).is_ok());
        assert!(matches!(
            keys.check(&with("inf"), Scope::Admin),
            Err(Error::Forbidden(m)) if m.contains("admin scope")
        ));
        assert!(keys.check(&with("met"), Scope::Metrics).is_ok());
        assert!(matches!(
            keys.check(&with("met"), Scope::Inference),
            Err(Error::Forbidden(m)) if m.contains("inference scope")
        ));
    }

    #[test]
    fn route_scopes() {
        assert_eq!(scope_for("/v1/chat/completions"), Scope::Inference);
        assert_eq!(scope_for("/upstream/m/props"), Scope::Inference);
        assert_eq!(scope_for("/v1/models"), Scope::Inference);
        assert_eq!(scope_for("/props"), Scope::Inference);
        assert_eq!(scope_for("/metrics"), Scope::Metrics);
        for admin_route in ["/running", "/unload", "/logs", "/api/events", "/upstream"] {
            assert_eq!(scope_for(admin_route), Scope::Admin, "{admin_route}");
        }
    }

    #[test]
    fn peer_keys_ride_on_model_routes_only() {
        for path in [
            "/v1/chat/completions",
            "/v1/embeddings",
            "/api/load",
            "/props",
        ] {
            assert!(peer_key_route(path), "{path}");
        }
        for path in [
            "/logs",
            "/api/captures/1",
            "/api/models/unload",
            "/running",
            "/slots",
        ] {
            assert!(!peer_key_route(path), "{path}");
        }
    }

    #[test]
    fn only_corral_keys_are_stripped() {
        let keys = admin("ours");
        let mut h = headers(&[
            ("authorization", "Bearer engine-key"),
            ("x-api-key", "ours"),
        ]);
        keys.strip_own(&mut h);
        assert_eq!(h.get("authorization").unwrap(), "Bearer engine-key");
        assert!(h.get("x-api-key").is_none());
        let mut h = headers(&[("authorization", "Bearer ours")]);
        keys.strip_own(&mut h);
        assert!(h.is_empty());
        let mut h = headers(&[("authorization", "Bearer ours"), ("x-api-key", "x")]);
        Keys::new(&[]).strip_own(&mut h);
        assert_eq!(h.len(), 2, "no keys configured: nothing is ours");
    }

    #[test]
    fn form_posts_to_model_routes_are_simple_requests() {
        let post = Method::POST;
        let form = headers(&[("content-type", "application/x-www-form-urlencoded")]);
        assert!(simple_model_request(&post, "/v1/chat/completions", &form));
        let multipart = headers(&[("content-type", "multipart/form-data; boundary=x")]);
        assert!(simple_model_request(
            &post,
            "/v1/audio/transcriptions",
            &multipart
        ));
        assert!(simple_model_request(
            &post,
            "/upstream/m/slots",
            &headers(&[])
        ));
        let json = headers(&[("content-type", "application/json")]);
        assert!(!simple_model_request(&post, "/v1/chat/completions", &json));
        let keyed = headers(&[
            ("content-type", "multipart/form-data; boundary=x"),
            ("authorization", "Bearer k"),
        ]);
        assert!(!simple_model_request(
            &post,
            "/v1/audio/transcriptions",
            &keyed
        ));
        assert!(!simple_model_request(
            &Method::GET,
            "/v1/models",
            &headers(&[])
        ));
    }

    #[test]
    fn gets_that_name_a_model_are_simple_requests() {
        let none = headers(&[]);
        for path in ["/upstream/m/health", "/props", "/sdapi/v1/loras"] {
            assert!(simple_model_request(&Method::GET, path, &none), "{path}");
            assert!(simple_model_request(&Method::HEAD, path, &none), "{path}");
        }
        let keyed = headers(&[("x-api-key", "k")]);
        assert!(!simple_model_request(&Method::GET, "/upstream/m/x", &keyed));
        for path in ["/v1/models", "/running", "/api/events"] {
            assert!(!simple_model_request(&Method::GET, path, &none), "{path}");
        }
    }

    #[test]
    fn cross_site_by_fetch_metadata_or_origin() {
        let uri: http::Uri = "/unload".parse().unwrap();
        let at = |pairs: &[(&str, &str)]| cross_site(&headers(pairs), &uri);
        assert!(!at(&[("host", "corral:8080")]));
        assert!(at(&[
            ("host", "corral:8080"),
            ("sec-fetch-site", "cross-site")
        ]));
        assert!(!at(&[
            ("host", "corral:8080"),
            ("sec-fetch-site", "same-origin")
        ]));
        assert!(!at(&[("host", "corral:8080"), ("sec-fetch-site", "none")]));
        // another port of the same host, or a sibling subdomain
        assert!(at(&[
            ("host", "localhost:8080"),
            ("sec-fetch-site", "same-site")
        ]));
        // behind a proxy that rewrites Host, the browser's own word decides
        assert!(!at(&[
            ("host", "corral:8080"),
            ("origin", "https://llm.example.com"),
            ("sec-fetch-site", "same-origin")
        ]));
        assert!(!at(&[
            ("host", "Corral:8080"),
            ("origin", "http://corral:8080")
        ]));
        assert!(at(&[
            ("host", "corral:8080"),
            ("origin", "http://evil.example")
        ]));
        assert!(at(&[("host", "corral:8080"), ("origin", "null")]));
        let h2: http::Uri = "http://corral:8080/unload".parse().unwrap();
        assert!(!cross_site(
            &headers(&[("origin", "http://corral:8080")]),
            &h2
        ));
    }
}
