//! The estimator against synthetic GGUF headers: placement, KV sizing, compute and the notes.

use super::*;
use crate::memory::parse_llama_args;
use gguf::GgmlType;
use gguf::{Array, Writer};
use std::path::{Path, PathBuf};

const E: u64 = 256;
const VOCAB: u64 = 1000;
/// Sizes of the synthetic model's tensors (see `synth`).
const EMBD: u64 = E * VOCAB * 2;
const LAYER: u64 = E * E * 2 + E / 32 * 34 * 512;
const HEAD: u64 = E * 4 + E / 32 * 34 * VOCAB;

/// A 4-layer `llama` header (8 heads, 2 KV heads of 32) with zero tensors.
fn synth(tied: bool, meta: &[(&str, gguf::Value)]) -> Writer {
    let mut w = Writer::new();
    w.set("general.architecture", "llama")
        .set("llama.block_count", 4u32)
        .set("llama.embedding_length", E as u32)
        .set("llama.feed_forward_length", 512u32)
        .set("llama.attention.head_count", 8u32)
        .set("llama.attention.head_count_kv", 2u32)
        .set("llama.context_length", 4096u32);
    for (k, v) in meta {
        w.set(*k, v.clone());
    }
    w.add_zero_tensor("token_embd.weight", &[E, VOCAB], GgmlType::F16);
    for i in 0..4 {
        w.add_zero_tensor(format!("blk.{i}.attn_q.weight"), &[E, E], GgmlType::F16);
        w.add_zero_tensor(format!("blk.{i}.ffn_up.weight"), &[E, 512], GgmlType::Q8_0);
    }
    w.add_zero_tensor("output_norm.weight", &[E], GgmlType::F32);
    if !tied {
        w.add_zero_tensor("output.weight", &[E, VOCAB], GgmlType::Q8_0);
    }
    w
}

fn write(dir: &Path, w: &Writer) -> PathBuf {
    let p = dir.join("m.gguf");
    w.write_file(&p).unwrap();
    p
}

fn est(model: &Path, flags: &str) -> Result<Estimate, String> {
    let mut argv: Vec<String> = vec!["-m".into(), model.display().to_string()];
    argv.extend(flags.split_whitespace().map(String::from));
    estimate_llama(&parse_llama_args(&argv))
}

#[test]
fn kv_bytes_follow_llama_cpp_context_rules() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), &synth(false, &[]));
    // 4 layers x (K 32*2 + V 32*2) f16 = 1 KiB per cell.
    let per_cell = 4 * 128 * 2;
    for (flags, ctx, slots) in [
        ("-c 1000 -np 2", 1024, 2), // padded to 256, 512 per slot
        ("-c 1024 -np 3", 1536, 3), // 341 per slot padded to 512
        ("-c 1024", 1024, 4),       // -np auto: 4 slots, unified
        ("-c 1024 -np 3 -kvu", 1024, 3),
        ("-c 0 -np 1", 4096, 1), // the training context
        ("-np 2", 4096, 2),
    ] {
        let e = est(&m, flags).unwrap();
        assert_eq!((e.ctx, e.parallel), (ctx, slots), "{flags}");
        assert_eq!(e.kv_bytes, per_cell * ctx, "{flags}");
    }
    let e = est(&m, "-c 4096 -ctk q8_0 -ctv=q4_0").unwrap();
    assert_eq!(e.kv_bytes, 4 * (2 * 34 + 2 * 18) * 4096);
    let e = est(&m, "-c 4096 --cache-type-k F32").unwrap();
    assert_eq!(e.kv_bytes, 4 * (64 * 4 + 64 * 2) * 4096);
    let err = est(&m, "-ctk q3_k").unwrap_err();
    assert!(err.contains("q3_k") && err.contains("q8_0"), "{err}");
    assert!(est(&m, "-np 300").unwrap_err().contains("256"));
    assert!(est(&m, "-c 99999999999").is_err());
    // Hostile shapes: errors or saturated sizes, never a panic or a huge allocation.
    let huge = [("llama.attention.key_length", u64::MAX.into())];
    let e = est(&write(dir.path(), &synth(false, &huge)), "-c 256 -np 1").unwrap();
    assert_eq!((e.kv_bytes, e.total_bytes), (u64::MAX, u64::MAX));
    let layers = [("llama.block_count", (1u64 << 40).into())];
    let err = est(&write(dir.path(), &synth(false, &layers)), "").unwrap_err();
    assert!(err.contains("block_count"), "{err}");
}

