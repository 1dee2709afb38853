#!/usr/bin/env bash
# Instructions per request: corral builds side by side with the bare hyper proxy, counted by
# valgrind's callgrind (user space, every thread). Unlike CPU time, the count barely moves with
# what else the machine runs (two runs agree within about 0.5 %), so it settles an A/B of a small
# change on a busy 2-core machine. It leaves out the kernel, which is about half of a request's
# CPU on loopback and the same for every proxy here.
#
#   bench/instructions.sh [CORRAL_BIN...]      default: target/release/corral
#
# Each binary serves 200 warm-up and then REQUESTS (default 3,000) small chat requests at
# concurrency 8 from the fake engine; the count covers the measured requests only. Needs valgrind
# (apt-get install valgrind) and a release build of corral-load. With PROFILES=DIR, each binary's
# callgrind profile is kept there (DIR/<n>.callgrind, n from 1 in the order given, DIR/floor.callgrind
# and DIR/floor-least.callgrind) for callgrind_annotate. The floor is counted twice: with hyper's
# client, and with the least client there can be (FLOOR_CLIENT=minimal; not with SSE=1).
# BODY='{...}' sends another request body (a long conversation, say) instead of the small chat.
# CORRAL_SETTINGS='captureBuffer: 0' (top-level config lines) measures corral with a feature off.
# SSE=1 counts instructions per streamed chunk instead: 8 streams of CHUNKS (default 400) chunks,
# 2 ms apart (each chunk its own write, so its own frame at the proxy), after a warm-up stream.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

REQUESTS="${REQUESTS:-3000}"
CHUNKS="${CHUNKS:-400}"
SSE="${SSE:-}"
LOAD="${CARGO_TARGET_DIR:-target}/release/corral-load"
BINS=("$@")
[[ ${#BINS[@]} -gt 0 ]] || BINS=("${CARGO_TARGET_DIR:-target}/release/corral")
command -v valgrind >/dev/null || { echo "bench/instructions.sh needs valgrind" >&2; exit 1; }
[[ -x "$LOAD" ]] || cargo build --release -p corral-load
ENGINE="$(realpath "${BINS[0]}")"
SMALL_CHAT='{"model":"m","messages":[{"role":"user","content":"hello there, how are you?"}],"max_tokens":16}'
BODY="${BODY:-$SMALL_CHAT}"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Runs the load against URL while PID (under callgrind) counts; prints instructions per request.
count() {
    local pid=$1 url=$2 out=$3 name=$4
    for _ in $(seq 300); do
        "$LOAD" http "$url/health" -n 1 2>/dev/null | grep -q '"ok": 1' && break
        sleep 0.2
    done
    local ok want per
    if [[ -n "$SSE" ]]; then
        sse "$url" 1 20 >/dev/null
        callgrind_control -z "$pid" >/dev/null 2>&1
        ok=$(sse "$url" 8 "$CHUNKS")
        want=$((8 * CHUNKS)) per=$((8 * CHUNKS))
    else
        "$LOAD" http "$url/v1/chat/completions" -c 8 -n 200 --body "$BODY" >/dev/null
        callgrind_control -z "$pid" >/dev/null 2>&1
        ok=$("$LOAD" http "$url/v1/chat/completions" -c 8 -n "$REQUESTS" --body "$BODY" \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["ok"])')
        want=$REQUESTS per=$REQUESTS
    fi
    callgrind_control -d "$pid" >/dev/null 2>&1
    sleep 1
    kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    [[ "$ok" == "$want" ]] || { echo "only $ok of $want answered" >&2; exit 1; }
    local total
    total=$(grep -m1 '^summary:' "$out".1 | awk '{print $2}')
    if [[ -n "${PROFILES:-}" ]]; then
        mkdir -p "$PROFILES"
        cp "$out".1 "$PROFILES/$name.callgrind"
    fi
    echo $((total / per))
}

# N streams of CHUNKS chunks 2 ms apart through URL; prints the content chunks received.
sse() {
    "$LOAD" sse "$1/v1/chat/completions" -c "$2" --chunks "$3" --interval-ms 2 --model m \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["chunk_lateness_us"]["n"])'
}

printf '| proxy | instructions per %s |\n|---|---:|\n' "$([[ -n "$SSE" ]] && echo 'SSE chunk' || echo request)"
n=0
for bin in "${BINS[@]}"; do
    n=$((n + 1))
    port=$(free_port)
    cat >"$WORK/c.yaml" <<YAML
${CORRAL_SETTINGS:-}
models:
  m:
    cmd: $ENGINE fake-engine --port \${PORT} --threads 1
    proxy: http://127.0.0.1:\${PORT}
    concurrencyLimit: 4096
YAML
    rm -f "$WORK"/cg.out*
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
        "$bin" --config "$WORK/c.yaml" --listen "127.0.0.1:$port" >"$WORK/corral.log" 2>&1 &
    printf '| %s | %s |\n' "$bin" "$(count $! "http://127.0.0.1:$port" "$WORK/cg.out" "$n")"
done

engine_port=$(free_port)
"$ENGINE" fake-engine --port "$engine_port" --threads 1 >/dev/null 2>&1 &
# The floor with hyper's client, then with the least client there can be (bench/load/src/floor.rs):
# the second bounds what a client written for the engine link could save. It cannot stream.
floors=(hyper)
[[ -z "$SSE" ]] && floors+=(minimal)
for client in "${floors[@]}"; do
    floor_port=$(free_port)
    rm -f "$WORK"/cg.out*
    FLOOR_CLIENT=$client valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
        "$LOAD" floor --route "127.0.0.1:$floor_port=127.0.0.1:$engine_port" >/dev/null 2>&1 &
    name=floor label='hyper floor (corral-load floor)'
    [[ $client == minimal ]] && name=floor-least label='least-client floor (FLOOR_CLIENT=minimal)'
    printf '| %s | %s |\n' "$label" "$(count $! "http://127.0.0.1:$floor_port" "$WORK/cg.out" $name)"
done
