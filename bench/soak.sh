#!/usr/bin/env bash
# corral's soak test: minutes of mixed traffic through one release-built corral in front of the fake
# engine, sampling corral's RSS, open descriptors and threads every 10 s.
#
#   bench/soak.sh                 30 minutes
#   bench/soak.sh --minutes 2     a short validation run
#   bench/soak.sh --keep          keep corral's config and logs (kept anyway when the verdict fails)
#
# Traffic (about 25 requests/s, loopback only): non-streaming and streaming chat against a pool of
# two replicas, streams the client drops after three chunks, two models in a swap group requested in
# turn (every request swaps), a model whose engine exits every 5 s, and a config reload (SIGHUP)
# every minute. Prints one row per sample and a verdict, writes the rows to bench/results/soak-latest.csv,
# and exits 1 when the verdict fails: RSS, fds or threads grew after warm-up, a request that should
# have succeeded failed, a reload failed, or a reload restarted an unchanged model.
#
# Environment: CARGO_TARGET_DIR is honoured; BENCH_OUT (default bench/results) gets the CSV.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[soak %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

ARGS=()
while (($#)); do
    case "$1" in
        --minutes) [[ $# -ge 2 ]] || { echo "--minutes needs a value" >&2; exit 2; }
                   ARGS+=(--minutes "$2"); shift 2 ;;
        --keep) ARGS+=(--keep); shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "usage: bench/soak.sh [--minutes N] [--keep]" >&2; exit 2 ;;
    esac
done

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
OUT="${BENCH_OUT:-bench/results}"

log "building corral and corral-load (release, target dir $TARGET_DIR)"
cargo build --release -p corral -p corral-load

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "corral $(git rev-parse --short HEAD 2>/dev/null || echo '?'); load average $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
exec "$TARGET_DIR/release/corral-load" soak \
    --corral "$TARGET_DIR/release/corral" \
    --out "$OUT" \
    "${ARGS[@]}"
