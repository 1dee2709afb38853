#!/usr/bin/env bash
# The workload that trains corral's profile-guided build (scripts/build-pgo.sh): corral in front of
# the fake engine, serving what it serves most (small chat requests at concurrency 1, 8 and 64,
# long conversations, SSE streams, embeddings) and the routes a dashboard and Prometheus poll.
# Exits non-zero, naming the phase, if any request fails, so a profile is never made from errors.
#
#   scripts/pgo-workload.sh CORRAL FAKELLM CORRAL_LOAD
#
# REQUESTS (default 20000) sets the size: the other phases are fractions of it.
set -Eeuo pipefail
[[ $# -eq 3 ]] || { echo "usage: scripts/pgo-workload.sh CORRAL FAKELLM CORRAL_LOAD" >&2; exit 2; }
CORRAL=$1 ENGINE=$2 LOAD=$3
REQUESTS="${REQUESTS:-20000}"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$WORK"' EXIT

log() { printf '[pgo-workload] %s\n' "$*" >&2; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
cat >"$WORK/config.yaml" <<YAML
models:
  m:
    cmd: $(realpath "$ENGINE") --port \${PORT} --threads 1 -np 64
    proxy: http://127.0.0.1:\${PORT}
    concurrencyLimit: 4096
YAML
"$CORRAL" --config "$WORK/config.yaml" --listen "127.0.0.1:$port" >"$WORK/corral.log" 2>&1 &
corral=$!
for _ in $(seq 300); do
    "$LOAD" http "$url/health" -n 1 2>/dev/null | grep -q '"ok": 1' && break
    sleep 0.2
done

# Runs one phase: corral-load's JSON summary must count `want` answers.
phase() {
    local name=$1 want=$2 field=$3
    shift 3
    local got
    got=$("$LOAD" "$@" | python3 -c "import json,sys; print(json.load(sys.stdin)$field)")
    [[ "$got" == "$want" ]] || { log "$name: $got of $want answered"; tail -20 "$WORK/corral.log" >&2; exit 1; }
    log "$name: $got"
}

small='{"model":"m","messages":[{"role":"user","content":"hello there, how are you?"}],"max_tokens":16}'
long=$(python3 -c 'import json
turns = [{"role": "system", "content": "You answer briefly. " * 200}]
turns += [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 300} for i in range(12)]
print(json.dumps({"model": "m", "messages": turns, "max_tokens": 16}))')
embed='{"model":"m","input":["the first text to embed","and a second one"]}'
n8=$REQUESTS n64=$REQUESTS n1=$((REQUESTS / 8 + 1)) nlong=$((REQUESTS / 10 + 1))
nembed=$((REQUESTS / 10 + 1)) streams=$((REQUESTS / 1000 + 2)) nroutes=$((REQUESTS / 100 + 1))

phase "chat, concurrency 8" "$n8" '["ok"]' http "$url/v1/chat/completions" -c 8 -n "$n8" --body "$small"
phase "chat, concurrency 64" "$n64" '["ok"]' http "$url/v1/chat/completions" -c 64 -n "$n64" --body "$small"
phase "chat, concurrency 1" "$n1" '["ok"]' http "$url/v1/chat/completions" -c 1 -n "$n1" --body "$small"
phase "long conversations" "$nlong" '["ok"]' http "$url/v1/chat/completions" -c 8 -n "$nlong" --body "$long"
phase "embeddings" "$nembed" '["ok"]' http "$url/v1/embeddings" -c 8 -n "$nembed" --body "$embed"
phase "SSE streams" "$((streams * 200))" '["chunk_lateness_us"]["n"]' \
    sse "$url/v1/chat/completions" -c "$streams" --chunks 200 --interval-ms 1 --model m
for route in /v1/models /running /metrics /health; do
    phase "GET $route" "$nroutes" '["ok"]' http "$url$route" -c 2 -n "$nroutes"
done

# the profile is written as corral exits
kill -TERM "$corral"
wait "$corral" || { log "corral did not exit cleanly"; tail -20 "$WORK/corral.log" >&2; exit 1; }
