#!/usr/bin/env bash
# Slot-aware replica picking against round-robin on a skewed workload (loopback, ~1 minute).
# Usage: bench/balance.sh [SECONDS] [RATE_PER_SECOND]
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release --locked --bin corral -p corral --bin corral-balance -p corral-balance >&2
exec "$target/release/corral-balance" "$target/release/corral" "${1:-20}" "${2:-75}"
