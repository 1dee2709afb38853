//! GGUF header reader and writer for corral.
//!
//! corral sizes GPU memory from GGUF headers without touching weights, and
//! its tests need real (tiny) models for llama-server; both live here.
//! Formats follow llama.cpp's `ggml/src/gguf.cpp` and `ggml/src/ggml.c`.

mod error;
mod header;
mod limits;
mod parse;
mod reader;
mod split;
mod tiny;
mod types;
mod value;
mod writer;

pub use error::Error;
pub use header::{Header, TensorInfo, DEFAULT_ALIGNMENT};
pub use limits::{MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_STRING_LEN};
pub use reader::{read_file, read_header, read_header_sized};
pub use split::{parse_split_name, read_model, split_path, Model, Part};
pub use tiny::{
    f32_to_f16_bits, tiny_llama_writer, tiny_vocab, write_tiny_llama, TinyOptions, CHATML_TEMPLATE,
};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};
pub use writer::Writer;