#[test]
fn kv_head_dims_per_layer_arrays_and_mla() {
    let dir = tempfile::tempdir().unwrap();
    let kv = (
        "llama.attention.head_count_kv",
        Array::U32(vec![2, 0, 4, 1]).into(),
    );
    let m = write(dir.path(), &synth(false, &[kv]));
    assert_eq!(
        est(&m, "-c 256").unwrap().kv_bytes,
        (2 + 4 + 1) * 64 * 2 * 256
    );
    let dims = [
        ("llama.attention.key_length", 128u32.into()),
        ("llama.attention.value_length", 64u32.into()),
    ];
    let m = write(dir.path(), &synth(false, &dims));
    assert_eq!(
        est(&m, "-c 256").unwrap().kv_bytes,
        4 * 2 * (128 + 64) * 2 * 256
    );
    let mla = ("llama.attention.key_length_mla", 192u32.into());
    let m = write(dir.path(), &synth(false, &[dims[0].clone(), mla]));
    assert_eq!(est(&m, "-c 256").unwrap().kv_bytes, 4 * 2 * 128 * 2 * 256);
}

#[test]
fn ngl_offloads_the_last_layers_and_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), &synth(false, &[]));
    let all = 4 * LAYER + HEAD;
    for (ngl, weights, layers) in [
        ("", all, 4),
        ("-ngl auto", all, 4),
        ("--n-gpu-layers=all", all, 4),
        ("-ngl 99", all, 4),
        ("-ngl 5", all, 4),
        ("-ngl 4", HEAD + 3 * LAYER, 3), // layer 0 stays on the CPU
        ("--gpu-layers 3", HEAD + 2 * LAYER, 2),
        ("-ngl 1", HEAD, 0),
        ("-ngl 0", 0, 0),
    ] {
        let e = est(&m, &format!("-c 256 -np 1 {ngl}")).unwrap();
        assert_eq!((e.weights_bytes, e.gpu_layers), (weights, layers), "{ngl}");
        assert_eq!(
            e.kv_bytes,
            layers * 256 * 256,
            "{ngl}: KV follows the layers"
        );
        assert_eq!(e.file_weights_bytes, EMBD + all);
        let cpu_kv = (4 - layers) * 256 * 256;
        assert_eq!(
            e.host_bytes,
            EMBD + all - weights + cpu_kv,
            "{ngl}: the CPU keeps the input embeddings, the other weights and their KV"
        );
        assert_eq!(e.layers, 4);
        let sum = e.weights_bytes + e.kv_bytes + e.compute_bytes + e.mmproj_bytes;
        assert_eq!(e.total_bytes, sum);
    }
    let nkvo = est(&m, "-c 256 -nkvo").unwrap();
    assert_eq!((nkvo.kv_bytes, nkvo.host_bytes), (0, EMBD + 4 * 256 * 256));
    let auto = est(&m, "").unwrap();
    assert!(
        auto.notes.iter().any(|n| n.contains("-ngl auto")),
        "{:?}",
        auto.notes
    );
    // Tied embeddings: the head is a GPU copy of token_embd.
    let m = write(dir.path(), &synth(true, &[]));
    assert_eq!(est(&m, "").unwrap().weights_bytes, 4 * LAYER + E * 4 + EMBD);
    assert_eq!(est(&m, "-ngl 0").unwrap().weights_bytes, 0);
}

