#!/usr/bin/env bash
# Fuzzes the GGUF header reader on stable Rust for SECONDS (default 60),
# starting from the committed seeds; exits non-zero if it finds a crash
# (the input is left under fuzz/artifacts/gguf_header/).
# Seeds come from: cargo run -p gguf --example fuzz_seeds -- fuzz/seeds/gguf_header
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
mkdir -p corpus/gguf_header
# -s none: no sanitizer, so no nightly; new inputs go to corpus/, seeds are read-only.
exec cargo fuzz run -s none gguf_header corpus/gguf_header seeds/gguf_header -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10
