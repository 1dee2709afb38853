//! Golden command lines and environments, one kind at a time.

use super::*;
use strum::IntoEnumIterator;

/// The words of a command line written as one string.
fn w(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// A launch with everything optional unset; the tests set what they need.
fn base<'a>(command: &'a [String], model: &'a str, args: &'a [String]) -> Launch<'a> {
    Launch {
        command,
        model,
        mmproj: None,
        served_name: "m1",
        host: "127.0.0.1",
        port: 5001,
        ctx: None,
        slots: None,
        task: Task::TextGeneration,
        args,
    }
}

fn run(kind: EngineKind, l: &Launch) -> Vec<String> {
    argv(kind, l)
}

#[test]
fn names_round_trip_and_aliases() {
    for kind in EngineKind::iter() {
        assert_eq!(EngineKind::parse(kind.name()), Some(kind));
    }
    for alias in ["llama.cpp", "llamacpp", "LLAMA_CPP", " llama-cpp "] {
        assert_eq!(EngineKind::parse(alias), Some(EngineKind::LlamaCpp));
    }
    assert_eq!(EngineKind::parse("llama"), None);
    assert_eq!(Task::parse("embedding"), Some(Task::Embedding));
    assert_eq!(Task::parse("text-generation"), Some(Task::TextGeneration));
    assert_eq!(Task::parse("rerank"), None);
    assert_eq!(Task::Embedding.name(), "embedding");
    assert_eq!(EngineKind::Custom.default_command(), Vec::<String>::new());
    assert_eq!(EngineKind::Vllm.default_command(), w("vllm serve"));
    assert_eq!(EngineKind::Ollama.model_form(), ModelForm::Name);
    assert_eq!(EngineKind::LlamaCpp.model_form(), ModelForm::File);
    assert_eq!(EngineKind::Tei.model_form(), ModelForm::Directory);
}

#[test]
fn llama_cpp_minimal_and_full() {
    let cmd = EngineKind::LlamaCpp.default_command();
    let l = base(&cmd, "/m/q.gguf", &[]);
    assert_eq!(
        run(EngineKind::LlamaCpp, &l),
        w("llama-server -m /m/q.gguf --host 127.0.0.1 --port 5001 --alias m1 --metrics")
    );
    let args = w("--jinja -ngl 99");
    let mut l = base(&cmd, "/m/q.gguf", &args);
    l.mmproj = Some("/m/mmproj.gguf");
    l.ctx = Some(8192);
    l.slots = Some(4);
    let full = run(EngineKind::LlamaCpp, &l);
    assert_eq!(
        full,
        w("llama-server -m /m/q.gguf --mmproj /m/mmproj.gguf --host 127.0.0.1 --port 5001 --alias m1 -c 32768 -np 4 --metrics --jinja -ngl 99")
    );
    // what the memory estimator reads back (slot detection reads the same -np)
    let parsed = crate::memory::parse_llama_args(&full);
    assert_eq!(parsed.ctx, Some(32768));
    assert_eq!(parsed.parallel, Some(4));
    assert_eq!(
        parsed.model.as_deref(),
        Some(std::path::Path::new("/m/q.gguf"))
    );
    assert_eq!(
        parsed.mmproj.as_deref(),
        Some(std::path::Path::new("/m/mmproj.gguf"))
    );
}

#[test]
fn llama_cpp_ctx_alone_and_embedding() {
    let cmd = w("/opt/llama-server");
    let mut l = base(&cmd, "/e.gguf", &[]);
    l.ctx = Some(2048);
    l.task = Task::Embedding;
    assert_eq!(
        run(EngineKind::LlamaCpp, &l),
        w("/opt/llama-server -m /e.gguf --host 127.0.0.1 --port 5001 --alias m1 -c 2048 --embedding --metrics")
    );
}

#[test]
fn vllm() {
    let cmd = EngineKind::Vllm.default_command();
    let l = base(&cmd, "/snap/qwen", &[]);
    assert_eq!(
        run(EngineKind::Vllm, &l),
        w("vllm serve /snap/qwen --host 127.0.0.1 --port 5001 --served-model-name m1")
    );
    let args = w("--gpu-memory-utilization 0.5");
    let mut l = base(&cmd, "/snap/qwen", &args);
    l.ctx = Some(8192);
    l.slots = Some(16);
    l.task = Task::Embedding;
    l.mmproj = Some("/ignored");
    assert_eq!(
        run(EngineKind::Vllm, &l),
        w("vllm serve /snap/qwen --host 127.0.0.1 --port 5001 --served-model-name m1 --max-model-len 8192 --max-num-seqs 16 --runner pooling --gpu-memory-utilization 0.5")
    );
}

