//! The deployment files: every kustomize overlay renders and validates (Kubernetes schemas, the
//! custom resources' schemas, what corral's pods rely on), the Dockerfile lints clean, the
//! configs the manifests ship load in `corral check`, and the workload that trains the image's
//! profile-guided build is answered in full.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn overlays_render_and_validate() {
    let Some(python) = python() else { return };
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is not installed (Debian package kubectl)"
        );
        eprintln!("\n*** SKIPPED: kubectl is not installed ***\n");
        return;
    }
    let out = Command::new(python)
        .arg(Path::new(ROOT).join("scripts/check-manifests.py"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 problem(s)"), "{text}");
}

#[test]
fn the_shipped_configs_load() {
    for config in [
        "deploy/base/config.yaml",
        "deploy/overlays/nvidia/config.yaml",
        "deploy/overlays/gateway/config.yaml",
    ] {
        let out = Command::new(CORRAL)
            .args(["check", "--config"])
            .arg(Path::new(ROOT).join(config))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("config ok"),
            "{config}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A binary the workspace builds beside corral's (`cargo test --workspace` builds them all).
fn sibling(name: &str) -> std::path::PathBuf {
    let path = Path::new(CORRAL).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo build --workspace)",
        path.display()
    );
    path
}

/// Runs the workload the image's profile-guided build trains on (`scripts/pgo-workload.sh`).
fn pgo_workload(engine: &Path) -> (bool, String) {
    let out = Command::new(Path::new(ROOT).join("scripts/pgo-workload.sh"))
        .arg(CORRAL)
        .arg(engine)
        .arg(sibling("corral-load"))
        .env("REQUESTS", "200")
        .env(
            "CORRAL_TEST_RUN",
            new_marker().trim_start_matches("CORRAL_TEST_RUN="),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), text)
}

#[test]
fn the_profile_guided_build_trains_on_answered_requests_only() {
    let (ok, log) = pgo_workload(&sibling("fakellm"));
    assert!(ok, "{log}");
    for phase in [
        "chat, concurrency 64: 200",
        "long conversations: 21",
        "embeddings: 21",
        "SSE streams: 400",
        "GET /metrics: 3",
    ] {
        assert!(log.contains(phase), "{phase} is missing from:\n{log}");
    }

    // an engine that never starts: the workload stops at its first phase instead of training on
    // error answers
    let (ok, log) = pgo_workload(Path::new("/bin/false"));
    assert!(!ok, "{log}");
    assert!(
        log.contains("chat, concurrency 8: 0 of 200 answered"),
        "{log}"
    );
}
