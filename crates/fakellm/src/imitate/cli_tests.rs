use super::*;
use crate::args::{parse, Config, Parsed};

fn v(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// Translates and parses, as fakellm's main does.
fn cfg_with(words: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Config {
    let (kind, args) = translate(&v(words), env).unwrap();
    match parse(&args).unwrap() {
        Parsed::Run(c) => Config {
            imitate: kind,
            ..*c
        },
        Parsed::Help => panic!("help"),
    }
}

fn cfg(words: &[&str]) -> Config {
    cfg_with(words, &no_env)
}

#[test]
fn llama_cpp_is_untouched() {
    let args = v(&["--port", "5", "-m", "x.gguf"]);
    assert_eq!(
        translate(&args, &no_env).unwrap(),
        (Kind::LlamaCpp, args.clone())
    );
    let (kind, rest) = translate(&v(&["--imitate=llama.cpp", "--port", "5"]), &no_env).unwrap();
    assert_eq!((kind, rest), (Kind::LlamaCpp, v(&["--port", "5"])));
    assert!(translate(&v(&["--imitate", "nope"]), &no_env).is_err());
    assert!(translate(&v(&["--imitate"]), &no_env).is_err());
}

#[test]
fn vllm_serve_line() {
    let c = cfg(&[
        "--imitate",
        "vllm",
        "serve",
        "/snap/qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "5001",
        "--served-model-name",
        "m1",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "4",
        "--runner",
        "pooling",
        "--loading-ms",
        "50",
    ]);
    assert_eq!(c.imitate, Kind::Vllm);
    assert_eq!(
        (c.port, c.alias.as_str(), c.slots, c.ctx_size),
        (5001, "m1", 4, 8192)
    );
    assert_eq!(c.model.as_deref(), Some("/snap/qwen"));
    assert_eq!(c.loading_ms, 50);
    // without a port or a served name: vLLM's defaults
    let c = cfg(&["--imitate", "vllm", "serve", "/snap/qwen"]);
    assert_eq!((c.port, c.alias.as_str()), (8000, "/snap/qwen"));
}

#[test]
fn sglang_drops_the_python_module() {
    let c = cfg(&[
        "--imitate",
        "sglang",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/snap/m",
        "--host",
        "127.0.0.1",
        "--port",
        "7",
        "--served-model-name",
        "s",
        "--context-length",
        "1024",
        "--max-running-requests",
        "3",
        "--is-embedding",
        "--enable-metrics",
    ]);
    assert_eq!(c.model.as_deref(), Some("/snap/m"));
    assert_eq!(
        (c.port, c.alias.as_str(), c.slots, c.ctx_size),
        (7, "s", 3, 1024)
    );
    assert_eq!(cfg(&["--imitate", "sglang"]).port, 30000);
}

#[test]
fn tgi_and_tei_flags() {
    let c = cfg(&[
        "--imitate",
        "tgi",
        "--model-id",
        "/snap/m",
        "--hostname",
        "127.0.0.1",
        "-p",
        "9",
        "--max-input-tokens",
        "4095",
        "--max-total-tokens=4096",
        "--max-concurrent-requests",
        "8",
    ]);
    assert_eq!((c.port, c.slots, c.ctx_size), (9, 8, 4096));
    assert_eq!(c.alias, "/snap/m");
    let c = cfg(&[
        "--imitate",
        "tei",
        "--model-id",
        "/snap/bge",
        "--hostname",
        "::1",
        "--port",
        "3",
        "--served-model-name",
        "e",
        "--max-concurrent-requests",
        "2",
        "--max-batch-tokens",
        "512",
    ]);
    assert_eq!(
        (c.host.as_str(), c.port, c.slots, c.alias.as_str()),
        ("::1", 3, 2, "e")
    );
    assert_eq!(cfg(&["--imitate", "tei"]).port, 3000);
    assert!(translate(&v(&["--imitate", "tgi", "--model-id"]), &no_env).is_err());
}

#[test]
fn ollama_reads_its_environment() {
    let env = |k: &str| match k {
        "OLLAMA_HOST" => Some("127.0.0.1:5009".to_string()),
        "OLLAMA_NUM_PARALLEL" => Some("3".to_string()),
        "OLLAMA_CONTEXT_LENGTH" => Some("2048".to_string()),
        _ => None,
    };
    let c = cfg_with(
        &["--imitate", "ollama", "serve", "--loading-ms", "500"],
        &env,
    );
    assert_eq!(
        (c.host.as_str(), c.port, c.slots, c.ctx_size),
        ("127.0.0.1", 5009, 3, 2048)
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(cfg(&["--imitate", "ollama", "serve"]).port, 11434);
    for (host, want) in [
        ("http://[::1]:7/", ("::1", 7)),
        (":8", ("127.0.0.1", 8)),
        ("0.0.0.0", ("0.0.0.0", 11434)),
        ("::1", ("::1", 11434)),
    ] {
        let env = move |k: &str| (k == "OLLAMA_HOST").then(|| host.to_string());
        let c = cfg_with(&["--imitate", "ollama", "serve"], &env);
        assert_eq!((c.host.as_str(), c.port), want, "{host}");
    }
}
