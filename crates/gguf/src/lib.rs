//! GGUF header reader and writer (placeholder).
