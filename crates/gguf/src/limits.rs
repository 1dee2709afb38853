//! The bounds a header must keep, as gguf.cpp sets them: what the reader and the parser refuse past.

/// Longest string accepted (gguf.cpp's `GGUF_MAX_STRING_LENGTH`).
pub const MAX_STRING_LEN: u64 = 1 << 30;
/// Most elements in one array (gguf.cpp's `GGUF_MAX_ARRAY_ELEMENTS`).
pub const MAX_ARRAY_LEN: u64 = 1 << 30;
/// Deepest nesting of arrays in arrays; bounds recursion.
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: u32 = 4;
