//! CORS: the answer to any OPTIONS request, and the `Access-Control-*` headers of every other
//! answer.
//!
//! Without `security.cors` corral answers as llama-swap v250 did: every preflight allows any
//! origin, and only the model list echoes `Origin`. With it, as llama-swap's `security.cors`:
//! headers only for a request whose `Origin` is allowed, and corral the only source of them (an
//! engine's own are removed, so its `*` never widens what corral allows). Either way, while keys
//! are set a management route allows no origin that is not listed by name: `*` reaches model
//! routes only.

use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::api::auth::{self, Keys};
use crate::config::{CorsConfig, Scope};
use crate::proxy::body::Body;

/// Chrome's Private Network Access preflight asks with this, and is answered with the next.
static REQUEST_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-request-private-network");
static ALLOW_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-allow-private-network");

/// What a preflight allows when the browser names no header, as llama-swap.
const DEFAULT_ALLOWED_HEADERS: &str = "Content-Type, Authorization, Accept, X-Requested-With";

/// A route a browser on another site may not reach with `*` because keys guard it: every route but
/// the model routes and the model list (`auth::scope_for`).
pub fn keyed_management(keys: &Keys, path: &str) -> bool {
    keys.required() && auth::scope_for(path) != Scope::Inference
}

/// The answer to any OPTIONS request: 204, with what the configured policy (or llama-swap v250's,
/// without one) allows the request's origin.
pub fn preflight(
    headers: &HeaderMap,
    cors: Option<&CorsConfig>,
    management: bool,
) -> Response<Body> {
    let mut resp = Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(crate::proxy::body::empty())
        .expect("valid");
    let out = resp.headers_mut();
    match cors {
        None => v250_preflight(headers, !management, out),
        Some(cors) => {
            add_vary(out, "Origin");
            if let Some(origin) = allowed_origin(cors, headers, management) {
                shared_headers(cors, origin, out);
                preflight_headers(cors, headers, out);
            }
        }
    }
    resp
}

/// llama-swap v250's preflight: any origin (except, while keys are set, on management routes),
/// its methods, the headers asked for, a day's cache.
fn v250_preflight(headers: &HeaderMap, any_origin: bool, out: &mut HeaderMap) {
    if any_origin {
        out.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    }
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, PATCH, DELETE, OPTIONS"),
    );
    let allowed = requested_headers(headers)
        .unwrap_or_else(|| HeaderValue::from_static(DEFAULT_ALLOWED_HEADERS));
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
}

/// What `Access-Control-Allow-Origin` says for this request, if anything: `*` where any origin
/// may read the route, else the request's own `Origin` when it is listed (as the browser spelled
/// it: it compares the answer with its own spelling).
pub fn allowed_origin(
    cors: &CorsConfig,
    headers: &HeaderMap,
    management: bool,
) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?;
    if cors.any_origin && !management {
        return Some(HeaderValue::from_static("*"));
    }
    cors.lists(origin.to_str().ok()?).then(|| origin.clone())
}

/// Sets corral's CORS headers on an answer other than a preflight, in place of any its engine
/// or peer sent; `origin` is what [`allowed_origin`] gave the request.
pub fn finish(cors: &CorsConfig, origin: Option<HeaderValue>, out: &mut HeaderMap) {
    strip_access_control(out);
    add_vary(out, "Origin");
    if let Some(origin) = origin {
        shared_headers(cors, origin, out);
    }
}

/// Every `Access-Control-*` header an upstream set: left in, it would add to corral's (a second
/// `Access-Control-Allow-Origin` makes strict clients refuse the answer) or widen it.
fn strip_access_control(out: &mut HeaderMap) {
    let theirs: Vec<HeaderName> = out
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for name in theirs {
        out.remove(name);
    }
}

/// The headers of both a preflight and the answer itself.
fn shared_headers(cors: &CorsConfig, origin: HeaderValue, out: &mut HeaderMap) {
    out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if cors.allow_credentials {
        out.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    if !cors.exposed_headers.is_empty() {
        out.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            joined(&cors.exposed_headers),
        );
    }
}

