//! Writes a tiny model: `tiny OUT.gguf [--f16] [--embedding] [--reranker] [--seed N] [--split N]
//! [--layers N] [--embd N] [--heads N] [--heads-kv N] [--ff N] [--ctx N]`.
//!
//! The shape options make a bigger model than the tests use, e.g. one whose prompt processing
//! dominates a request on a CPU (`bench/prefix.sh`).

use gguf::{tiny_llama_writer, TinyOptions};

const USAGE: &str =
    "usage: tiny OUT.gguf [--f16] [--embedding] [--reranker] [--seed N] [--split N] \
                     [--layers N] [--embd N] [--heads N] [--heads-kv N] [--ff N] [--ctx N]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args.next().ok_or(USAGE)?;
    let mut opts = TinyOptions::default();
    let mut split = 0u16;
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<u32, Box<dyn std::error::Error>> {
            let v = args
                .next()
                .ok_or_else(|| format!("{name} needs a number"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)
        };
        match a.as_str() {
            "--f16" => opts.f16 = true,
            "--embedding" => opts.embedding = true,
            "--reranker" => opts.reranker = true,
            "--seed" => opts.seed = u64::from(number("--seed")?),
            "--split" => split = u16::try_from(number("--split")?)?,
            "--layers" => opts.n_layer = number("--layers")?,
            "--embd" => opts.n_embd = number("--embd")?,
            "--heads" => opts.n_head = number("--heads")?,
            "--heads-kv" => opts.n_head_kv = number("--heads-kv")?,
            "--ff" => opts.n_ff = number("--ff")?,
            "--ctx" => opts.n_ctx = number("--ctx")?,
            other => return Err(format!("unknown option {other}\n{USAGE}").into()),
        }
    }
    let w = tiny_llama_writer(&opts)?;
    if split > 0 {
        let prefix = out.strip_suffix(".gguf").unwrap_or(&out);
        for p in w.write_split(prefix, split)? {
            println!("{}", p.display());
        }
    } else {
        w.write_file(&out)?;
        println!("{out}");
    }
    Ok(())
}
