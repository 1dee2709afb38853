//! The dashboard at `/ui/`: its routes over plain HTTP, the `/api/state` it draws from, and the
//! pages themselves in headless Chromium (tests/python/ui_browser.py, through selenium).

mod support;

use std::time::Duration;

use support::process::spawn_corral;
use support::*;

const ADMIN: &str = "ui-admin-key-0123";
const INFERENCE: &str = "ui-inference-key-4567";

fn models() -> String {
    [
        fake_model(
            "m1",
            "--chunks 10 --chunk-interval-ms 100",
            "name: Chat model\nmemory: 2GiB",
        ),
        fake_model("m2", "--embedding-dim 16", "memory: 1GiB"),
        fake_model(
            "m3",
            "-c 8192 -np 2",
            "memory: 1GiB\ncapabilities: {tools: true}",
        ),
        fake_model("slow", "--loading-ms 4000", "memory: 1GiB"),
    ]
    .concat()
}

fn config() -> String {
    format!(
        "hostMemory: 16GiB\ndevices:\n  - {{name: gpu0, capacity: 8GiB}}\nmodels:\n{}",
        models()
    )
}

fn keyed_config() -> String {
    format!(
        "apiKeys: [{ADMIN}, {{key: {INFERENCE}, scope: inference, name: apps}}]\nmodels:\n{}",
        fake_model("hidden-model", "", "")
    )
}

/// `/` and `/ui` redirect to `/ui/`; a page path gets index.html, a known file its own type, and a
/// missing file 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_routes_redirect_fall_back_to_the_index_and_404_missing_files() {
    let h = Harness::start(&config()).await;
    let root = get(&format!("{}/", h.url)).await;
    assert_eq!((root.status, root.header("location")), (302, Some("/ui")));
    let ui = get(&format!("{}/ui", h.url)).await;
    assert_eq!((ui.status, ui.header("location")), (301, Some("/ui/")));
    let index = get(&format!("{}/ui/", h.url)).await;
    assert_eq!(index.status, 200);
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(index.text().contains("<main"), "{}", index.text());
    for page in [
        "models",
        "models/m1",
        "activity",
        "logs/proxy",
        "playground",
        "performance",
        "events",
        "nothing",
    ] {
        let resp = get(&format!("{}/ui/{page}", h.url)).await;
        assert_eq!(
            (resp.status, resp.text()),
            (200, index.text()),
            "/ui/{page}"
        );
    }
    for (file, media) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
    ] {
        let resp = get(&format!("{}/ui/{file}", h.url)).await;
        assert_eq!(
            (resp.status, resp.header("content-type")),
            (200, Some(media))
        );
        assert!(resp.header("content-security-policy").is_some());
    }
    for missing in ["missing.js", "models/logo.png", "app.js.map"] {
        assert_eq!(
            get(&format!("{}/ui/{missing}", h.url)).await.status,
            404,
            "{missing}"
        );
    }
    h.stop().await;
}

/// Every embedded file is served at its path, and none names another origin: an air-gapped
/// machine must be able to draw the whole page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_asset_is_served_and_references_no_outside_origin() {
    let h = Harness::start(&config()).await;
    for asset in corral::UI_ASSETS {
        for scheme in ["http://", "https://"] {
            assert!(
                !asset.body.contains(scheme),
                "{} names {scheme}",
                asset.path
            );
        }
        let resp = get(&format!("{}/ui/{}", h.url, asset.path)).await;
        assert_eq!(resp.status, 200, "{}", asset.path);
        assert_eq!(resp.header("content-type"), Some(asset.content_type));
    }
    let total: usize = corral::UI_ASSETS.iter().map(|a| a.body.len()).sum();
    assert!(total < 300 * 1024, "the page weighs {total} bytes");
    h.stop().await;
}

/// With keys set the files load without one (they hold no data) and the index tells the page to
/// ask for a key; the data the page draws stays behind the admin scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_the_assets_are_open_and_the_state_is_admin_only() {
    let h = Harness::start(&keyed_config()).await;
    let index = get(&format!("{}/ui/", h.url)).await;
    assert_eq!(index.status, 200);
    assert!(index.text().contains("data-keys=\"required\""));
    assert!(!index.text().contains("hidden-model"));
    assert_eq!(get(&format!("{}/ui/app.js", h.url)).await.status, 200);
    let state = format!("{}/api/state", h.url);
    assert_eq!(get(&state).await.status, 401);
    let bearer = |k: &str| format!("Bearer {k}");
    let inference = request("GET", &state, &[("authorization", &bearer(INFERENCE))], "").await;
    assert_eq!(inference.status, 403);
    let admin = request("GET", &state, &[("authorization", &bearer(ADMIN))], "").await;
    assert_eq!(admin.json()["models"][0]["id"], "hidden-model");
    h.stop().await;
}

