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
    assert_eq!(scope_for("/v1/models/m"), Scope::Inference);
    assert_eq!(scope_for("/v1/models/peer/m"), Scope::Inference);
    for admin_route in [
        "/running",
        "/unload",
        "/logs",
        "/api/events",
        "/upstream",
        "/models/load",
        "/models/unload",
        "/models/sse",
    ] {
        assert_eq!(scope_for(admin_route), Scope::Admin, "{admin_route}");
    }
}

#[test]
fn the_routers_load_and_unload_change_state() {
    for path in ["/models/load", "/models/unload"] {
        assert!(changes_state(&Method::POST, path), "{path}");
    }
    assert!(!changes_state(&Method::GET, "/models/sse"));
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
