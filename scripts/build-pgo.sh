#!/usr/bin/env bash
# corral built with profile-guided optimization, as the image ships it: an instrumented build
# serves scripts/pgo-workload.sh, and the profile it leaves guides the final build's inlining and
# code layout around the request path (a quarter fewer instructions per proxied request; see
# bench/README.md). The binary is target/pgo/corral: the `pgo` profile in Cargo.toml, so
# target/release is left as it was.
#
#   scripts/build-pgo.sh
#
# Needs llvm-profdata from the LLVM that rustc is built on: rustup's llvm-tools component
# (`rustup component add llvm-tools`) or a system llvm-profdata-<major> (Debian: llvm-<major>).
# CARGO_TARGET_DIR is honoured.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[build-pgo %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
DATA="$(realpath -m "$TARGET_DIR/pgo-data")"

# llvm-profdata of rustc's own LLVM: profiles are not read across major versions.
profdata() {
    local major host tools
    major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
    host=$(rustc -vV | sed -n 's/^host: //p')
    tools="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
    if [[ -x "$tools" ]]; then echo "$tools"; return; fi
    for candidate in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata"; do
        if command -v "$candidate" >/dev/null; then command -v "$candidate"; return; fi
    done
    log "no llvm-profdata for LLVM $major (rustc's): run 'rustup component add llvm-tools'," \
        "or install llvm-$major"
    exit 1
}
PROFDATA="$(profdata)"
log "llvm-profdata: $PROFDATA"

log "building the fake engine and corral-load (release)"
cargo build --release --locked -p fakellm -p corral-load
log "building corral instrumented (profile pgo-generate)"
rm -rf "$DATA" && mkdir -p "$DATA"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$DATA" \
    cargo build --profile pgo-generate --locked -p corral --bin corral

log "training: scripts/pgo-workload.sh"
scripts/pgo-workload.sh "$TARGET_DIR/pgo-generate/corral" \
    "$TARGET_DIR/release/fakellm" "$TARGET_DIR/release/corral-load"
"$PROFDATA" merge -o "$DATA/corral.profdata" "$DATA"/*.profraw

log "building corral from the profile (profile pgo)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$DATA/corral.profdata" \
    cargo build --profile pgo --locked -p corral --bin corral
log "built $TARGET_DIR/pgo/corral"
