//! The deployment files: every kustomize overlay renders and validates (Kubernetes schemas, the
//! custom resources' schemas, what corral's pods rely on), the Dockerfile lints clean, and the
//! configs the manifests ship load in `corral check`.

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
