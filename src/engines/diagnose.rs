//! Reading an engine's output after a failed start: out of memory, or its port already taken.
//!
//! The signatures come from the engines' own messages. They are shared by every kind, because the
//! engines share their runtimes (PyTorch under vLLM, SGLang and TGI's shards; ggml under llama.cpp
//! and Ollama's runner) and a custom engine may be any of them:
//! - PyTorch: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ...`;
//! - ggml: `ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB on device 0:
//!   cudaMalloc failed: out of memory`, `failed to allocate CUDA0 buffer of size 123456`,
//!   `hipMalloc failed`, Vulkan's `ErrorOutOfDeviceMemory`;
//! - vLLM's `No available memory for the cache blocks` and `... is less than desired GPU memory
//!   utilization`, SGLang's `Not enough memory`, TEI's `CUDA_ERROR_OUT_OF_MEMORY`;
//! - ports: llama-server's `couldn't bind HTTP server socket`, Python's `[Errno 98] ... address
//!   already in use`, Rust's `Address already in use (os error 98)` / `AddrInUse`, Go's `bind:
//!   address already in use`.

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

use super::EngineKind;

/// Why an engine failed to start, with the lines of its output that showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub cause: Cause,
    /// The matching lines, trimmed, in order (at most [`MAX_LINES`]).
    pub lines: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Out of (GPU) memory; the size of the allocation that failed, when the engine printed it.
    OutOfMemory { requested_bytes: Option<u64> },
    /// Another process holds the port.
    PortTaken,
}

/// The most lines a diagnosis keeps.
pub const MAX_LINES: usize = 8;

/// Lowercase fragments that mark an out-of-memory line.
const OOM: &[&str] = &[
    "out of memory",
    "outofmemory",
    "out_of_memory",
    "outofdevicememory",
    "cudamalloc failed",
    "hipmalloc failed",
    "failed to allocate",
    "unable to allocate",
    "no available memory for the cache blocks",
    "not enough memory",
    // vLLM, when the card has less free than its share asks: `Free memory on device (59.32/79.15
    // GiB) on startup is less than desired GPU memory utilization (0.9, 71.24 GiB)`
    "less than desired gpu memory utilization",
];

/// Lowercase fragments that mark a port-taken line.
const PORT: &[&str] = &[
    "address already in use",
    "addrinuse",
    "couldn't bind http server socket",
    "errno 98",
    "eaddrinuse",
    "only one usage of each socket address",
];

/// Sizes printed next to a failed allocation: a number and its unit, or a byte count.
static SIZE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:tried to allocate|allocating)\s+([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)\b|buffer of size\s+([0-9]+)",
    )
    .expect("valid regex")
});

/// Reads `output` (an engine's stdout and stderr) for a recognisable cause of a failed start.
/// The cause of the first matching line wins; `None` when no line matches.
pub fn diagnose(_kind: EngineKind, output: &str) -> Option<Diagnosis> {
    let mut oom: Option<bool> = None;
    let mut lines = Vec::new();
    for line in output.lines() {
        let lower = line.to_ascii_lowercase();
        let Some(this) = out_of_memory(&lower) else {
            continue;
        };
        if *oom.get_or_insert(this) == this && lines.len() < MAX_LINES {
            lines.push(line.trim().to_string());
        }
    }
    let cause = if oom? {
        Cause::OutOfMemory {
            requested_bytes: lines.iter().find_map(|l| requested(l)),
        }
    } else {
        Cause::PortTaken
    };
    Some(Diagnosis { cause, lines })
}

/// What a line (lowercased) says failed: `Some(true)` memory, `Some(false)` the port, `None`
/// neither.
fn out_of_memory(lower: &str) -> Option<bool> {
    if PORT.iter().any(|p| lower.contains(p)) {
        Some(false)
    } else if OOM.iter().any(|p| lower.contains(p)) {
        Some(true)
    } else {
        None
    }
}

/// The size of the failed allocation a line names, in bytes.
fn requested(line: &str) -> Option<u64> {
    let c = SIZE.captures(line)?;
    if let Some(bytes) = c.get(3) {
        return bytes.as_str().parse().ok();
    }
    let n: f64 = c.get(1)?.as_str().parse().ok()?;
    let unit = c.get(2)?.as_str().to_ascii_uppercase();
    let scale: f64 = match unit.trim_end_matches('B').trim_end_matches('I') {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((n * scale).round() as u64)
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.lines.first().map(String::as_str).unwrap_or("");
        match self.cause {
            Cause::OutOfMemory { .. } => write!(f, "out of GPU memory: {first}"),
            Cause::PortTaken => write!(f, "port taken: {first}"),
        }
    }
}

#[cfg(test)]
#[path = "diagnose_tests.rs"]
mod tests;
