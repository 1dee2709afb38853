//! Writes a tiny model: `tiny OUT.gguf [--f16] [--embedding] [--reranker]
//! [--seed N] [--split N]`.

use gguf::{tiny_llama_writer, TinyOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .ok_or("usage: tiny OUT.gguf [--f16] [--embedding] [--reranker] [--seed N] [--split N]")?;
    let mut opts = TinyOptions::default();
    let mut split = 0u16;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--f16" => opts.f16 = true,
            "--embedding" => opts.embedding = true,
            "--reranker" => opts.reranker = true,
            "--seed" => opts.seed = args.next().ok_or("--seed N")?.parse()?,
            "--split" => split = args.next().ok_or("--split N")?.parse()?,
            other => return Err(format!("unknown option {other}").into()),
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