/// The headers only a preflight carries: methods, headers, cache time, private network.
fn preflight_headers(cors: &CorsConfig, headers: &HeaderMap, out: &mut HeaderMap) {
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        joined(&cors.allowed_methods),
    );
    let allowed = if !cors.allowed_headers.is_empty() {
        joined(&cors.allowed_headers)
    } else if let Some(requested) = requested_headers(headers) {
        add_vary(out, "Access-Control-Request-Headers");
        requested
    } else {
        HeaderValue::from_static(DEFAULT_ALLOWED_HEADERS)
    };
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from(cors.max_age),
    );
    let asks_private_network = headers
        .get(&REQUEST_PRIVATE_NETWORK)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    if cors.allow_private_network && asks_private_network {
        out.insert(
            ALLOW_PRIVATE_NETWORK.clone(),
            HeaderValue::from_static("true"),
        );
    }
}

/// `Access-Control-Request-Headers` with every name that is not a token dropped; `None` when
/// none is left.
fn requested_headers(headers: &HeaderMap) -> Option<HeaderValue> {
    let requested = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)?
        .to_str()
        .ok()?
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty() && h.bytes().all(is_token_byte))
        .collect::<Vec<_>>()
        .join(", ");
    HeaderValue::from_str(&requested)
        .ok()
        .filter(|v| !v.is_empty())
}

/// A configured list as one header value. Its entries are tokens (checked when the config was
/// read), which are valid header text.
fn joined(items: &[String]) -> HeaderValue {
    HeaderValue::from_str(&items.join(", ")).expect("tokens are valid header text")
}

/// Adds `token` to `Vary`, on one line, unless it is there already.
fn add_vary(out: &mut HeaderMap, token: &str) {
    let present: Vec<&str> = out
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if present
        .iter()
        .any(|v| *v == "*" || v.eq_ignore_ascii_case(token))
    {
        return;
    }
    let line = present
        .into_iter()
        .chain([token])
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(value) = HeaderValue::from_str(&line) {
        out.insert(header::VARY, value);
    }
}

