mod common;

use common::TempDir;
use gguf::{
    f32_to_f16_bits, read_file, read_model, tiny_llama_writer, tiny_vocab, write_tiny_llama,
    GgmlType, TinyOptions,
};

#[test]
fn tiny_llama_has_what_llama_cpp_needs() {
    let dir = TempDir::new("tiny");
    let path = dir.path().join("tiny.gguf");
    let opts = TinyOptions::default();
    write_tiny_llama(&path, &opts).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!((100_000..1_000_000).contains(&size), "{size} bytes");

    let h = read_file(&path).unwrap();
    assert_eq!(h.architecture(), Some("llama"));
    for (k, v) in [
        ("context_length", 512),
        ("embedding_length", 64),
        ("block_count", 2),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("rope.dimension_count", 16),
    ] {
        assert_eq!(h.arch_u64(k), Some(v), "{k}");
    }
    assert!(h.arch_f64("attention.layer_norm_rms_epsilon").unwrap() > 0.0);
    assert_eq!(h.get_str("tokenizer.ggml.model"), Some("llama"));
    let tokens = h
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .as_strings()
        .unwrap();
    assert_eq!(&tokens[..3], ["<unk>", "<s>", "</s>"]);
    assert!(tokens.iter().any(|t| t == "<0x0A>"));
    assert_eq!(
        h.get_array("tokenizer.ggml.token_type").unwrap().len(),
        tokens.len()
    );
    assert_eq!(
        h.get_array("tokenizer.ggml.scores").unwrap().len(),
        tokens.len()
    );
    assert!(h
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(h.arch_u64("pooling_type"), None);

    let n_vocab = tokens.len() as u64;
    assert_eq!(h.tensors.len(), 3 + 9 * 2);
    let t = h.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (t.dims.as_slice(), t.ggml_type),
        (&[64, n_vocab][..], GgmlType::F32)
    );
    assert_eq!(h.tensor("blk.1.attn_k.weight").unwrap().dims, [64, 32]);
    assert_eq!(h.tensor("blk.0.ffn_down.weight").unwrap().dims, [128, 64]);
    assert_eq!(h.tensor("output.weight").unwrap().dims, [64, n_vocab]);
    assert_eq!(size, h.data_end().next_multiple_of(32));
}

#[test]
fn tiny_options_change_the_model() {
    let dir = TempDir::new("tiny-opts");
    let p = |n: &str| dir.path().join(n);
    let o = TinyOptions {
        f16: true,
        n_layer: 3,
        n_embd: 96,
        n_head: 6,
        n_head_kv: 3,
        n_ctx: 1024,
        ..TinyOptions::default()
    };
    write_tiny_llama(p("a.gguf"), &o).unwrap();
    let h = read_file(p("a.gguf")).unwrap();
    assert_eq!(
        h.tensor("blk.2.attn_q.weight").unwrap().ggml_type,
        GgmlType::F16
    );
    assert_eq!(
        h.tensor("blk.2.attn_norm.weight").unwrap().ggml_type,
        GgmlType::F32
    );
    assert_eq!(h.arch_u64("context_length"), Some(1024));
    assert_eq!(h.arch_u64("rope.dimension_count"), Some(16));

    let emb = TinyOptions {
        embedding: true,
        ..TinyOptions::default()
    };
    write_tiny_llama(p("e.gguf"), &emb).unwrap();
    assert_eq!(
        read_file(p("e.gguf")).unwrap().arch_u64("pooling_type"),
        Some(1)
    );
    let rr = TinyOptions {
        reranker: true,
        ..TinyOptions::default()
    };
    write_tiny_llama(p("r.gguf"), &rr).unwrap();
    let h = read_file(p("r.gguf")).unwrap();
    assert_eq!(h.arch_u64("pooling_type"), Some(4));
    assert_eq!(h.get_bool("tokenizer.ggml.add_sep_token"), Some(true));

    let bad = TinyOptions {
        n_head: 5,
        ..TinyOptions::default()
    };
    assert!(write_tiny_llama(p("bad.gguf"), &bad).is_err());
}

#[test]
fn tiny_models_are_deterministic_per_seed() {
    let bytes = |seed| {
        let mut v = Vec::new();
        tiny_llama_writer(&TinyOptions {
            seed,
            ..TinyOptions::default()
        })
        .unwrap()
        .write_to(&mut v)
        .unwrap();
        v
    };
    assert_eq!(bytes(1), bytes(1));
    assert_ne!(bytes(1), bytes(2));
}

#[test]
fn tiny_split_model_reads_back() {
    let dir = TempDir::new("tiny-split");
    let paths = tiny_llama_writer(&TinyOptions::default())
        .unwrap()
        .write_split(dir.path().join("t"), 2)
        .unwrap();
    let m = read_model(&paths[0]).unwrap();
    assert_eq!(m.tensors.len(), 21);
    assert_eq!(m.header.architecture(), Some("llama"));
}

#[test]
fn vocab_is_unique() {
    let (tokens, types) = tiny_vocab();
    let set: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(set.len(), tokens.len());
    assert_eq!(types.iter().filter(|&&t| t == 6).count(), 256);
}

#[test]
fn f16_conversion() {
    for (x, bits) in [
        (0.0f32, 0x0000u16),
        (-0.0, 0x8000),
        (1.0, 0x3c00),
        (-2.0, 0xc000),
        (0.5, 0x3800),
        (65504.0, 0x7bff),
        (65520.0, 0x7c00),
        (1e10, 0x7c00),
        (f32::INFINITY, 0x7c00),
        (6.1035156e-5, 0x0400),
        (5.9604645e-8, 0x0001),
        (1e-10, 0x0000),
        (0.333_333_34, 0x3555),
    ] {
        assert_eq!(f32_to_f16_bits(x), bits, "{x}");
    }
    assert_eq!(f32_to_f16_bits(f32::NAN) & 0x7c00, 0x7c00);
    assert_ne!(f32_to_f16_bits(f32::NAN) & 0x03ff, 0);
}
