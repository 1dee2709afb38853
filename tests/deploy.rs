//! The deployment files: every kustomize overlay renders and validates (Kubernetes schemas, the
//! custom resources' schemas, what corral's pods rely on, what keeps them safe as shipped), the
//! Dockerfile lints clean, each safety check refuses an overlay that undoes what it guards, the
//! configs the manifests ship load in `corral check` (and refuse to load without their keys), and
//! the workload that trains the image's profile-guided build is answered in full.

mod support;

use std::path::{Component, Path};
use std::process::Command;

use support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The variables the shipped configs take their API keys from (the Secret's values in a pod).
const KEY_VARIABLES: [(&str, &str); 2] = [
    ("CORRAL_ADMIN_KEY", "admin-0123456789abcdef"),
    ("CORRAL_INFERENCE_KEY", "apps-0123456789abcdef"),
];

/// The Python that runs the manifest checks, when it and kubectl are installed.
fn manifest_tools() -> Option<String> {
    let python = python()?;
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
        return None;
    }
    Some(python)
}

/// Runs scripts/check-manifests.py with `args`: whether it passed, and what it printed.
fn check_manifests(python: &str, args: &[&Path]) -> (bool, String) {
    let mut command = Command::new(python);
    command.arg(Path::new(ROOT).join("scripts/check-manifests.py"));
    for overlay in args {
        command.arg("--overlay").arg(overlay);
    }
    let out = command.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn overlays_render_and_validate() {
    let Some(python) = manifest_tools() else {
        return;
    };
    let (ok, text) = check_manifests(&python, &[]);
    assert!(ok, "{text}");
    assert!(text.contains("0 problem(s)"), "{text}");
}

/// `to` as a path relative to the folder `from` (kustomize refuses absolute paths).
fn relative(from: &Path, to: &Path) -> String {
    let ups = from
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let down = to.strip_prefix("/").unwrap();
    format!("{}{}", "../".repeat(ups), down.display())
}

/// Checks a kustomization in a fresh folder over the shipped overlay `overlay`: `body` is added to
/// it (patches, generators; `{deploy}` stands for the path of deploy/), `files` are written beside
/// it. Whether the check passed, and what it printed.
fn check_variant(
    python: &str,
    overlay: &str,
    body: &str,
    files: &[(&str, String)],
) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let deploy = relative(&dir_path, &Path::new(ROOT).join("deploy"));
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {deploy}/overlays/{overlay}\n{}",
        body.replace("{deploy}", &deploy)
    );
    std::fs::write(dir_path.join("kustomization.yaml"), kustomization).unwrap();
    for (name, text) in files {
        std::fs::write(dir_path.join(name), text).unwrap();
    }
    check_manifests(python, &[&dir_path])
}

/// A kustomization body that replaces the ConfigMap corral-config with config.yaml.
const REPLACE_CONFIG: &str = "configMapGenerator:
  - name: corral-config
    behavior: replace
    files: [config.yaml]
    options: {disableNameSuffixHash: true}
";

/// A kustomization body with one JSON patch of the resource `kind`/`name`.
fn json_patch(kind: &str, name: &str, operation: &str) -> String {
    format!(
        "patches:\n  - target: {{kind: {kind}, name: {name}}}\n    patch: |-\n      - {operation}\n"
    )
}

/// A file of the repository, as shipped.
fn shipped(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap()
}

/// An overlay that undoes one safety measure of a shipped one, and the problem the check must
/// report for it.
struct Unsafe {
    case: &'static str,
    overlay: &'static str,
    body: String,
    files: Vec<(&'static str, String)>,
    problem: &'static str,
}

impl Unsafe {
    fn new(case: &'static str, overlay: &'static str, body: impl Into<String>) -> Self {
        Unsafe {
            case,
            overlay,
            body: body.into(),
            files: Vec::new(),
            problem: "",
        }
    }

    /// The overlay with its corral-config replaced by `config`.
    fn config(case: &'static str, overlay: &'static str, config: String) -> Self {
        let mut variant = Unsafe::new(case, overlay, REPLACE_CONFIG);
        variant.files.push(("config.yaml", config));
        variant
    }

