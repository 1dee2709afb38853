//! `security.cors`: which browser origins may read corral's answers, and what a preflight tells
//! them (llama-swap's keys, defaults and validation).

use std::collections::BTreeSet;

use crate::config::read::MapReader;
use crate::config::yaml::{Node, Value};
use crate::config::ConfigError;

/// The keys `security.cors` understands.
const CORS_KEYS: &[&str] = &[
    "allowedOrigins",
    "allowCredentials",
    "allowPrivateNetwork",
    "allowedMethods",
    "allowedHeaders",
    "exposedHeaders",
    "maxAge",
];

/// What a preflight caches for when `maxAge` is left out or 0: a day, as llama-swap.
const DEFAULT_MAX_AGE: u64 = 86400;

/// The methods a preflight allows when `allowedMethods` is left out, as llama-swap.
const DEFAULT_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// A configured `security.cors`. Without one corral answers browsers as llama-swap v250 did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsConfig {
    /// `"*"` is listed: any origin (on the routes a browser may reach from any site).
    pub any_origin: bool,
    /// The listed origins, each as a browser spells it in `Origin` (lowercase, no default port).
    pub origins: BTreeSet<String>,
    pub allow_credentials: bool,
    /// Answer Chrome's Private Network Access preflight.
    pub allow_private_network: bool,
    pub allowed_methods: Vec<String>,
    /// Empty: a preflight echoes the headers it asks for.
    pub allowed_headers: Vec<String>,
    pub exposed_headers: Vec<String>,
    /// Seconds a browser may cache a preflight's answer.
    pub max_age: u64,
}

impl CorsConfig {
    /// Whether `origin` (as a browser sent it) is listed by name; `*` aside.
    pub fn lists(&self, origin: &str) -> bool {
        self.origins.contains(&origin.to_ascii_lowercase())
    }
}

/// `security`: only `cors` so far. `None` when `security.cors` sets no key.
pub(super) fn decode_security(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<CorsConfig>, ConfigError> {
    let security = top.child("security", &["cors"], warnings)?;
    let cors = security.child("cors", CORS_KEYS, warnings)?;
    if CORS_KEYS.iter().all(|k| cors.get(k).is_none()) {
        return Ok(None);
    }
    let (any_origin, origins) = allowed_origins(&cors)?;
    let allow_credentials = cors.boolean("allowCredentials")?.unwrap_or(false);
    let allow_private_network = cors.boolean("allowPrivateNetwork")?.unwrap_or(false);
    if any_origin {
        refuse_star_with(&cors, "allowCredentials", allow_credentials)?;
        refuse_star_with(&cors, "allowPrivateNetwork", allow_private_network)?;
    }
    Ok(Some(CorsConfig {
        any_origin,
        origins,
        allow_credentials,
        allow_private_network,
        allowed_methods: allowed_methods(&cors)?,
        allowed_headers: tokens(&cors, "allowedHeaders", "header name")?,
        exposed_headers: tokens(&cors, "exposedHeaders", "header name")?,
        max_age: max_age(&cors)?,
    }))
}

/// `allowedMethods`, llama-swap's list when left out.
fn allowed_methods(cors: &MapReader<'_>) -> Result<Vec<String>, ConfigError> {
    let methods = tokens(cors, "allowedMethods", "method")?;
    if methods.is_empty() {
        return Ok(DEFAULT_METHODS.iter().map(|m| m.to_string()).collect());
    }
    Ok(methods)
}

/// `allowedOrigins`: required once any other key is set (llama-swap's schema), never empty, each
/// entry `*` or a bare origin. Whether `*` is listed, and the origins normalized.
fn allowed_origins(cors: &MapReader<'_>) -> Result<(bool, BTreeSet<String>), ConfigError> {
    let entries = entries(cors, "allowedOrigins")?.ok_or_else(|| {
        cors.err(
            "allowedOrigins",
            "is required once any other security.cors key is set: list the origins, or \"*\" for any",
        )
    })?;
    if entries.is_empty() {
        return Err(cors.err(
            "allowedOrigins",
            "must list at least one origin, or \"*\" for any",
        ));
    }
    let mut any = false;
    let mut origins = BTreeSet::new();
    for (i, (text, node)) in entries.iter().enumerate() {
        if text == "*" {
            any = true;
            continue;
        }
        let at = |msg| entry_err(cors, "allowedOrigins", i, node, msg);
        origins.insert(bare_origin(text).map_err(at)?);
    }
    Ok((any, origins))
}

/// `*` may not go with a setting that must name who it trusts.
fn refuse_star_with(cors: &MapReader<'_>, key: &str, set: bool) -> Result<(), ConfigError> {
    if !set {
        return Ok(());
    }
    Err(cors.err(
        "allowedOrigins",
        format!("may not contain \"*\" when {key} is true; list the origins explicitly"),
    ))
}

/// A bare `scheme://host[:port]`, the only form a browser sends in `Origin`, as the browser spells
/// it: host lowercased, a scheme's default port dropped. An entry with a path or a trailing slash
/// would silently never match, so it is refused (llama-swap's messages).
fn bare_origin(origin: &str) -> Result<String, String> {
    if origin.is_empty() {
        return Err("entry must not be empty".into());
    }
    if origin != origin.trim() {
        return Err(format!(
            "{origin:?} must not have leading or trailing whitespace"
        ));
    }
    let url = parse_origin(origin)?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| not_origin(origin))?;
    if host.contains('*') {
        return Err(format!(
            "{origin:?} must name one origin: list each one, or \"*\" for any"
        ));
    }
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    Ok(format!("{}://{host}{port}", url.scheme()).to_ascii_lowercase())
}

