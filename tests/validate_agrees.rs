//! `corral -validate` (llama-swap's flag) and `corral check` give the same verdict on every config
//! the project ships (`config/`, the deployment's, the fuzzer's seeds) and on the kinds of config
//! the tests write: both accept, with the same model count, or both reject, with the same error.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::CORRAL;

/// The keys the deployment's configs read from the environment.
const DEPLOY_KEYS: [(&str, &str); 2] = [
    ("CORRAL_ADMIN_KEY", "sk-admin-0123456789abcdef"),
    ("CORRAL_INFERENCE_KEY", "sk-apps-0123456789abcdef"),
];

struct Run {
    code: i32,
    out: String,
    err: String,
}

fn corral(args: &[&str], keys: bool) -> Run {
    let mut cmd = Command::new(CORRAL);
    cmd.args(args).env("CORRAL_EXE", CORRAL);
    for (k, v) in DEPLOY_KEYS {
        match keys {
            true => cmd.env(k, v),
            false => cmd.env_remove(k),
        };
    }
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The number before ` model(s)` in a line.
fn models_in(text: &str) -> Option<&str> {
    let before = text.split(" model(s)").next()?;
    before.rsplit(' ').next()
}

/// Runs both on one source (`-config FILE` or `-config-dir DIR`) and says whether they agree;
/// returns whether the config was accepted.
fn agree(flag: &str, path: &Path, keys: bool) -> bool {
    let path = path.to_str().unwrap();
    let check = corral(&["check", flag, path], keys);
    let validate = corral(&["-validate", flag, path], keys);
    let what = format!("{flag} {path} (keys set: {keys})");
    if check.code == 0 {
        assert_eq!(
            validate.code, 0,
            "{what}: check accepts, -validate says {}",
            validate.err
        );
        assert!(
            validate.out.starts_with("config is valid: "),
            "{what}: {}",
            validate.out
        );
        assert_eq!(models_in(&validate.out), models_in(&check.out), "{what}");
        assert_eq!(validate.err, check.err, "{what}: the same warnings");
    } else {
        assert_eq!(check.code, 64, "{what}: {}", check.err);
        assert_eq!(
            validate.code, 1,
            "{what}: check rejects, -validate says {}",
            validate.out
        );
        assert_eq!(validate.err, check.err, "{what}: the same error");
        assert!(validate.out.is_empty(), "{what}: {}", validate.out);
    }
    check.code == 0
}

/// The YAML files under `dir`, at any depth, whose name passes `keep`.
fn yaml_files(dir: &Path, keep: &dyn Fn(&Path) -> bool, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, keep, into);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") && keep(&path) {
            into.push(path);
        }
    }
}

/// Every config the project ships: `config/`, the fuzzer's config seeds, and the deployment's
/// `config.yaml` files (the rest of `deploy/` is Kubernetes objects).
fn shipped() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    yaml_files(&root.join("config"), &|_| true, &mut files);
    yaml_files(&root.join("fuzz/seeds/config_load"), &|_| true, &mut files);
    let config_yaml = |p: &Path| p.file_name().is_some_and(|n| n == "config.yaml");
    yaml_files(&root.join("deploy"), &config_yaml, &mut files);
    files
}

/// Configs of the kinds the tests write: good ones, and each way of being wrong they check.
fn fixtures() -> Vec<(&'static str, String)> {
    let nest = format!(
        "models:\n  m:\n    metadata:\n      {}x\n",
        "- ".repeat(500)
    );
    let mut bomb = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for pair in ["a", "b", "c", "d", "e", "f", "g", "h", "i"].windows(2) {
        let refs = vec![format!("*{}", pair[0]); 9].join(", ");
        bomb.push_str(&format!("{}: &{} [{refs}]\n", pair[1], pair[1]));
    }
    let s = |t: &str| t.to_string();
    vec![
        ("peers", s("models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9'}\npeers:\n  far: {proxy: 'http://10.0.0.1:8080', models: [x]}\n")),
        ("groups and profiles", s("models:\n  a: {cmd: 'srv --port ${PORT}'}\n  b: {cmd: 'srv --port ${PORT}'}\ngroups:\n  g: {swap: false, members: [a, b]}\nprofiles:\n  p: {pins: {chat: a}}\nhooks:\n  on_startup: {profile: p}\n")),
        ("unknown key", s("models:\n  m:\n    cmd: srv --port ${PORT}\n    frobnicate: 1\n")),
        ("no models", s("healthCheckTimeout: 30\n")),
        ("bad indent", s("models:\n  m:\n    cmd: srv\n   bad-indent: 1\n")),
        ("ttl not a number", s("models:\n  m:\n    cmd: srv --port ${PORT}\n    ttl: [1]\n")),
        ("unknown profile", s("models:\n  a: {cmd: 'srv --port ${PORT}'}\nhooks:\n  on_startup: {profile: nope}\n")),
        ("unknown group member", s("models:\n  a: {cmd: 'srv --port ${PORT}'}\ngroups:\n  g: {members: [a, b]}\n")),
        ("unset variable", s("models:\n  a: {cmd: 'srv --port ${PORT} ${env.CORRAL_NOT_SET_ANYWHERE}'}\n")),
        ("not yaml", s("models: [\n")),
        ("deep nesting", nest),
        ("alias bomb", bomb),
    ]
}

#[test]
fn validate_and_check_agree_on_every_shipped_config() {
    let files = shipped();
    assert!(files.len() >= 8, "{files:?}");
    let mut accepted = 0;
    for file in &files {
        accepted += usize::from(agree("-config", file, true));
        agree("-config", file, false);
    }
    assert!(
        accepted >= files.len() - 1,
        "the shipped configs load: {accepted} of {files:?}"
    );
}

#[test]
fn validate_and_check_agree_on_the_tests_kinds_of_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut verdicts = Vec::new();
    for (name, yaml) in fixtures() {
        let path = dir.path().join(format!("{}.yaml", name.replace(' ', "-")));
        std::fs::write(&path, yaml).unwrap();
        verdicts.push((name, agree("-config", &path, false)));
    }
    let accepted: Vec<&str> = verdicts.iter().filter(|v| v.1).map(|v| v.0).collect();
    assert_eq!(
        accepted,
        ["peers", "groups and profiles", "unknown key", "no models"],
        "{verdicts:?}"
    );
    // a directory of files, merged in name order, is one config to both
    let merged = tempfile::tempdir().unwrap();
    std::fs::write(
        merged.path().join("a.yaml"),
        "models:\n  one: {cmd: srv, proxy: 'http://127.0.0.1:1'}\n",
    )
    .unwrap();
    std::fs::write(
        merged.path().join("b.yml"),
        "models:\n  two: {cmd: srv, proxy: 'http://127.0.0.1:2'}\n",
    )
    .unwrap();
    assert!(agree("-config-dir", merged.path(), false));
    std::fs::write(merged.path().join("c.yaml"), "models:\n  one: {ttl: [1]}\n").unwrap();
    assert!(!agree("-config-dir", merged.path(), false));
}