    fn refused_with(mut self, problem: &'static str) -> Self {
        self.problem = problem;
        self
    }
}

/// Each variant fails the manifest check, naming its problem.
fn assert_refused(variants: Vec<Unsafe>) {
    let Some(python) = manifest_tools() else {
        return;
    };
    for v in variants {
        assert!(!v.problem.is_empty(), "{}: name the problem", v.case);
        let (ok, text) = check_variant(&python, v.overlay, &v.body, &v.files);
        assert!(
            !ok && text.contains(v.problem),
            "{}: wanted {:?} in:\n{text}",
            v.case,
            v.problem
        );
    }
}

fn route_matches(value: &str) -> String {
    json_patch(
        "HTTPRoute",
        "corral",
        &format!("{{op: replace, path: /spec/rules/0/matches, value: {value}}}"),
    )
}

#[test]
fn the_route_check_refuses_a_route_beyond_the_model_routes() {
    assert_refused(vec![
        Unsafe::new("every path", "gateway", route_matches("[{path: {type: PathPrefix, value: /}}]"))
            .refused_with("HTTPRoute corral rule 0: PathPrefix / is not a model route"),
        Unsafe::new(
            "/upstream beside /v1",
            "gateway",
            route_matches("[{path: {type: PathPrefix, value: /v1}}, {path: {type: PathPrefix, value: /upstream}}]"),
        )
        .refused_with("HTTPRoute corral rule 0: PathPrefix /upstream is not a model route"),
        Unsafe::new("captures", "gateway", route_matches("[{path: {type: Exact, value: /api/captures}}]"))
            .refused_with("HTTPRoute corral rule 0: Exact /api/captures is not a model route"),
        Unsafe::new("a match without a path", "gateway", route_matches("[{method: GET}]"))
            .refused_with("a match without a path routes every path"),
    ]);
}

#[test]
fn the_network_check_refuses_pods_open_to_the_cluster() {
    let policy = |operation: &str| json_patch("NetworkPolicy", "corral", operation);
    assert_refused(vec![
        Unsafe::new(
            "no NetworkPolicy",
            "cpu",
            "patches:\n  - patch: |-\n      $patch: delete\n      apiVersion: networking.k8s.io/v1\n      kind: NetworkPolicy\n      metadata: {name: corral}\n",
        )
        .refused_with("no NetworkPolicy limits ingress to the corral pods"),
        Unsafe::new(
            "every namespace",
            "cpu",
            policy("{op: replace, path: /spec/ingress/0/from, value: [{namespaceSelector: {}}]}"),
        )
        .refused_with("NetworkPolicy corral ingress 0: namespaceSelector {} admits every pod of every namespace"),
        Unsafe::new("every port", "cpu", policy("{op: remove, path: /spec/ingress/0/ports}"))
            .refused_with("NetworkPolicy corral ingress 0: must admit port 8080 (http) alone, not every port"),
    ]);
}

/// A patch that sets the admin key's variable in the StatefulSet itself.
const KEY_IN_MANIFEST: &str = "patches:
  - patch: |-
      apiVersion: apps/v1
      kind: StatefulSet
      metadata: {name: corral}
      spec:
        template:
          spec:
            containers:
              - name: corral
                env:
                  - {name: CORRAL_ADMIN_KEY, value: sk-0123456789abcdef, valueFrom: null}
";

#[test]
fn the_key_check_refuses_keys_missing_or_kept_in_the_repository() {
    let config = shipped("deploy/base/config.yaml");
    let literal = config.replace("\"${env.CORRAL_INFERENCE_KEY}\"", "sk-0123456789abcdef");
    assert_refused(vec![
        Unsafe::config("no apiKeys", "cpu", "captureBuffer: 0\n".into())
            .refused_with("the config must set apiKeys"),
        Unsafe::config("a key in the config", "cpu", literal)
            .refused_with("apiKeys[1] must be ${env.NAME}, set from a Secret"),
        Unsafe::new("a key in the StatefulSet", "cpu", KEY_IN_MANIFEST)
            .refused_with("apiKeys[0]: the corral container must set CORRAL_ADMIN_KEY from a Secret"),
        Unsafe::new(
            "the Secret in the kustomization",
            "cpu",
            "secretGenerator:\n  - name: corral-api-keys\n    literals: [admin=change-me, inference=change-me-too]\n",
        )
        .refused_with("must be created in the cluster, not shipped in these files"),
    ]);
}

#[test]
fn the_capture_and_scrape_checks_refuse_prompts_kept_and_gauges_locked() {
    let base = shipped("deploy/base/config.yaml");
    let locked = shipped("deploy/overlays/gateway/config.yaml").replace("openMetrics: true\n", "");
    assert_refused(vec![
        Unsafe::config(
            "captures on",
            "cpu",
            base.replace("captureBuffer: 0", "captureBuffer: 5"),
        )
        .refused_with("the config must set captureBuffer: 0, not 5"),
        Unsafe::config(
            "captures at the default",
            "cpu",
            base.replace("captureBuffer: 0\n", ""),
        )
        .refused_with("the config must set captureBuffer: 0, not unset"),
        Unsafe::config("the picker without /metrics", "gateway", locked.clone())
            .refused_with("the config of pods in an InferencePool must set openMetrics: true"),
        Unsafe::config("Prometheus without /metrics", "gateway", locked)
            .refused_with("PodMonitor corral endpoint 0: /metrics needs a key here"),
    ]);
}

/// The monitoring component in an overlay that keeps /metrics behind a key: the PodMonitor sends
/// the Secret's value of a key of scope metrics.
const METRICS_KEY: &str = "components:
  - {deploy}/components/monitoring
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: StatefulSet
      metadata: {name: corral}
      spec:
        template:
          spec:
            containers:
              - name: corral
                env:
                  - name: CORRAL_METRICS_KEY
                    valueFrom: {secretKeyRef: {name: corral-api-keys, key: metrics}}
";

const SCRAPE_WITH_KEY: &str = "  - target: {kind: PodMonitor, name: corral}
    patch: |-
      - op: add
        path: /spec/podMetricsEndpoints/0/authorization
        value: {type: Bearer, credentials: {name: corral-api-keys, key: metrics}}
";

#[test]
fn prometheus_may_scrape_with_a_metrics_key_instead_of_open_metrics() {
    let Some(python) = manifest_tools() else {
        return;
    };
    let config = shipped("deploy/overlays/nvidia/config.yaml").replace(
        "apiKeys:\n",
        "apiKeys:\n  - {key: \"${env.CORRAL_METRICS_KEY}\", scope: metrics, name: prometheus}\n",
    );
    let files = [("config.yaml", config)];
    let with_key = format!("{METRICS_KEY}{SCRAPE_WITH_KEY}{REPLACE_CONFIG}");
    let (ok, text) = check_variant(&python, "nvidia", &with_key, &files);
    assert!(ok && text.contains("0 problem(s)"), "{text}");

    let without_key = format!("{METRICS_KEY}{REPLACE_CONFIG}");
    let (ok, text) = check_variant(&python, "nvidia", &without_key, &files);
    assert!(
        !ok && text.contains("PodMonitor corral endpoint 0: /metrics needs a key here"),
        "{text}"
    );
}

/// `corral check` of a shipped config, with the key variables set or not.
fn corral_check(config: &str, with_keys: bool) -> (bool, String) {
    let mut command = Command::new(CORRAL);
    command
        .args(["check", "--config"])
        .arg(Path::new(ROOT).join(config));
    for (name, value) in KEY_VARIABLES {
        if with_keys {
            command.env(name, value);
        } else {
            command.env_remove(name);
        }
    }
    let out = command.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && text.contains("config ok"), text)
}

#[test]
fn the_shipped_configs_load_with_their_keys_and_not_without() {
    for config in [
        "deploy/base/config.yaml",
        "deploy/overlays/nvidia/config.yaml",
        "deploy/overlays/gateway/config.yaml",
    ] {
        let (ok, text) = corral_check(config, true);
        assert!(ok, "{config}: {text}");
        // a pod without the Secret's values refuses to start rather than serve without keys
        let (ok, text) = corral_check(config, false);
        assert!(
            !ok && text.contains("environment variable 'CORRAL_ADMIN_KEY' is not set"),
            "{config}: {text}"
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
