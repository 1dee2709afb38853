//! Models named by engine and source: the command built, the port given, and each bad input.

use crate::config::{load_str, Config};

fn load(yaml: &str) -> (Config, Vec<String>) {
    let loaded = load_str("t.yaml", yaml, &|_| None).unwrap();
    (loaded.config, loaded.warnings)
}

fn load_err(yaml: &str) -> String {
    load_str("t.yaml", yaml, &|_| None).unwrap_err().to_string()
}

#[test]
fn a_llama_cpp_model_from_a_path_gets_its_command_port_and_health_check() {
    let (c, warnings) = load(
        "startPort: 9100\nengines:\n  llama_cpp: {command: /opt/llama/llama-server, env: {LLAMA_ARG_FLASH_ATTN: 'on'}}\nmodels:\n  qwen:\n    engine: llama_cpp\n    source: /models/q.gguf\n    ctx: 4096\n    slots: 2\n    args: [--jinja]\n",
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    let m = &c.models["qwen"];
    assert_eq!(
        m.argv,
        [
            "/opt/llama/llama-server",
            "-m",
            "/models/q.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "9100",
            "--alias",
            "qwen",
            "-c",
            "8192",
            "-np",
            "2",
            "--metrics",
            "--jinja"
        ]
    );
    assert_eq!(m.proxy, "http://localhost:9100");
    assert_eq!(m.check_endpoint.as_deref(), Some("/health"));
    assert_eq!(m.instances[0].slots, Some(2));
    assert_eq!(
        m.instances[0].env,
        [("LLAMA_ARG_FLASH_ATTN".to_string(), "on".to_string())]
    );
}

#[test]
fn replicas_of_an_engine_model_each_get_a_port_and_an_address_of_their_own() {
    let (c, _) = load(
        "startPort: 9200\nmodels:\n  emb:\n    engine: ollama\n    source: ollama://nomic-embed-text\n    replicas: 2\n",
    );
    let m = &c.models["emb"];
    let addresses: Vec<_> = m
        .instances
        .iter()
        .map(|i| {
            let host = i.env.iter().find(|(k, _)| k == "OLLAMA_HOST");
            (i.proxy.clone(), host.map(|(_, v)| v.clone()))
        })
        .collect();
    assert_eq!(
        addresses,
        [
            (
                "http://localhost:9200".into(),
                Some("127.0.0.1:9200".into())
            ),
            (
                "http://localhost:9201".into(),
                Some("127.0.0.1:9201".into())
            )
        ]
    );
    assert_eq!(m.instances[0].argv, ["ollama", "serve"]);
    assert_eq!(m.check_endpoint.as_deref(), Some("/api/version"));
}

#[test]
fn a_remote_source_is_named_as_written_until_fetched_and_vllm_gets_its_flags() {
    let (c, _) = load(
        "models:\n  big:\n    engine: vllm\n    source: hf://org/model\n    quantization: awq\n    params: 70B\n    ctx: 8192\n",
    );
    let m = &c.models["big"];
    assert_eq!(&m.argv[..3], ["vllm", "serve", "hf://org/model"]);
    assert!(
        m.argv.windows(2).any(|w| w == ["--max-model-len", "8192"]),
        "{:?}",
        m.argv
    );
    assert!(m.engine.as_ref().unwrap().needs_fetch());
    assert_eq!(m.memory.params, Some(70_000_000_000));
    assert_eq!(m.memory.quant.as_deref(), Some("awq"));
}

#[test]
fn cmd_wins_over_engine_keys_with_a_warning() {
    let (c, warnings) = load(
        "models:\n  m:\n    cmd: srv --port ${PORT}\n    engine: llama_cpp\n    source: /m.gguf\n",
    );
    assert_eq!(c.models["m"].argv[0], "srv");
    assert!(c.models["m"].engine.is_none());
    assert!(
        warnings.iter().any(|w| w.contains("cmd is given")),
        "{warnings:?}"
    );
}

#[test]
fn bad_engine_input_names_the_model_and_the_fix() {
    for (yaml, wanted) in [
        (
            "models:\n  m: {engine: llamafile, source: /m.gguf}\n",
            "unknown engine \"llamafile\": use one of llama_cpp, vllm",
        ),
        (
            "models:\n  m: {source: hf://org/repo}\n",
            "model m has a source but no engine",
        ),
        (
            "models:\n  m: {engine: vllm}\n",
            "model m names an engine but no source",
        ),
        (
            "models:\n  m: {engine: llama_cpp, source: 'ftp://host/m.gguf'}\n",
            "ftp",
        ),
        (
            "models:\n  m: {engine: custom, source: /m.gguf}\n",
            "set engines.custom.command",
        ),
        (
            "models:\n  m: {engine: llama_cpp, source: 'https://x/m.gguf', sha256: abc}\n",
            "must be 64 hexadecimal digits",
        ),
        (
            "models:\n  m: {engine: tei, source: hf://o/r, task: chat}\n",
            "unknown task \"chat\"",
        ),
        (
            "models:\n  m: {engine: vllm, source: hf://o/r, params: 7B, quantization: q3}\n",
            "unknown quantization",
        ),
        (
            "models:\n  m: {engine: llama_cpp, source: /m.gguf, slots: 0}\n",
            "must be a number above 0",
        ),
    ] {
        let err = load_err(yaml);
        assert!(err.contains(wanted), "{yaml}: {err}");
        assert!(err.contains("models.m"), "{yaml}: {err}");
    }
}

#[test]
fn engines_with_an_unknown_kind_warn_and_a_custom_command_takes_placeholders() {
    let (c, warnings) = load(
        "engines:\n  llamafile: {command: x}\n  custom: {command: 'my-server --listen {host}:{port}'}\nmodels:\n  m: {engine: custom, source: /m.bin}\n",
    );
    assert!(
        warnings.iter().any(|w| w.contains("engines.llamafile")),
        "{warnings:?}"
    );
    let argv = &c.models["m"].argv;
    assert_eq!(argv[0], "my-server");
    assert!(argv[2].starts_with("127.0.0.1:"), "{argv:?}");
}