#[test]
fn split_files_mmproj_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let w = synth(false, &[]);
    let single = est(&write(dir.path(), &w), "-c 512").unwrap();
    let parts = w.write_split(dir.path().join("s"), 3).unwrap();
    let split = est(&parts[0], "-c 512").unwrap();
    assert_eq!(split, single);
    std::fs::remove_file(&parts[2]).unwrap();
    let err = est(&parts[0], "").unwrap_err();
    assert!(err.contains("s-00003-of-00003.gguf"), "{err}");

    let missing = dir.path().join("nope.gguf");
    let err = est(&missing, "").unwrap_err();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let err = estimate_llama(&LlamaArgs::default()).unwrap_err();
    assert!(err.contains("-m"), "{err}");
    std::fs::write(dir.path().join("junk.gguf"), b"not a model").unwrap();
    let err = est(&dir.path().join("junk.gguf"), "").unwrap_err();
    assert!(err.contains("junk.gguf") && err.contains("GGUF"), "{err}");

    let mut proj = Writer::new();
    proj.set("general.architecture", "clip");
    proj.add_zero_tensor("v.patch_embd.weight", &[64, 1000], GgmlType::F16);
    let pp = dir.path().join("proj.gguf");
    proj.write_file(&pp).unwrap();
    let m = dir.path().join("m.gguf");
    let flags = format!("-c 512 --mmproj {}", pp.display());
    let e = est(&m, &flags).unwrap();
    assert_eq!(e.mmproj_bytes, 128_000);
    assert_eq!(e.total_bytes, single.total_bytes + 128_000);
    let err = est(&m, &format!("-mm {}", missing.display())).unwrap_err();
    assert!(err.contains("mmproj") && err.contains("nope.gguf"), "{err}");
}

#[test]
fn compute_grows_with_ubatch_and_without_flash_attention() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), &synth(false, &[]));
    let base = est(&m, "-c 4096 -np 1").unwrap().compute_bytes;
    // FFN-bound: 512 tokens x (3*512 + 5*256) f32 + f16 mask + 1 logit row.
    assert_eq!(
        base,
        512 * 4 * (3 * 512 + 5 * 256) + 4096 * 512 * 2 + VOCAB * 4
    );
    assert!(est(&m, "-c 4096 -np 1 -ub 256").unwrap().compute_bytes < base);
    assert!(est(&m, "-c 4096 -np 1 -fa off").unwrap().compute_bytes > 4 * base);
    assert_eq!(est(&m, "-c 4096 -np 1 -fa on").unwrap().compute_bytes, base);
    let err = est(&m, "-fa off -ctv q8_0").unwrap_err();
    assert!(err.contains("flash attention"), "{err}");
    assert!(est(&m, "-fa off -ctk q8_0").is_ok());
}

#[test]
fn parses_llama_server_argv() {
    let argv: Vec<String> = "llama-server --model=/m/a.gguf -mm p.gguf -c 8192 -np 4 -ngl 33 -ctk q8_0 --cache-type-v=q4_0 -ub 1024 -fa off -kvu -nkvo --port 8080 -t 4"
        .split_whitespace().map(String::from).collect();
    let a = parse_llama_args(&argv);
    assert_eq!(a.model, Some(PathBuf::from("/m/a.gguf")));
    assert_eq!(a.mmproj, Some(PathBuf::from("p.gguf")));
    assert_eq!(
        (a.ctx, a.parallel, a.ubatch),
        (Some(8192), Some(4), Some(1024))
    );
    assert_eq!(a.ngl, Some(NglSetting::Layers(33)));
    assert_eq!(
        (a.cache_type_k.as_deref(), a.cache_type_v.as_deref()),
        (Some("q8_0"), Some("q4_0"))
    );
    assert_eq!(
        (a.flash_attn.as_deref(), a.kv_unified, a.no_kv_offload),
        (Some("off"), Some(true), true)
    );
    let ngl = |v: &str| parse_llama_args(&["-ngl".into(), v.into()]).ngl;
    assert_eq!(ngl("auto"), Some(NglSetting::Auto));
    assert_eq!(ngl("-1"), Some(NglSetting::Auto));
    assert_eq!(ngl("all"), Some(NglSetting::All));
    assert_eq!(ngl("-2"), Some(NglSetting::All));
    assert_eq!(ngl("0"), Some(NglSetting::Layers(0)));
    assert_eq!(ngl("lots"), None);
    let a = parse_llama_args(&["-np".into(), "-1".into(), "-c".into()]);
    assert_eq!((a.parallel, a.ctx), (None, None));
}
