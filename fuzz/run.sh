#!/usr/bin/env bash
# Fuzzes every target on stable Rust for SECONDS in all (default 60), split evenly between them,
# starting from the committed seeds; exits non-zero at the first target that finds a crash (the
# input is left under fuzz/artifacts/<target>/). `fuzz/run.sh SECONDS TARGET` fuzzes one target.
# Targets: gguf_header (GGUF header reader), config_load (YAML config loader), body_model (model
# id from JSON, multipart and form bodies), token_meter (usage and timings in JSON and SSE bodies).
# GGUF seeds come from: cargo run -p gguf --example fuzz_seeds -- fuzz/seeds/gguf_header
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
if [ $# -ge 2 ]; then
    targets=("$2")
else
    targets=(gguf_header config_load body_model token_meter)
fi
each=$(( secs / ${#targets[@]} ))
(( each > 0 )) || each=1
# -s none: no sanitizer, so no nightly. Build every target first so the time goes to fuzzing.
cargo fuzz build -s none
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    # new inputs go to corpus/, seeds are read-only.
    cargo fuzz run -s none "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$each" -rss_limit_mb=2048 -timeout=10
done