/// `origin` parsed as a URL, once it is known to hold a scheme and an authority only.
fn parse_origin(origin: &str) -> Result<url::Url, String> {
    let (_, rest) = origin.split_once("://").ok_or_else(|| not_origin(origin))?;
    if rest.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "{origin:?} must not include a path, query, fragment or userinfo"
        ));
    }
    url::Url::parse(origin).map_err(|e| format!("{origin:?} is not a valid origin: {e}"))
}

fn not_origin(origin: &str) -> String {
    format!("{origin:?} must be a scheme://host[:port] origin, e.g. https://dashboard.example.com")
}

/// `allowedMethods`, `allowedHeaders`, `exposedHeaders`: RFC 9110 tokens.
fn tokens(cors: &MapReader<'_>, key: &str, what: &str) -> Result<Vec<String>, ConfigError> {
    let entries = entries(cors, key)?.unwrap_or_default();
    for (i, (text, node)) in entries.iter().enumerate() {
        if !is_token(text) {
            let msg = format!("{text:?} is not a valid HTTP {what}");
            return Err(entry_err(cors, key, i, node, msg));
        }
    }
    Ok(entries.into_iter().map(|(text, _)| text).collect())
}

/// An RFC 9110 token: what method and header names are made of.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `maxAge`: seconds, 0 meaning a day.
fn max_age(cors: &MapReader<'_>) -> Result<u64, ConfigError> {
    match cors.int("maxAge")? {
        None | Some(0) => Ok(DEFAULT_MAX_AGE),
        Some(secs) => u64::try_from(secs).map_err(|_| cors.err("maxAge", "must be >= 0")),
    }
}

/// A list of strings with each entry's node (for its location); `None` when the key is absent.
fn entries<'n>(
    r: &MapReader<'n>,
    key: &str,
) -> Result<Option<Vec<(String, &'n Node)>>, ConfigError> {
    let items = match r.get(key).map(|n| &n.value) {
        None => return Ok(None),
        Some(Value::Seq(items)) => items,
        Some(_) => return Err(r.err(key, "must be a list of strings")),
    };
    items
        .iter()
        .map(|n| match &n.value {
            Value::Seq(_) | Value::Map(_) | Value::Null => None,
            _ => n.scalar_text().map(|text| (text, n)),
        })
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| r.err(key, "must be a list of strings"))
}

/// An error naming one entry of a list: `security.cors.allowedOrigins[1]: ...`.
fn entry_err(r: &MapReader<'_>, key: &str, i: usize, node: &Node, msg: String) -> ConfigError {
    ConfigError::at(node.loc.clone(), Some(format!("{}[{i}]", r.key(key))), msg)
}

#[cfg(test)]
mod tests {
    use crate::config::{load_str, ConfigError, CorsConfig};

    fn cors(yaml: &str) -> Option<CorsConfig> {
        load_str("cors.yaml", yaml, &|_| None)
            .unwrap_or_else(|e| panic!("{e}"))
            .config
            .cors
    }

    fn refused(yaml: &str) -> ConfigError {
        match load_str("cors.yaml", yaml, &|_| None) {
            Ok(_) => panic!("should be refused: {yaml}"),
            Err(e) => e,
        }
    }

    fn in_cors(body: &str) -> String {
        format!("security:\n  cors:\n{body}")
    }

    #[test]
    fn no_cors_or_an_empty_one_keeps_llama_swap_v250s_answers() {
        assert_eq!(cors(""), None);
        assert_eq!(cors("security: {}\n"), None);
        assert_eq!(cors("security: {cors: {}}\n"), None);
    }

    #[test]
    fn listed_origins_take_llama_swaps_defaults_for_the_rest() {
        let c = cors(&in_cors(
            "    allowedOrigins: ['https://Dash.Example:443', 'http://localhost:3000', 'app://x']\n",
        ))
        .unwrap();
        assert!(!c.any_origin);
        let origins: Vec<_> = c.origins.iter().map(String::as_str).collect();
        assert_eq!(
            origins,
            ["app://x", "http://localhost:3000", "https://dash.example"]
        );
        assert!(c.lists("HTTPS://dash.example"));
        assert!(!c.lists("https://dash.example:8443"));
        assert_eq!(
            c.allowed_methods,
            ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
        );
        assert!(c.allowed_headers.is_empty() && c.exposed_headers.is_empty());
        assert_eq!(c.max_age, 86400);
        assert!(!c.allow_credentials && !c.allow_private_network);
    }