/// A byte HTTP allows in a header name (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DASH: &str = "https://dash.example";

    fn policy(any_origin: bool, listed: &[&str]) -> CorsConfig {
        CorsConfig {
            any_origin,
            origins: listed.iter().map(|o| o.to_string()).collect(),
            allow_credentials: false,
            allow_private_network: false,
            allowed_methods: vec!["GET".into(), "POST".into()],
            allowed_headers: vec![],
            exposed_headers: vec![],
            max_age: 600,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    fn get<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
        h.get(name).map(|v| v.to_str().unwrap())
    }

    fn cors_names(h: &HeaderMap) -> Vec<&str> {
        h.keys()
            .map(HeaderName::as_str)
            .filter(|n| n.starts_with("access-control-"))
            .collect()
    }

    #[test]
    fn without_a_policy_a_preflight_answers_as_llama_swap_v250() {
        let asked = headers(&[("access-control-request-headers", "x-api-key, bad header,")]);
        let resp = preflight(&asked, None, false);
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        let h = resp.headers();
        assert_eq!(
            get(h, "access-control-allow-origin"),
            Some("*"),
            "no Origin needed"
        );
        assert_eq!(
            get(h, "access-control-allow-methods"),
            Some("GET, POST, PUT, PATCH, DELETE, OPTIONS")
        );
        assert_eq!(get(h, "access-control-allow-headers"), Some("x-api-key"));
        assert_eq!(get(h, "access-control-max-age"), Some("86400"));
        assert_eq!(get(h, "vary"), None);
        let keyed_management = preflight(&HeaderMap::new(), None, true);
        let h = keyed_management.headers();
        assert_eq!(get(h, "access-control-allow-origin"), None);
        assert_eq!(
            get(h, "access-control-allow-headers"),
            Some(DEFAULT_ALLOWED_HEADERS)
        );
    }

    #[test]
    fn a_policy_answers_only_an_allowed_origin() {
        let cors = policy(false, &[DASH]);
        for asked in [
            headers(&[]),
            headers(&[("origin", "https://evil.example")]),
            headers(&[("origin", "https://dash.example.evil.example")]),
        ] {
            let resp = preflight(&asked, Some(&cors), false);
            assert_eq!(resp.status(), StatusCode::NO_CONTENT);
            assert_eq!(cors_names(resp.headers()), Vec::<&str>::new(), "{asked:?}");
            assert_eq!(get(resp.headers(), "vary"), Some("Origin"));
        }
        let resp = preflight(
            &headers(&[("origin", "https://Dash.example")]),
            Some(&cors),
            false,
        );
        let h = resp.headers();
        assert_eq!(
            get(h, "access-control-allow-origin"),
            Some("https://Dash.example"),
            "the browser's own spelling"
        );
        assert_eq!(get(h, "access-control-allow-methods"), Some("GET, POST"));
        assert_eq!(
            get(h, "access-control-allow-headers"),
            Some(DEFAULT_ALLOWED_HEADERS)
        );
        assert_eq!(get(h, "access-control-max-age"), Some("600"));
        assert_eq!(get(h, "access-control-allow-credentials"), None);
        assert_eq!(get(h, "access-control-expose-headers"), None);
    }

    #[test]
    fn a_star_answers_star_but_not_on_keyed_management_routes() {
        let cors = policy(true, &[DASH]);
        let from = |origin| headers(&[("origin", origin)]);
        let allowed = |origin, management| allowed_origin(&cors, &from(origin), management);
        assert_eq!(allowed("https://any.example", false).unwrap(), "*");
        assert_eq!(allowed(DASH, false).unwrap(), "*");
        assert_eq!(allowed("https://any.example", true), None);
        assert_eq!(allowed(DASH, true).unwrap(), DASH, "listed by name");
        assert_eq!(allowed_origin(&cors, &headers(&[]), false), None);
    }

    #[test]
    fn configured_headers_credentials_exposure_and_private_network() {
        let mut cors = policy(false, &[DASH]);
        cors.allowed_headers = vec!["X-Api-Key".into(), "Content-Type".into()];
        cors.exposed_headers = vec!["Retry-After".into()];
        cors.allow_credentials = true;
        let asked = headers(&[
            ("origin", DASH),
            ("access-control-request-headers", "x-other"),
            ("access-control-request-private-network", "true"),
        ]);
        let resp = preflight(&asked, Some(&cors), false);
        let h = resp.headers();
        assert_eq!(
            get(h, "access-control-allow-headers"),
            Some("X-Api-Key, Content-Type")
        );
        assert_eq!(get(h, "access-control-allow-credentials"), Some("true"));
        assert_eq!(get(h, "access-control-expose-headers"), Some("Retry-After"));
        assert_eq!(
            get(h, "access-control-allow-private-network"),
            None,
            "not allowed"
        );
        cors.allow_private_network = true;
        let resp = preflight(&asked, Some(&cors), false);
        assert_eq!(
            get(resp.headers(), "access-control-allow-private-network"),
            Some("true")
        );
        let not_asked = headers(&[("origin", DASH)]);
        let resp = preflight(&not_asked, Some(&cors), false);
        assert_eq!(
            get(resp.headers(), "access-control-allow-private-network"),
            None
        );
    }

    #[test]
    fn requested_headers_are_echoed_sanitized_and_vary() {
        let cors = policy(false, &[DASH]);
        let asked = headers(&[
            ("origin", DASH),
            (
                "access-control-request-headers",
                "Content-Type, x-api-key, a:b",
            ),
        ]);
        let resp = preflight(&asked, Some(&cors), false);
        let h = resp.headers();
        assert_eq!(
            get(h, "access-control-allow-headers"),
            Some("Content-Type, x-api-key")
        );
        assert_eq!(
            get(h, "vary"),
            Some("Origin, Access-Control-Request-Headers")
        );
    }

    #[test]
    fn an_answer_carries_corrals_headers_only() {
        let mut cors = policy(false, &[DASH]);
        cors.exposed_headers = vec!["Retry-After".into()];
        let upstream = || {
            headers(&[
                ("access-control-allow-origin", "*"),
                ("access-control-allow-credentials", "true"),
                ("access-control-allow-methods", "POST"),
                ("vary", "Accept-Encoding"),
                ("content-type", "application/json"),
            ])
        };
        let mut out = upstream();
        finish(&cors, None, &mut out);
        assert_eq!(cors_names(&out), Vec::<&str>::new());
        assert_eq!(get(&out, "vary"), Some("Accept-Encoding, Origin"));
        assert_eq!(get(&out, "content-type"), Some("application/json"));
        let mut out = upstream();
        finish(&cors, Some(HeaderValue::from_static(DASH)), &mut out);
        let mut names = cors_names(&out);
        names.sort();
        assert_eq!(
            names,
            [
                "access-control-allow-origin",
                "access-control-expose-headers"
            ]
        );
        assert_eq!(get(&out, "access-control-allow-origin"), Some(DASH));
    }

    #[test]
    fn vary_is_added_once() {
        let mut out = headers(&[("vary", "origin")]);
        add_vary(&mut out, "Origin");
        assert_eq!(get(&out, "vary"), Some("origin"));
        let mut out = headers(&[("vary", "*")]);
        add_vary(&mut out, "Origin");
        assert_eq!(get(&out, "vary"), Some("*"));
    }
}
