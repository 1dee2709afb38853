//! The command line as a user meets it: `check`, config errors, llama-swap's flag spellings, and
//! every example config in `config/`.

mod support;

use std::process::Command;

use support::CORRAL;

fn corral(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(CORRAL)
        .args(args)
        .env("CORRAL_EXE", CORRAL)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file in config/ loads without error or warning.
#[test]
fn every_example_config_loads() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let (code, out, err) = corral(&["check", "--config", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{}: {err}", path.display());
        assert!(out.starts_with("config ok"), "{out}");
        assert!(!err.contains("warning"), "{}: {err}", path.display());
        seen += 1;
    }
    assert!(seen >= 2);
}

/// `corral check` prints the resolved plan: argv after expansion, port, proxy, group, timeouts.
#[test]
fn check_prints_the_resolved_plan() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/llama-server.yaml");
    let (code, out, _) = corral(&["check", "-config", path]);
    assert_eq!(code, 0);
    assert!(out.contains("model qwen-chat"), "{out}");
    assert!(out.contains("argv:        /usr/local/bin/llama-server --host 127.0.0.1 --port 10003 -ngl 99 --no-webui -m /srv/models/Qwen3-8B-Q4_K_M.gguf -c 32768 -np 4 --jinja"), "{out}");
    assert!(out.contains("proxy:       http://localhost:10003"), "{out}");
    assert!(
        out.contains("group:       everyday (swap: false, exclusive: true, persistent: false)"),
        "{out}"
    );
    assert!(
        out.contains("timeouts:    health 300s, unload 30s"),
        "{out}"
    );
}

/// `corral check` shows the global concurrency limit, the startup profile and a model without
/// keep-alives.
#[test]
fn check_shows_the_global_limit_startup_profile_and_keep_alives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "globalConcurrencyLimit: 3\nmodels:\n  a: {cmd: srv, proxy: 'http://h:1', disableKeepAlives: true}\n  b: {cmd: srv, proxy: 'http://h:1'}\nprofiles:\n  fast: {pins: {a: b}}\nhooks: {on_startup: {profile: fast}}\n",
    )
    .unwrap();
    let (code, out, err) = corral(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("global concurrency: 3 model request(s) at once"),
        "{out}"
    );
    assert!(out.contains("startup profile: fast"), "{out}");
    let keep_alive = "keep-alive:  off (a new upstream connection per request)";
    assert_eq!(out.matches(keep_alive).count(), 1, "{out}");
}

/// A model named by engine and source shows where its weights come from and the command built.
#[test]
fn check_shows_an_engine_models_source() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/config.yaml");
    // the shipped config takes its keys from the pod's Secret
    let out = Command::new(CORRAL)
        .args(["check", "--config", path])
        .env("CORRAL_ADMIN_KEY", "admin-key-for-the-check")
        .env("CORRAL_INFERENCE_KEY", "inference-key-for-the-check")
        .output()
        .unwrap();
    let (code, out) = (out.status.code(), String::from_utf8_lossy(&out.stdout));
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("engine:      llama_cpp from hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M (huggingface); its weights are fetched before the first start"),
        "{out}"
    );
    assert!(
        out.contains("--alias qwen -c 16384 -np 4 --metrics"),
        "{out}"
    );
}

/// A broken config exits 64 and names the file, line, column and key.
#[test]
fn broken_config_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(
        &path,
        "models:\n  m:\n    cmd: srv --port ${PORT}\n    ttl: [1]\n",
    )
    .unwrap();
    let (code, _, err) = corral(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 64);
    assert!(
        err.contains(&format!(
            "{}:4:10: models.m.ttl: must be an integer",
            path.display()
        )),
        "{err}"
    );

    std::fs::write(&path, "models:\n  m:\n    cmd: srv\n   bad-indent: 1\n").unwrap();
    let (code, _, err) = corral(&[
        "--config",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 64, "serve refuses to start");
    assert!(
        err.contains(&format!("{}:4:", path.display())) && err.contains("invalid YAML"),
        "{err}"
    );
}

/// Unknown keys are accepted, with a warning that names them.
#[test]
fn unknown_keys_warn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9', tll: 3}\n",
    )
    .unwrap();
    let (code, _, err) = corral(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(err.contains("unknown key models.m.tll"), "{err}");
}

/// --config-dir merges a directory's YAML files after --config, in name order.
#[test]
fn config_dir_merges_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        "models:\n  two: {cmd: srv, proxy: 'http://127.0.0.1:2'}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("a.yml"),
        "models:\n  one: {cmd: srv, proxy: 'http://127.0.0.1:1'}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
    let (code, out, err) = corral(&["check", "-config-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("2 model(s)") && out.contains("model one") && out.contains("model two"),
        "{out}"
    );
}

#[test]
fn version_and_bad_flags() {
    let (code, out, _) = corral(&["-version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("corral "));
    let (code, _, err) = corral(&["--frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown argument"));
}

/// `-validate` loads the config as `corral check` does and says what it found: exit 0 with a
/// summary, or exit 1 with the error check reports.
#[test]
fn validate_summarizes_a_good_config_and_fails_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9'}\n  n: {cmd: srv, proxy: 'http://127.0.0.1:8'}\n\
         peers:\n  far: {proxy: 'http://10.0.0.1:8080', models: [x]}\n",
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let (code, out, err) = corral(&["-validate", "-config", path]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "config is valid: 2 model(s), 1 peer(s)\n");

    std::fs::write(
        path,
        "models:\n  m:\n    cmd: srv --port ${PORT}\n    ttl: [1]\n",
    )
    .unwrap();
    let (code, out, err) = corral(&["--validate", "--config", path]);
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("models.m.ttl: must be an integer"), "{err}");
    let (check_code, _, check_err) = corral(&["check", "--config", path]);
    assert_eq!((check_code, check_err), (64, err), "check agrees");
}

/// The TLS flags come in pairs, and their files are checked before anything starts: a bad one
/// exits 64, as a bad config does, naming the flag and file.
#[test]
fn tls_flags_need_each_other_and_readable_files() {
    let (code, _, err) = corral(&["-tls-cert-file", "c.pem", "-listen", "127.0.0.1:0"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--tls-cert-file needs --tls-key-file too"),
        "{err}"
    );
    let (code, _, err) = corral(&["--tls-key-file", "k.pem"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--tls-key-file needs --tls-cert-file too"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&key, "not a key").unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let args = [
        "-tls-cert-file",
        cert,
        "-tls-key-file",
        key,
        "-listen",
        "127.0.0.1:0",
    ];
    let (code, _, err) = corral(&args);
    assert_eq!(code, 64);
    assert!(
        err.contains(&format!("--tls-cert-file {cert}: cannot read it")),
        "{err}"
    );
}