    #[test]
    fn each_key_is_read() {
        let c = cors(&in_cors(
            "    allowedOrigins: ['*', 'https://dash.example']\n    allowedMethods: [GET, POST]\n    allowedHeaders: [X-Api-Key]\n    exposedHeaders: [X-Request-Id, Retry-After]\n    maxAge: 60\n",
        ))
        .unwrap();
        assert!(c.any_origin);
        assert!(c.lists("https://dash.example"));
        assert_eq!(c.allowed_methods, ["GET", "POST"]);
        assert_eq!(c.allowed_headers, ["X-Api-Key"]);
        assert_eq!(c.exposed_headers, ["X-Request-Id", "Retry-After"]);
        assert_eq!(c.max_age, 60);
        let c = cors(&in_cors(
            "    allowedOrigins: ['https://dash.example']\n    allowCredentials: true\n    allowPrivateNetwork: true\n    maxAge: 0\n",
        ))
        .unwrap();
        assert!(c.allow_credentials && c.allow_private_network);
        assert_eq!(c.max_age, 86400, "0 means a day");
    }

    #[test]
    fn origins_are_required_and_never_empty() {
        let e = refused(&in_cors("    maxAge: 10\n"));
        assert_eq!(e.key.as_deref(), Some("security.cors.allowedOrigins"));
        assert!(e.msg.starts_with("is required once any other"), "{e}");
        let e = refused(&in_cors("    allowedOrigins: []\n"));
        assert_eq!(e.key.as_deref(), Some("security.cors.allowedOrigins"));
        assert_eq!(e.msg, "must list at least one origin, or \"*\" for any");
        let e = refused(&in_cors("    allowedOrigins: https://dash.example\n"));
        assert_eq!(e.msg, "must be a list of strings", "{e}");
    }

    #[test]
    fn each_bad_origin_is_named_with_llama_swaps_message() {
        for (origin, msg) in [
            ("", "entry must not be empty"),
            (
                " https://a.example",
                "\" https://a.example\" must not have leading or trailing whitespace",
            ),
            (
                "https://a.example/",
                "\"https://a.example/\" must not include a path, query, fragment or userinfo",
            ),
            (
                "https://a.example?x=1",
                "\"https://a.example?x=1\" must not include a path, query, fragment or userinfo",
            ),
            (
                "https://a.example#top",
                "\"https://a.example#top\" must not include a path, query, fragment or userinfo",
            ),
            (
                "https://me@a.example",
                "\"https://me@a.example\" must not include a path, query, fragment or userinfo",
            ),
            (
                "localhost:3000",
                "\"localhost:3000\" must be a scheme://host[:port] origin, e.g. https://dashboard.example.com",
            ),
            (
                "null",
                "\"null\" must be a scheme://host[:port] origin, e.g. https://dashboard.example.com",
            ),
            (
                "https://*.example.com",
                "\"https://*.example.com\" must name one origin: list each one, or \"*\" for any",
            ),
        ] {
            let e = refused(&in_cors(&format!(
                "    allowedOrigins: ['https://ok.example', '{origin}']\n"
            )));
            assert_eq!(
                e.key.as_deref(),
                Some("security.cors.allowedOrigins[1]"),
                "{origin:?}"
            );
            assert_eq!(e.msg, msg, "{origin:?}");
        }
        let e = refused(&in_cors(
            "    allowedOrigins: ['https://a.example:99999']\n",
        ));
        assert!(e.msg.contains("is not a valid origin"), "{e}");
    }

    #[test]
    fn a_star_may_not_go_with_credentials_or_private_network() {
        for key in ["allowCredentials", "allowPrivateNetwork"] {
            let e = refused(&in_cors(&format!(
                "    allowedOrigins: ['https://a.example', '*']\n    {key}: true\n"
            )));
            assert_eq!(e.key.as_deref(), Some("security.cors.allowedOrigins"));
            assert_eq!(
                e.msg,
                format!("may not contain \"*\" when {key} is true; list the origins explicitly")
            );
        }
    }

    #[test]
    fn methods_and_headers_must_be_tokens() {
        for (key, what) in [
            ("allowedMethods", "method"),
            ("allowedHeaders", "header name"),
            ("exposedHeaders", "header name"),
        ] {
            let e = refused(&in_cors(&format!(
                "    allowedOrigins: ['*']\n    {key}: [Good, 'Not:Good']\n"
            )));
            assert_eq!(e.key, Some(format!("security.cors.{key}[1]")), "{key}: {e}");
            assert_eq!(e.msg, format!("\"Not:Good\" is not a valid HTTP {what}"));
        }
    }

    #[test]
    fn max_age_may_not_be_negative() {
        let e = refused(&in_cors("    allowedOrigins: ['*']\n    maxAge: -1\n"));
        assert_eq!(e.key.as_deref(), Some("security.cors.maxAge"));
        assert_eq!(e.msg, "must be >= 0");
    }

    #[test]
    fn unknown_keys_are_warned_about() {
        let loaded = load_str(
            "cors.yaml",
            &in_cors("    allowedOrigins: ['*']\n    allowOrigins: [x]\n"),
            &|_| None,
        )
        .unwrap();
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.contains("security.cors.allowOrigins")),
            "{:?}",
            loaded.warnings
        );
    }
}