#[test]
fn tgi() {
    let cmd = EngineKind::Tgi.default_command();
    let l = base(&cmd, "/snap/m", &[]);
    assert_eq!(
        run(EngineKind::Tgi, &l),
        w("text-generation-launcher --model-id /snap/m --hostname 127.0.0.1 --port 5001")
    );
    let args = w("--quantize fp8");
    let mut l = base(&cmd, "/snap/m", &args);
    l.ctx = Some(4096);
    l.slots = Some(8);
    l.task = Task::Embedding; // TGI has no embedding mode: nothing changes
    assert_eq!(
        run(EngineKind::Tgi, &l),
        w("text-generation-launcher --model-id /snap/m --hostname 127.0.0.1 --port 5001 --max-input-tokens 4095 --max-total-tokens 4096 --max-concurrent-requests 8 --quantize fp8")
    );
}

#[test]
fn sglang() {
    let cmd = EngineKind::Sglang.default_command();
    let l = base(&cmd, "/snap/m", &[]);
    assert_eq!(
        run(EngineKind::Sglang, &l),
        w("python -m sglang.launch_server --model-path /snap/m --host 127.0.0.1 --port 5001 --served-model-name m1 --enable-metrics")
    );
    let args = w("--tp 2");
    let mut l = base(&cmd, "/snap/m", &args);
    l.ctx = Some(32768);
    l.slots = Some(3);
    l.task = Task::Embedding;
    assert_eq!(
        run(EngineKind::Sglang, &l),
        w("python -m sglang.launch_server --model-path /snap/m --host 127.0.0.1 --port 5001 --served-model-name m1 --context-length 32768 --max-running-requests 3 --is-embedding --enable-metrics --tp 2")
    );
}

#[test]
fn tei() {
    let cmd = EngineKind::Tei.default_command();
    let mut l = base(&cmd, "/snap/bge", &[]);
    l.task = Task::Embedding;
    assert_eq!(
        run(EngineKind::Tei, &l),
        w("text-embeddings-router --model-id /snap/bge --hostname 127.0.0.1 --port 5001 --served-model-name m1")
    );
    l.ctx = Some(512);
    l.slots = Some(32);
    assert_eq!(
        run(EngineKind::Tei, &l)[9..],
        w("--max-concurrent-requests 32 --max-batch-tokens 16384")
    );
    l.slots = None;
    assert_eq!(run(EngineKind::Tei, &l)[9..], w("--max-batch-tokens 512"));
}

#[test]
fn ollama_argv_is_the_command_and_env_carries_the_rest() {
    let cmd = EngineKind::Ollama.default_command();
    let args = w("--verbose");
    let mut l = base(&cmd, "qwen3:0.6b", &args);
    assert_eq!(run(EngineKind::Ollama, &l), w("ollama serve --verbose"));
    let env = |l: &Launch| env(EngineKind::Ollama, l);
    assert_eq!(env(&l), [("OLLAMA_HOST".into(), "127.0.0.1:5001".into())]);
    l.ctx = Some(8192);
    l.slots = Some(2);
    l.host = "::1";
    assert_eq!(
        env(&l),
        [
            ("OLLAMA_HOST".to_string(), "[::1]:5001".to_string()),
            ("OLLAMA_CONTEXT_LENGTH".into(), "8192".into()),
            ("OLLAMA_NUM_PARALLEL".into(), "2".into()),
        ]
    );
}

#[test]
fn env_offline_for_local_snapshots_only() {
    let offline = vec![
        ("HF_HUB_OFFLINE".to_string(), "1".to_string()),
        ("TRANSFORMERS_OFFLINE".into(), "1".into()),
    ];
    for kind in [
        EngineKind::Vllm,
        EngineKind::Tgi,
        EngineKind::Sglang,
        EngineKind::Tei,
    ] {
        assert_eq!(env(kind, &base(&[], "/snap/m", &[])), offline, "{kind:?}");
        assert_eq!(
            env(kind, &base(&[], "Qwen/Qwen3-0.6B", &[])),
            vec![],
            "{kind:?}"
        );
    }
    assert_eq!(
        env(EngineKind::LlamaCpp, &base(&[], "/m.gguf", &[])),
        vec![]
    );
    assert_eq!(env(EngineKind::Custom, &base(&[], "/m", &[])), vec![]);
}

#[test]
fn custom_substitutes_placeholders_once() {
    let cmd = w("/bin/my-engine --listen={host}:{port}");
    let args = w("--model {model} --name {name} {ctx}/{slots} {unknown} {mmproj} {open");
    let mut l = base(&cmd, "/m/{port}.bin", &args);
    assert_eq!(
        run(EngineKind::Custom, &l),
        w("/bin/my-engine --listen=127.0.0.1:5001 --model /m/{port}.bin --name m1 {ctx}/{slots} {unknown} {mmproj} {open")
    );
    l.ctx = Some(100);
    l.slots = Some(2);
    l.mmproj = Some("/p");
    assert_eq!(run(EngineKind::Custom, &l)[6..9], w("100/2 {unknown} /p"));
    assert_eq!(env(EngineKind::Custom, &l), vec![]);
}
