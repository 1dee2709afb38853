//! Prints a GGUF model's metadata (arrays abbreviated) and tensors:
//! `dump MODEL.gguf` (split parts are followed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: dump MODEL.gguf")?;
    let m = gguf::read_model(&path)?;
    let h = &m.header;
    println!(
        "version {} alignment {} data_offset {}",
        h.version, h.alignment, h.data_offset
    );
    for (k, v) in &h.metadata {
        match v {
            gguf::Value::Array(a) => println!("{k} = [{}; {}]", a.elem_type(), a.len()),
            gguf::Value::String(s) if s.len() > 80 => {
                println!("{k} = {:?}...", s.chars().take(80).collect::<String>())
            }
            v => println!("{k} = {v:?}"),
        }
    }
    for t in &m.tensors {
        println!(
            "{:40} {:6} {:?} offset {} bytes {}",
            t.name,
            t.ggml_type.name(),
            t.dims,
            t.offset,
            t.n_bytes
        );
    }
    println!(
        "{} tensors, {} bytes of weights, {} bytes on disk in {} part(s)",
        m.tensors.len(),
        m.tensor_bytes(),
        m.file_size(),
        m.parts.len()
    );
    Ok(())
}
