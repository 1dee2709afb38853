//! A route table's matcher: each route names its methods and a path pattern of segments, so the
//! routes read as a list and their ids are cut out by segment in one place, not by string slicing
//! spread over handlers.
//!
//! A pattern is literal segments and captures: `{name}` takes exactly one segment (which may be
//! empty: `/api/inflight//cancel` names the empty id), `{name*}` takes the rest of the path, slashes
//! included, after at least the slash before it. Captures keep the text as sent; [`Params::get`]
//! percent-decodes it once.

use std::borrow::Cow;

use http::Method;

/// The methods a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Methods {
    /// GET, and HEAD with the same head.
    Read,
    Post,
    Put,
}

impl Methods {
    /// The methods as an `Allow` header lists them.
    pub fn names(self) -> &'static str {
        match self {
            Methods::Read => "GET, HEAD",
            Methods::Post => "POST",
            Methods::Put => "PUT",
        }
    }

    fn allow(self, method: &Method) -> bool {
        match self {
            Methods::Read => *method == Method::GET || *method == Method::HEAD,
            Methods::Post => *method == Method::POST,
            Methods::Put => *method == Method::PUT,
        }
    }
}

/// One row of a route table: what it answers, and what answers it.
#[derive(Debug, Clone, Copy)]
pub struct Route<H> {
    pub methods: Methods,
    pub pattern: &'static str,
    pub handler: H,
}

/// The captures of a matched pattern, by name.
#[derive(Debug, Default)]
pub struct Params<'p> {
    found: Vec<(&'static str, &'p str)>,
}

impl<'p> Params<'p> {
    /// A capture as it was sent, percent-encoding included.
    pub fn raw(&self, name: &str) -> &'p str {
        self.found
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v)
    }

    /// A capture percent-decoded once; bytes that are not UTF-8 become U+FFFD.
    pub fn get(&self, name: &str) -> Cow<'p, str> {
        percent_encoding::percent_decode_str(self.raw(name)).decode_utf8_lossy()
    }
}

/// The first route, in table order, whose methods and pattern accept the request.
pub fn find<'p, H: Copy>(
    table: &[Route<H>],
    method: &Method,
    path: &'p str,
) -> Option<(H, Params<'p>)> {
    table
        .iter()
        .filter(|r| r.methods.allow(method))
        .find_map(|r| matches(r.pattern, path).map(|params| (r.handler, params)))
}

/// The methods of every route whose pattern matches `path`, in table order, once each: what a
/// request for the path with another method is told to use (`405` with `Allow`).
pub fn methods_for<H>(table: &[Route<H>], path: &str) -> Vec<Methods> {
    let mut found: Vec<Methods> = Vec::new();
    for r in table.iter().filter(|r| matches(r.pattern, path).is_some()) {
        if !found.contains(&r.methods) {
            found.push(r.methods);
        }
    }
    found
}

/// The captures of `path` under `pattern`, if it matches.
fn matches<'p>(pattern: &'static str, path: &'p str) -> Option<Params<'p>> {
    let mut params = Params::default();
    let mut rest = path.strip_prefix('/')?;
    let mut wanted = pattern.strip_prefix('/')?.split('/').peekable();
    while let Some(want) = wanted.next() {
        let (segment, after) = match rest.split_once('/') {
            Some((segment, after)) => (segment, Some(after)),
            None => (rest, None),
        };
        if let Some(name) = want.strip_prefix('{').and_then(|w| w.strip_suffix("*}")) {
            params.found.push((name, rest));
            return Some(params);
        }
        if let Some(name) = want.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
            params.found.push((name, segment));
        } else if want != segment {
            return None;
        }
        match (after, wanted.peek()) {
            (Some(after), Some(_)) => rest = after,
            (None, None) => return Some(params),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[Route<u8>] = &[
        Route {
            methods: Methods::Read,
            pattern: "/logs/stream",
            handler: 1,
        },
        Route {
            methods: Methods::Read,
            pattern: "/logs/stream/{id*}",
            handler: 2,
        },
        Route {
            methods: Methods::Post,
            pattern: "/api/inflight/{id}/cancel",
            handler: 3,
        },
        Route {
            methods: Methods::Read,
            pattern: "/api/models/{id}",
            handler: 4,
        },
        Route {
            methods: Methods::Put,
            pattern: "/",
            handler: 5,
        },
    ];

    fn found(method: Method, path: &str) -> Option<(u8, String)> {
        find(TABLE, &method, path).map(|(h, p)| (h, p.raw("id").to_string()))
    }

    #[test]
    fn literal_routes_match_whole_paths_only() {
        assert_eq!(found(Method::GET, "/logs/stream"), Some((1, "".into())));
        assert_eq!(found(Method::HEAD, "/logs/stream"), Some((1, "".into())));
        assert_eq!(found(Method::POST, "/logs/stream"), None);
        assert_eq!(found(Method::GET, "/logs/streams"), None);
        assert_eq!(found(Method::GET, "/logs"), None);
        assert_eq!(found(Method::PUT, "/"), Some((5, "".into())));
        assert_eq!(found(Method::PUT, "//"), None);
        assert_eq!(found(Method::GET, ""), None);
    }

    #[test]
    fn the_rest_takes_slashes_and_may_be_empty() {
        assert_eq!(found(Method::GET, "/logs/stream/"), Some((2, "".into())));
        assert_eq!(
            found(Method::GET, "/logs/stream/a/b"),
            Some((2, "a/b".into()))
        );
        assert_eq!(
            found(Method::GET, "/logs/stream//a"),
            Some((2, "/a".into()))
        );
    }

    #[test]
    fn a_segment_takes_one_segment_even_an_empty_one() {
        let cancel = |p: &str| found(Method::POST, p);
        assert_eq!(cancel("/api/inflight/7/cancel"), Some((3, "7".into())));
        assert_eq!(cancel("/api/inflight//cancel"), Some((3, "".into())));
        assert_eq!(cancel("/api/inflight/7/cancel/"), None);
        assert_eq!(cancel("/api/inflight/7"), None);
        assert_eq!(cancel("/api/inflight/a/b/cancel"), None);
        assert_eq!(
            found(Method::GET, "/api/models/a%2Fb"),
            Some((4, "a%2Fb".into()))
        );
        assert_eq!(found(Method::GET, "/api/models/a/b"), None);
        assert_eq!(found(Method::GET, "/api/models/"), Some((4, "".into())));
    }

    #[test]
    fn captures_decode_once() {
        let (_, params) = find(TABLE, &Method::GET, "/api/models/a%252F%2F%ff").unwrap();
        assert_eq!(params.raw("id"), "a%252F%2F%ff");
        assert_eq!(params.get("id"), "a%2F/\u{fffd}");
        assert_eq!(params.get("missing"), "");
    }
}
