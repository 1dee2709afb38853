#!/usr/bin/env bash
# corral's benchmark: one command, loopback only, a few minutes on a 2-core machine.
#
#   bench/run.sh            build (release), install nginx if missing, run every scenario, print the table
#   bench/run.sh --quick    the same with ~1/3 of the requests and durations (a smoke run)
#   bench/run.sh --pgo      corral as the image ships it: built by scripts/build-pgo.sh
#
# Scenarios (the fake engine directly, through corral, through nginx and through the bare hyper
# proxy `corral-load floor`, side by side):
#   1. small JSON requests at concurrency 1: added latency p50/p99
#   2. the same at concurrency 64: throughput ratio to direct, proxy CPU per request
#   3. SSE streams of 200 chunks every 5 ms: added delay per chunk, coalesced chunks
#   4. 1,000 open streams: RSS idle / holding / after close, how fast upstream streams close
#   5. readiness: the wait beyond a 300 ms model load
#   6. the body-inspection hot path (criterion: cargo bench --bench hot_path)
#
# Environment: CARGO_TARGET_DIR is honoured; BENCH_OUT (default bench/results) gets latest.md and
# latest.json; NGINX=/path/to/nginx picks another nginx; BENCH_NO_CRITERION=1 skips scenario 6;
# BENCH_QUIET_WAIT=SECONDS waits up to that long for the 1-minute load average to drop below 1
# before measuring (other builds on a 2-core machine make latencies noisy).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[bench %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

QUICK=()
PGO=0
CRITERION_TIME=(--warm-up-time 1 --measurement-time 3)
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=(--quick); CRITERION_TIME=(--warm-up-time 0.5 --measurement-time 1) ;;
        --pgo) PGO=1 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "usage: bench/run.sh [--quick] [--pgo]" >&2; exit 2 ;;
    esac
done

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
OUT="${BENCH_OUT:-bench/results}"

# nginx, as a plain reverse proxy to compare with.
NGINX="${NGINX:-$(command -v nginx || true)}"
[[ -z "$NGINX" && -x /usr/sbin/nginx ]] && NGINX=/usr/sbin/nginx
if [[ -z "$NGINX" ]]; then
    log "nginx is missing: installing Debian's nginx"
    export DEBIAN_FRONTEND=noninteractive
    SUDO=(); [[ "$(id -u)" != 0 ]] && SUDO=(sudo)
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1 \
        || "${SUDO[@]}" apt-get install -y -qq --no-install-recommends nginx >/dev/null
    NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
fi
[[ -x "$NGINX" ]] || { log "no nginx binary at $NGINX"; exit 1; }

# Which sources the binary is built from (others may commit while this runs).
rev() {
    local r
    r="$(git rev-parse --short HEAD 2>/dev/null)" || return 0
    [[ -n "$(git status --porcelain -- src crates Cargo.toml Cargo.lock 2>/dev/null)" ]] && r="$r with local changes"
    echo "$r"
}
REV_BUILT="$(rev)"
log "building corral and corral-load (release, target dir $TARGET_DIR)"
cargo build --release -p corral -p corral-load
CORRAL_EXE="$TARGET_DIR/release/corral"
BUILD_NOTE=""
if [[ "$PGO" == 1 ]]; then
    scripts/build-pgo.sh
    CORRAL_EXE="$TARGET_DIR/pgo/corral"
    BUILD_NOTE=", profile-guided build"
fi

# 1,000 streams hold ~4,000 descriptors across the load generator, the proxy and the engine.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "open-file limit: $(ulimit -n)"

CRITERION_ARGS=()
if [[ "${BENCH_NO_CRITERION:-0}" != 1 ]]; then
    log "hot path micro-benchmark (criterion)"
    rm -rf "$TARGET_DIR"/criterion/hot_path*
    cargo bench --bench hot_path -- "${CRITERION_TIME[@]}" >"$TARGET_DIR/hot_path.log" 2>&1 \
        || { cat "$TARGET_DIR/hot_path.log" >&2; exit 1; }
    grep -E '^hot_path/|time:' "$TARGET_DIR/hot_path.log" >&2 || true
    CRITERION_ARGS=(--criterion "$TARGET_DIR/criterion")
fi

if [[ "${BENCH_QUIET_WAIT:-0}" -gt 0 ]]; then
    deadline=$((SECONDS + BENCH_QUIET_WAIT))
    while awk '{exit !($1 >= 1.0)}' /proc/loadavg && ((SECONDS < deadline)); do
        log "waiting for a quiet machine (load average $(cut -d' ' -f1 /proc/loadavg))"
        sleep 10
    done
fi

REV_NOW="$(rev)"
[[ "$REV_NOW" != "$REV_BUILT" ]] && REV_BUILT="$REV_BUILT (the checkout is now at $REV_NOW)"
log "load scenarios (direct, corral, nginx)"
"$TARGET_DIR/release/corral-load" suite \
    --corral "$CORRAL_EXE" \
    --nginx "$NGINX" \
    --out "$OUT" \
    ${REV_BUILT:+--corral-rev "$REV_BUILT$BUILD_NOTE"} \
    "${CRITERION_ARGS[@]}" "${QUICK[@]}"
