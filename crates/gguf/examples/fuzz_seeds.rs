//! Writes the fuzz seed corpus: `fuzz_seeds OUT_DIR` (used for
//! `fuzz/seeds/gguf_header`): small valid files and truncated copies.

use gguf::{tiny_llama_writer, Array, GgmlType, TinyOptions, Writer};

fn bytes(w: &Writer) -> Vec<u8> {
    let mut v = Vec::new();
    w.write_to(&mut v).expect("in-memory write");
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: fuzz_seeds OUT_DIR")?);
    std::fs::create_dir_all(&dir)?;
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();

    for version in [2u32, 3] {
        let mut w = Writer::with_version(version);
        w.set("general.architecture", "llama")
            .set("llama.block_count", 2u32)
            .set("u8", 1u8)
            .set("i8", -1i8)
            .set("u16", 2u16)
            .set("i16", -2i16)
            .set("i32", -3i32)
            .set("f32", 0.5f32)
            .set("bool", true)
            .set("u64", 4u64)
            .set("i64", -4i64)
            .set("f64", 0.25f64)
            .set("strs", vec!["a", "bc"])
            .set(
                "nested",
                Array::Array(vec![
                    Array::I32(vec![1, 2]),
                    Array::Array(vec![Array::U8(vec![3])]),
                ]),
            );
        w.add_tensor("a", &[4, 2], GgmlType::F32, vec![0; 32])
            .add_tensor("q", &[256], GgmlType::Q4_K, vec![0; 144])
            .add_tensor("m", &[32], GgmlType::MXFP4, vec![0; 17]);
        let b = bytes(&w);
        seeds.push((format!("all-types-v{version}.gguf"), b.clone()));
        if version == 3 {
            for cut in [6, 20, 40, 100, b.len() / 2, b.len() - 40] {
                seeds.push((format!("all-types-v3-cut{cut}.gguf"), b[..cut].to_vec()));
            }
        }
    }

    let mut w = Writer::new();
    w.set_alignment(64).set("general.name", "aligned");
    w.add_tensor("x", &[3], GgmlType::F16, vec![0; 6]);
    seeds.push(("aligned64.gguf".into(), bytes(&w)));

    let mut w = Writer::new();
    w.set("only", "metadata");
    seeds.push(("no-tensors.gguf".into(), bytes(&w)));

    // The tiny llama's header (vocabulary, template, 21 tensor infos) without data.
    let tiny = bytes(&tiny_llama_writer(&TinyOptions::default())?);
    let h = gguf::read_header(&tiny[..])?;
    seeds.push((
        "tiny-llama-header.gguf".into(),
        tiny[..h.data_offset as usize].to_vec(),
    ));

    for (name, b) in seeds {
        std::fs::write(dir.join(&name), &b)?;
        println!("{name}: {} bytes", b.len());
    }
    Ok(())
}