/// `/api/state` joins what the models page draws: models, instances with slots, memory and the
/// load's elapsed time against its deadline, pools with their queue, and each device's ledger;
/// the command line has its secrets masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_state_reports_instances_pools_devices_and_load_progress() {
    let yaml = format!(
        "devices:\n  - {{name: gpu0, capacity: 8GiB, reserve: 1GiB}}\nmodels:\n{}{}",
        fake_model(
            "slow",
            "--loading-ms 1500 --api-key ${env.ENGINE_SECRET}",
            "memory: 2GiB\nloadTimeout: 60"
        ),
        fake_model(
            "chat",
            "-np 2 -c 8192",
            "memory: 1GiB\nreplicas: 2\ncapabilities: {in: [text, image]}"
        ),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/api/state", h.url);
    let load_url = format!("{}/api/models/load/slow", h.url);
    let load = tokio::spawn(async move { post(&load_url).await });
    let mut state = get(&url).await.json();
    let slow = |state: &serde_json::Value| {
        state["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == "slow")
            .cloned()
            .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while slow(&state)["loadElapsed"].is_null() {
        assert!(
            std::time::Instant::now() < deadline,
            "no load progress: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        state = get(&url).await.json();
    }
    let starting = slow(&state);
    assert_eq!(starting["state"], "starting");
    assert!(
        starting["loadElapsed"].as_f64().unwrap() < 10.0,
        "{starting}"
    );
    assert_eq!(starting["loadDeadline"], 60.0);
    let cmd = starting["cmd"].as_str().unwrap();
    assert!(
        cmd.contains("--api-key ***") && !cmd.contains(ENGINE_SECRET),
        "{cmd}"
    );
    assert_eq!(load.await.unwrap().status, 200);

    let state = get(&url).await.json();
    let ready = slow(&state);
    assert_eq!(
        (ready["state"].as_str(), ready["loadElapsed"].is_null()),
        (Some("ready"), true)
    );
    let gpu = &state["devices"][0];
    assert_eq!(
        (gpu["name"].as_str(), gpu["usable"].as_u64()),
        (Some("gpu0"), Some(7 << 30))
    );
    assert_eq!(gpu["charged"].as_u64(), Some(2 << 30));
    let pool = state["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "chat")
        .unwrap();
    assert_eq!(
        (
            pool["members"].as_array().unwrap().len(),
            pool["queue"].as_u64()
        ),
        (2, Some(0))
    );
    let model = state["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "chat")
        .unwrap();
    assert_eq!(model["instances"], serde_json::json!(["chat-0", "chat-1"]));
    assert_eq!(
        model["metadata"],
        serde_json::json!({"context": 4096, "capabilities": ["vision"]}),
        "the context per request and the capabilities the list tells"
    );
    h.stop().await;
}

// === in a real browser ===

fn skip(why: &str) -> Option<String> {
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("\n*** SKIPPED: {why} ***\n");
    None
}

/// Runs the browser script against `url` (`corral`: the process it may send a reload); a missing Chromium is a loud skip (a failure under CI).
async fn browser(python: &str, args: &[&str], corral: &std::process::Child) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/ui_browser.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .env("CORRAL_PID", corral.id().to_string())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser test finished in time")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() == Some(77) {
        skip(&format!(
            "no browser: {text} (apt-get install chromium chromium-driver)"
        ));
        return;
    }
    assert!(out.status.success(), "browser test failed:\n{text}");
    eprintln!("{text}");
}

/// Each page loads without console errors; Load and Unload change `/running`; a model loaded
/// through the API shows as ready without a reload; the playground streams the engine's tokens;
/// the logs page shows a line corral logged after it opened, and one logged after a reload ended
/// its stream. `CORRAL_UI_SCREENSHOTS=DIR` saves a
/// screenshot of each page there (docs/ holds the committed ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_browser() {
    let Some(python) = python() else { return };
    let state = tempfile::tempdir().unwrap();
    let proc = spawn_corral(&config(), state.path());
    let shots = std::env::var("CORRAL_UI_SCREENSHOTS").unwrap_or_default();
    let mut args = vec![proc.url.as_str(), "open"];
    if !shots.is_empty() {
        args.push(&shots);
    }
    browser(&python, &args, &proc.child).await;
}

/// With keys set, the page shows the key form and asks for no data until a key is given, refuses
/// a wrong one, and shows the models once the admin key is entered; the activity page then tells
/// each request's key by its name or fingerprint and filters by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_with_keys_shows_nothing_before_the_key() {
    let Some(python) = python() else { return };
    let state = tempfile::tempdir().unwrap();
    let proc = spawn_corral(&keyed_config(), state.path());
    let shots = std::env::var("CORRAL_UI_SCREENSHOTS").unwrap_or_default();
    let args = vec![proc.url.as_str(), "keys", ADMIN, &shots, INFERENCE];
    browser(&python, &args, &proc.child).await;
}
