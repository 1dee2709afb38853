//! One test per rule of the derivation.

use serde_json::json;

use super::gather::{context_of_props, facts_of_header};
use super::*;

fn argv(cmd: &str) -> Vec<String> {
    cmd.split_whitespace().map(String::from).collect()
}

fn with_launch(cmd: &str) -> Facts {
    Facts {
        launch: Launch::from_argv(&argv(cmd)),
        ..Facts::default()
    }
}

fn trained(n_ctx_train: u64) -> GgufFacts {
    GgufFacts {
        n_ctx_train: Some(n_ctx_train),
        n_params: 1_000,
        size: 4_000,
        ..GgufFacts::default()
    }
}

#[test]
fn an_engine_models_ctx_is_per_slot() {
    let facts = Facts {
        launch: Launch::engine(Some(8192), Some(4)),
        ..Facts::default()
    };
    assert_eq!(request_context(&facts), Some(8192));
    let one = Facts {
        launch: Launch::engine(Some(2048), None),
        ..Facts::default()
    };
    assert_eq!(request_context(&one), Some(2048));
}

#[test]
fn a_cmds_context_is_shared_among_its_slots() {
    let facts = with_launch("llama-server -m x.gguf -c 4096 -np 4");
    assert_eq!(request_context(&facts), Some(1024));
    let spelled = with_launch("llama-server --ctx-size=8192 --parallel 2");
    assert_eq!(request_context(&spelled), Some(4096));
    let one = with_launch("llama-server -c 4096 -np 1");
    assert_eq!(request_context(&one), Some(4096));
}

#[test]
fn a_unified_kv_cache_gives_every_slot_the_whole_context() {
    for flag in ["--kv-unified", "-kvu"] {
        let facts = with_launch(&format!("llama-server -c 4096 -np 4 {flag}"));
        assert_eq!(request_context(&facts), Some(4096), "{flag}");
    }
    let no = with_launch("llama-server -c 4096 -np 4 -kvu --no-kv-unified");
    assert_eq!(request_context(&no), Some(1024));
}

#[test]
fn without_c_the_gguf_training_context_is_used() {
    let mut facts = with_launch("llama-server -m x.gguf -np 2");
    assert_eq!(request_context(&facts), None, "nothing says");
    facts.gguf = Some(trained(32768));
    assert_eq!(request_context(&facts), Some(16384));
    let zero = Facts {
        gguf: Some(trained(32768)),
        ..with_launch("llama-server -c 0")
    };
    assert_eq!(
        request_context(&zero),
        Some(32768),
        "-c 0 is the model's own"
    );
}

#[test]
fn after_start_the_engines_props_answer_wins() {
    let facts = Facts {
        running_ctx: Some(3000),
        gguf: Some(trained(32768)),
        ..with_launch("llama-server -c 4096 -np 1")
    };
    assert_eq!(request_context(&facts), Some(3000));
    let props = json!({"default_generation_settings": {"n_ctx": 2048}, "n_ctx": 8192});
    assert_eq!(context_of_props(&props), Some(2048));
    assert_eq!(context_of_props(&json!({"n_ctx": 8192})), Some(8192));
    assert_eq!(
        context_of_props(&json!({"default_generation_settings": {"n_ctx": 0}})),
        None
    );
}

#[test]
fn a_configured_value_wins() {
    let derived = Derived {
        context_length: Some(1024),
        input: vec!["text", "image"],
        tools: true,
        n_ctx_train: Some(4096),
        n_params: Some(7),
        size: Some(9),
    };
    let mut record = json!({
        "context_length": 8192, "meta": {"n_ctx": 8192, "llamaswap": {}},
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "supported_parameters": ["tools"], "capabilities": {"vision": false},
    });
    fill(&mut record, &derived);
    assert_eq!(record["context_length"], 8192);
    assert_eq!(record["meta"]["n_ctx"], 8192);
    assert_eq!(record["architecture"]["input_modalities"], json!(["text"]));
    assert_eq!(record["supported_parameters"], json!(["tools"]));
    assert_eq!(record["capabilities"]["vision"], false);
    assert_eq!(record["capabilities"]["function_calling"], true);
    assert_eq!(
        record["meta"]["n_ctx_train"], 4096,
        "what is unset is filled"
    );
    assert_eq!(record["meta"]["n_params"], 7);
    assert_eq!(record["meta"]["size"], 9);
}

#[test]
fn unset_fields_are_filled() {
    let derived = derive(&Facts {
        gguf: Some(GgufFacts {
            tools: true,
            ..trained(2048)
        }),
        projector: Some(Projector {
            vision: true,
            audio: true,
        }),
        ..with_launch("llama-server -m x.gguf")
    });
    let mut record = json!({"id": "m", "meta": {"llamaswap": {"type": "model"}}});
    fill(&mut record, &derived);
    assert_eq!(record["context_length"], 2048);
    assert_eq!(record["meta"]["n_ctx"], 2048);
    assert_eq!(record["meta"]["llamaswap"]["type"], "model");
    assert_eq!(
        record["architecture"]["input_modalities"],
        json!(["text", "image", "audio"])
    );
    assert_eq!(record["architecture"]["modality"], "text+image+audio->text");
    assert_eq!(
        record["supported_parameters"],
        json!(["tools", "tool_choice"])
    );
    assert_eq!(
        record["capabilities"],
        json!({"function_calling": true, "vision": true})
    );
}

#[test]
fn disable_auto_turns_the_filling_off() {
    let yaml = "models:\n  a:\n    cmd: srv --port ${PORT} -c 4096\n  b:\n    cmd: srv --port ${PORT} -c 4096\n    capabilities:\n      disableAuto: true\n";
    let config = crate::config::load_str("t.yaml", yaml, &|_| None)
        .unwrap()
        .config;
    assert!(fills(&config.models["a"]));
    assert!(!fills(&config.models["b"]));
}

#[test]
fn an_mmproj_means_image_input() {
    let facts = Facts {
        projector: Some(Projector {
            vision: true,
            audio: false,
        }),
        ..Facts::default()
    };
    assert_eq!(input_modalities(&facts), ["text", "image"]);
    assert_eq!(input_modalities(&Facts::default()), ["text"]);
}

#[test]
fn a_header_tells_context_encoders_and_tools() {
    let mut w = gguf::Writer::new();
    w.set("general.architecture", "qwen2")
        .set("qwen2.context_length", 32768u32)
        .set("clip.has_audio_encoder", true)
        .set(
            "tokenizer.chat_template",
            "{% if tools %}{{ tools | tojson }}{% endif %}",
        );
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let header = gguf::read_header(bytes.as_slice()).unwrap();
    let facts = facts_of_header(&header, 5, 6);
    assert_eq!(
        facts,
        GgufFacts {
            n_ctx_train: Some(32768),
            n_params: 5,
            size: 6,
            vision: false,
            audio: true,
            tools: true,
        }
    );
}
