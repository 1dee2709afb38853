//! The dashboard at `/ui/`: hand-written HTML, CSS and ES modules embedded in the binary.
//!
//! No build step and no outside origin, so an air-gapped machine serves it as it is. The pages
//! are one document (`index.html`) that draws whichever page its path names, so every
//! extension-less path under `/ui/` answers with it, as llama-swap's UI does.
//!
//! The assets hold no data, so they are served without a key (like `/health`): the page can
//! then ask for one. Everything the page shows comes from routes that stay behind their keys.

use http::{header, Method, Response, StatusCode};

use crate::proxy::body::Body;

/// An embedded file: its path under `/ui/`, its media type, its bytes.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_str!(concat!("assets/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the dashboard is made of.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("markdown.js", JS),
    asset!("models.js", JS),
    asset!("activity.js", JS),
    asset!("performance.js", JS),
    asset!("logs.js", JS),
    asset!("playground.js", JS),
    asset!("events.js", JS),
];

/// Where `index.html` says whether the page must ask for a key before it fetches anything.
const KEYS_MARKER: &str = "data-keys=\"unknown\"";

/// Only what a page may load: itself. Inline scripts and every other origin are refused.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// True for the requests this module answers: GET or HEAD of `/ui` or anything under `/ui/`.
pub fn serves(method: &Method, path: &str) -> bool {
    matches!(*method, Method::GET | Method::HEAD) && (path == "/ui" || path.starts_with("/ui/"))
}

/// Answers a path `serves` accepted: `/ui` redirects to `/ui/`, a known file is served, another
/// path that names a file of a kind a page loads (`.js`, `.png`, ...) is 404, anything else is a
/// page and gets `index.html`: a model's id may hold a dot (`/ui/models/qwen2.5-7b`).
pub fn serve(path: &str, keys_required: bool) -> Response<Body> {
    let Some(rest) = path.strip_prefix("/ui/") else {
        return redirect("/ui/");
    };
    if let Some(asset) = ASSETS.iter().find(|a| a.path == rest) {
        return file(asset.content_type, asset.body);
    }
    if names_a_file(rest) {
        return not_found();
    }
    let keys = if keys_required { "required" } else { "none" };
    let index = ASSETS[0]
        .body
        .replacen(KEYS_MARKER, &format!("data-keys=\"{keys}\""), 1);
    file("text/html; charset=utf-8", index)
}

/// True when the path's last part ends as a file a page loads would: a script, a style sheet,
/// an image, a font, a source map.
fn names_a_file(path: &str) -> bool {
    const KINDS: &[&str] = &[
        "js", "mjs", "css", "map", "html", "json", "png", "svg", "ico", "jpg", "jpeg", "gif",
        "webp", "woff", "woff2", "ttf", "wasm", "txt",
    ];
    let last = path.rsplit('/').next().unwrap_or("");
    last.rsplit_once('.')
        .is_some_and(|(_, ext)| KINDS.iter().any(|k| ext.eq_ignore_ascii_case(k)))
}

fn file(content_type: &str, body: impl Into<bytes::Bytes>) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        // the files change only with the binary; revalidating costs little on a local link
        .header(header::CACHE_CONTROL, "no-cache")
        .header(header::CONTENT_SECURITY_POLICY, CSP)
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::REFERRER_POLICY, "no-referrer")
        .body(crate::proxy::body::full(body))
        .expect("valid response")
}

fn redirect(to: &'static str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, to)
        .body(crate::proxy::body::empty())
        .expect("valid response")
}

fn not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(crate::proxy::body::full("404 page not found\n"))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_carries_the_keys_marker_once() {
        assert_eq!(ASSETS[0].path, "index.html");
        assert_eq!(ASSETS[0].body.matches(KEYS_MARKER).count(), 1);
    }

    /// A model's page is a page whatever its id; only a file the dashboard does not have is 404.
    #[test]
    fn a_model_page_is_served_though_its_id_has_a_dot() {
        let page = |path| {
            let r = serve(path, false);
            let html = r.headers()[header::CONTENT_TYPE] == "text/html; charset=utf-8";
            (r.status(), html)
        };
        assert_eq!(page("/ui/models/qwen2.5-7b"), (StatusCode::OK, true));
        assert_eq!(page("/ui/logs/qwen2.5-7b"), (StatusCode::OK, true));
        assert_eq!(page("/ui/models"), (StatusCode::OK, true));
        assert_eq!(page("/ui/nothing.js").0, StatusCode::NOT_FOUND);
        assert_eq!(page("/ui/models/logo.png").0, StatusCode::NOT_FOUND);
        assert_eq!(page("/ui/app.js"), (StatusCode::OK, false));
    }
}
