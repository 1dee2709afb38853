#!/usr/bin/env bash
# Prefix-aware balancing against slots and round-robin on a real llama-server pool (2 replicas x 2
# slots; loopback only, a few minutes). Makes its model (a random-weight llama GGUF whose prompt
# processing dominates a request on a CPU), builds or reuses llama-server, and prints the table.
# Usage: bench/prefix.sh [corral-prefix options, e.g. --conversations 8 --turns 5]
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${CARGO_TARGET_DIR:-target}"
log() { printf '[prefix %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

llama="${CORRAL_LLAMA_SERVER:-$(scripts/install-llama-server.sh | tail -n 1)}"
cargo build --release --locked --bin corral -p corral --bin corral-prefix -p corral-balance \
    --example tiny -p gguf >&2

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# 4 layers of width 512: ~13M parameters, about a second to evaluate a 1,500-token prompt on one
# core, and milliseconds per generated token.
"$target/release/examples/tiny" "$work/prefix.gguf" --layers 4 --embd 512 --heads 8 --heads-kv 4 \
    --ff 1536 --ctx 32768 >/dev/null
log "llama-server: $llama; model $(du -h "$work/prefix.gguf" | cut -f1)"
log "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$target/release/corral-prefix" --corral "$target/release/corral" --llama-server "$llama" \
    --model "$work/prefix.gguf" "$@"
