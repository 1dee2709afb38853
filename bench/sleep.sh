#!/usr/bin/env bash
# Swaps with and without sleep: MODELS vLLM models in one swap group, served by the fake engine's
# imitation of vLLM's sleep mode (a COLD_MS cold start, a WAKE_MS wake), and agents taking turns
# (agent i asks model i, one request at a time, round after round), so every request is a swap.
# Prints, per mode, the cold start, the swap back to a model that ran before, and the makespan.
# Usage: bench/sleep.sh [ROUNDS] [MODELS]   (CORRAL_BIN=path skips the release build)
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${CARGO_TARGET_DIR:-target}"
rounds="${1:-4}"
models="${2:-3}"
cold_ms="${COLD_MS:-3000}"
wake_ms="${WAKE_MS:-200}"
corral="${CORRAL_BIN:-}"
if [[ -z "$corral" ]]; then
    cargo build --release --locked --bin corral -p corral >&2
    corral="$target/release/corral"
fi
corral="$(realpath "$corral")"

work="$(mktemp -d)"
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/snapshot"
echo '{}' >"$work/snapshot/config.json"

# A port nothing listens on, from the kernel.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The config for one mode: sleepMode enable or disable.
config() {
    printf 'startPort: %s\nengines:\n  vllm: {command: "%s fake-engine --imitate vllm serve"}\nmodels:\n' \
        "$(( $(free_port) % 20000 + 30000 ))" "$corral"
    for ((i = 0; i < models; i++)); do
        printf '  m%s:\n    engine: vllm\n    source: %s\n    sleepMode: %s\n' "$i" "$work/snapshot" "$1"
        printf "    args: [--loading-ms, '%s', --wake-ms, '%s']\n" "$cold_ms" "$wake_ms"
    done
}

# The median of the numbers on stdin.
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# Runs the trace under one mode; prints "mode cold_median swap_back_median makespan requests".
trace() {
    local mode="$1" port url start cold=() back=() t
    config "$mode" >"$work/$mode.yaml"
    port="$(free_port)"
    url="http://127.0.0.1:$port"
    "$corral" --config "$work/$mode.yaml" --listen "127.0.0.1:$port" >"$work/$mode.log" 2>&1 &
    pid=$!
    until curl -fsS "$url/health" >/dev/null 2>&1; do sleep 0.1; done
    start="$(date +%s.%N)"
    for ((r = 0; r < rounds; r++)); do
        for ((i = 0; i < models; i++)); do
            t="$(curl -fsS -o /dev/null -w '%{time_total}' "$url/v1/chat/completions" \
                -H 'content-type: application/json' \
                -d "{\"model\":\"m$i\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}")"
            if ((r == 0)); then cold+=("$t"); else back+=("$t"); fi
        done
    done
    local makespan
    makespan="$(echo "$(date +%s.%N) - $start" | bc)"
    kill "$pid" && wait "$pid" 2>/dev/null || true
    pid=""
    printf '%s %s %s %s %s\n' "$mode" "$(printf '%s\n' "${cold[@]}" | median)" \
        "$(printf '%s\n' "${back[@]}" | median)" "$makespan" "$((rounds * models))"
}

echo "# $models models in one swap group, $rounds rounds; cold start ${cold_ms} ms, wake ${wake_ms} ms (fake engine imitating vLLM)" >&2
echo "# machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
printf '| sleep | requests | cold start p50 (s) | swap back p50 (s) | makespan (s) |\n|---|---:|---:|---:|---:|\n'
for mode in disable enable; do
    read -r m cold back span n < <(trace "$mode")
    printf '| %s | %s | %.3f | %.3f | %.2f |\n' "$m" "$n" "$cold" "$back" "$span"
done
